"""`embedstream bench --quick` on a tiny workload: the JSON has every figure, the chart is written.

Numbers are not asserted: they are measured on a shared, noisy machine (benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.integration


def test_bench_quick_writes_json_and_chart(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    res = run_cli(["bench", "--quick", "--docs", "60", "--latency-seconds", "3", "--output", str(tmp_path),
                   "--state-dir", str(tmp_path / "stack")], env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "bench.json").read_text())
    assert {"model", "precision", "device", "workloads", "denominators", "latency", "ratios",
            "latency_bound_s", "quality"} <= set(out)
    assert {"vs", "texts", "min_cosine", "mean_cosine"} <= set(out["quality"])
    assert {"S1", "S2", "io", "S4_0", "S4_50", "S4_90"} <= set(out["workloads"])
    for name in ("S1", "S2", "S4_0", "S4_90"):
        assert out["workloads"][name]["docs"] == 60 and out["workloads"][name]["docs_per_s"] > 0
    assert {"raw_S1", "raw_S2", "milvus_upsert_rows_per_s", "milvus_upsert_columnar_rows_per_s",
            "peer_docs_per_s"} <= set(out["denominators"])
    assert [x["load"] for x in out["latency"]] == [0.25, 0.5, 0.8]
    assert all(x["n"] > 0 for x in out["latency"])
    for key in ("R1", "R1_S1", "Rpeer", "Rdup90", "Rio", "Rio_columnar", "Rpad", "p99_at_50pct_s", "p99_goal_met"):
        assert key in out["ratios"]
    assert out["ratios"]["Rpeer"] is None  # no --peer-python given
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "R1" in res.stdout and "Rdup90" in res.stdout
