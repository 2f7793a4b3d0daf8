"""The bench's ratios on hand-picked figures: each is the numerator over the denominator that
``docs/benchmarks.md`` names, checked against numbers worked out by hand (not against the same
division), so a ratio over the wrong row, or the two rows swapped, fails here. The end-to-end bench
test checks that the rows themselves come from the runs."""

from __future__ import annotations

import math

import pytest

from tools.bench.run import ratios


def _figures() -> dict:
    return {
        "workloads": {
            "S1": {"docs_per_s": 300.0}, "S2": {"docs_per_s": 90.0, "tokens_real": 600, "tokens_padded": 800},
            "S4_0": {"docs_per_s": 50.0}, "S4_90": {"docs_per_s": 400.0},
            "S4_0_cluster": {"docs_per_s": 40.0}, "S4_90_cluster": {"docs_per_s": 200.0},
            "io": {"docs_per_s": 700.0},
            "two_models": {"docs_per_s": 45.0, "harmonic_docs_per_s": 60.0},
            "S2_registry": {"docs_per_s": 81.0},
            "long": {"chunks_per_s": 95.0},
        },
        "denominators": {
            "raw_S1": {"docs_per_s": 400.0}, "raw_S2": {"docs_per_s": 100.0}, "raw_S2_chunks": {"docs_per_s": 120.0},
            "raw_long_chunks_per_s": {"chunks_per_s": 100.0},
            "milvus_upsert_rows_per_s": 1000.0, "milvus_upsert_columnar_rows_per_s": 2000.0, "peer_docs_per_s": 60.0,
        },
        "precisions": {"fp32": {"docs_per_s": 80.0}, "bf16": {"docs_per_s": 100.0}, "int8": {"docs_per_s": 150.0}},
        "delivery": {"S2": {"exactly_once": 85.0, "at_least_once": 100.0},
                     "io": {"exactly_once": 630.0, "at_least_once": 700.0}},
        "hybrid": {"bm25_cost": {"ratio": 0.95},
                   "recall": {"identifiers": {"hybrid": 0.98, "dense": 0.7},
                              "natural_language": {"hybrid": 0.8, "dense": 0.85}}},
        "latency": [{"load": 0.25, "p99_s": 0.4}, {"load": 0.5, "p99_s": 0.6}, {"load": 0.8, "p99_s": 2.0}],
        "latency_bound_s": 0.75,
    }


def test_each_ratio_is_its_named_row_over_its_named_denominator():
    r = ratios(_figures())
    expected = {"R1": 0.9, "R1_S1": 0.75, "Rpeer": 1.5, "Rdup90": 8.0, "Rdup90_cluster": 5.0, "Rio": 0.7,
                "Rio_columnar": 0.35, "Rpad": 0.75, "Rmix": 0.75, "R1_S2_registry": 0.81, "R1_S2_chunks": 0.75,
                "R1_long": 0.95, "Rint8": 1.5, "Reos": 0.85, "Reos_io": 0.9, "R1_bm25": 0.95,
                "recall10_identifiers_hybrid": 0.98, "p99_at_50pct_s": 0.6}
    assert {k: r[k] for k in expected} == pytest.approx(expected)
    assert r["hybrid_ge_dense"] is False  # natural language: hybrid 0.80 below dense 0.85
    assert r["p99_goal_met"] is True  # 0.6 s at half load, within the 0.75 s bound


def test_rows_a_run_did_not_make_give_no_ratio_rather_than_a_wrong_one():
    out = _figures()
    del out["workloads"]["S4_0_cluster"], out["workloads"]["S4_90_cluster"], out["precisions"]["int8"]
    out["denominators"]["peer_docs_per_s"] = None  # no --peer-python
    out["workloads"]["S2"]["tokens_padded"] = 0
    out["latency"][1]["p99_s"] = 0.9  # past the bound
    r = ratios(out)
    assert r["Rpeer"] is None and r["Rdup90_cluster"] is None and r["Rpad"] is None and "Rint8" not in r
    assert r["p99_goal_met"] is False
    out["latency"][1]["p99_s"] = math.nan  # nothing came back at half load: not a met goal
    assert ratios(out)["p99_goal_met"] is False
