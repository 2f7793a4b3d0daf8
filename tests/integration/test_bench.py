"""`embedstream bench --quick` on a tiny workload: every figure is there and consistent with its
definition (each ratio is its numerator over its denominator, repeats hit the cache, the quality gate
holds), and the chart is written. Speeds themselves are not asserted: they are measured on a shared,
noisy machine (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import TEST_BROKER
from tests.helpers import cosine_floor, run_cli
from tools.bench.run import ratios
from tools.kafka_broker import cache_dir

pytestmark = pytest.mark.integration

#: The suite's broker (Apache Kafka unless EMBEDSTREAM_TEST_BROKER says otherwise), its jars where the
#: suite's own stacks find them (the runs below get a HOME of their own).
BROKER = ["--broker", TEST_BROKER]
KAFKA_JARS = {"EMBEDSTREAM_KAFKA_CACHE": str(cache_dir().parent)}


def test_bench_quick_writes_json_and_chart(local_stack, tmp_path):
    """On the session's stack (the bench finds it running in its state dir, uses it and leaves it up)."""
    local, _ = local_stack
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **KAFKA_JARS,
           "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}  # the session's int8 export (tests/conftest.py)
    started = time.monotonic()
    res = run_cli(["bench", "--quick", "--docs", "40", "--latency-seconds", "1", "--output", str(tmp_path),
                   "--state-dir", str(local.state_dir), *BROKER], env, timeout=600)
    wall = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"already running in {local.state_dir} (left up)" in " ".join(res.stderr.split()) and local.is_up()
    out = json.loads((tmp_path / "bench.json").read_text())
    assert {"model", "precision", "device", "workloads", "denominators", "latency", "ratios",
            "latency_bound_s", "quality"} <= set(out)
    assert {"vs", "texts", "min_cosine", "mean_cosine"} <= set(out["quality"])
    assert {"S1", "S2", "io", "S4_0", "S4_50", "S4_90"} <= set(out["workloads"])
    for name in ("S1", "S2", "S4_0", "S4_90"):
        assert out["workloads"][name]["docs"] == 40 and out["workloads"][name]["docs_per_s"] > 0
    assert {"raw_S1", "raw_S2", "milvus_upsert_rows_per_s", "milvus_upsert_columnar_rows_per_s",
            "peer_docs_per_s"} <= set(out["denominators"])
    assert [x["load"] for x in out["latency"]] == [0.25, 0.5, 0.8]
    assert all(x["n"] > 0 for x in out["latency"])
    w, d, r = out["workloads"], out["denominators"], out["ratios"]
    # The ratios are those of this run's rows (tests/unit/test_bench_ratios.py checks each one's definition
    # on figures worked out by hand); here the rows are checked as measures of this run: each rate is its
    # documents over its own seconds, and the timed runs fit, one after another, inside the bench's wall
    # time as this test's clock saw it (a rate from a clock in the wrong unit, or a run timed from the
    # wrong moment, breaks one of the two).
    assert json.dumps(r, sort_keys=True) == json.dumps(ratios(out), sort_keys=True)
    timed = {k: v for k, v in w.items() if v.get("seconds")}
    assert {"S1", "S2", "io", "S2_registry", "S4_0", "S4_90"} <= set(timed)
    for name, v in timed.items():
        assert v["docs_per_s"] == pytest.approx(v["docs"] / v["seconds"], rel=1e-6), name
    assert sum(v["seconds"] for v in timed.values()) < wall
    assert all(v > 0 for k, v in r.items() if k.startswith("R") and v is not None and k != "Rpeer")
    assert d["raw_S2_chunks"]["chunks"] >= 40  # a long S2 text is several chunks
    # (at 40 documents the repeats fall in one group, deduplicated there: the cache is asked for none)
    assert w["S4_0_cluster"]["cached"] == 0 and w["S4_90_cluster"]["docs"] == 40
    assert 0 < w["io"]["cpu_us_per_doc"] < 1e6  # some CPU per document, less than a second of it
    # (the row counts the busy time; the whole run adds the start-up and the group join)
    assert w["io"]["cpu_us_per_doc"] < w["io"]["cpu_us_per_doc_whole_run"]
    cpu = out["cpu_per_doc"]  # S1 and S2 texts, with the cache and without, the io row among them
    assert {k: set(v) for k, v in cpu.items()} == {"S1": {"cache", "no_cache"}, "S2": {"cache", "no_cache"}}
    assert all(0 < us < 1e6 for v in cpu.values() for us in v.values())
    assert cpu["S2"]["cache"] == w["io"]["cpu_us_per_doc"] and res.stdout.count("CPU/doc") >= 5  # 4 + registry
    # two models interleaved, against the harmonic mix of each alone
    tm = w["two_models"]
    assert tm["docs"] == 40 and min(tm["docs_per_s"], tm["minilm_docs_per_s"], tm["proj_docs_per_s"]) > 0
    # the registry user's path: framed in, avro-registry out, every document through
    assert w["S2_registry"]["docs"] == 40 and 0 < w["io_registry"]["cpu_us_per_doc"] < 1e6
    assert 0 < r["Rpad"] <= 1 and 0 < w["S2"]["tokens_real"] <= w["S2"]["tokens_padded"]
    # Repeats: a repeated text is not embedded again (from the cache, or deduplicated in its group). The
    # distinct texts of the 90 % stream are among the 50 % stream's, and those among the 0 % stream's
    # (one seed, an empty cache at each start), so the model's tokens fall with each.
    t0, t50, t90 = (w[k]["tokens_real"] for k in ("S4_0", "S4_50", "S4_90"))
    assert w["S4_0"]["cached"] == 0 and 0 < t90 < t50 < t0
    # the worker's vectors against raw encode at the same precision (int8 quantizes activations per batch)
    assert out["quality"]["min_cosine"] >= min(0.99, cosine_floor(out["precision"]))
    assert out["quality"]["mean_cosine"] >= out["quality"]["min_cosine"]
    for x in out["latency"]:
        assert 0 < x["p50_s"] <= x["p99_s"]
    assert r["p99_at_50pct_s"] == out["latency"][1]["p99_s"]
    assert r["p99_goal_met"] == (r["p99_at_50pct_s"] <= out["latency_bound_s"])
    assert r["Rpeer"] is None  # no --peer-python given
    # exactly-once beside at-least-once in the same run: every document through, the ratios as defined
    dl = out["delivery"]
    # (each pair measured back to back, each exactly-once run with its documents per transaction)
    assert all(dl[k]["at_least_once"] > 0 and dl[k]["exactly_once"] > 0 for k in ("S2", "io"))
    assert dl["S2"]["docs"] == 40 and dl["io"]["docs"] == w["io"]["docs"]
    assert all(1 <= dl[k]["docs_per_transaction"] <= dl[k]["docs"] for k in ("S2", "io"))
    assert dl["p99_at_50pct_s"]["at_least_once"] == r["p99_at_50pct_s"] and dl["p99_at_50pct_s"]["n"] > 0
    assert "Reos (S2)" in res.stdout
    # hybrid retrieval: recall@10 of each mode on both query sets, and R1 with bm25 against off, paired
    hy = out["hybrid"]
    rec, cost = hy["recall"], hy["bm25_cost"]
    assert rec["documents"] == 100 and rec["queries"] == 50 and rec["index_docs_per_s"] > 0
    for name in ("identifiers", "natural_language"):
        assert all(0 <= rec[name][m] <= 1 for m in ("dense", "sparse", "hybrid")), rec[name]
    assert rec["identifiers"]["sparse"] >= 0.9  # a qualified name is one BM25 token: found almost always
    assert len(cost["off_docs_per_s"]) == len(cost["bm25_docs_per_s"]) == 2 and cost["docs"] == 40
    assert r["recall10_identifiers_hybrid"] == rec["identifiers"]["hybrid"]
    assert "R1 bm25" in res.stdout and "recall@10" in res.stdout  # (the table wraps its labels at 80 columns)
    # long documents: several chunks each, the ratio over the raw encode of the same chunks, and an
    # edit of one paragraph per document mostly served by the cache
    lw = w["long"]
    assert lw["docs"] == 3 and lw["words"] >= 6000 and lw["chunks"] > 3 * 8
    assert 0.5 < lw["edit_cache_hit_rate"] < 1
    # every precision this CPU runs, end to end in the same run, each with its quality against fp32
    from worker.embedding import int8
    from worker.embedding.sentence import cpu_has_bf16

    prec = out["precisions"]
    assert set(prec) == {"fp32", *(["bf16"] if cpu_has_bf16() else []), *(["int8"] if int8.available() else [])}
    assert prec["fp32"]["mean_cosine"] == pytest.approx(1.0) and prec["fp32"]["top10_overlap"] == pytest.approx(1.0)
    for p in prec.values():
        assert p["docs_per_s"] > 0 and 0.9 < p["min_cosine"] <= p["mean_cosine"] and 0 < p["top10_overlap"] <= 1
    if "int8" in prec:
        assert r["Rint8"] > 0 and "Rint8" in res.stdout
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "R1" in res.stdout and "Rdup90" in res.stdout and "CPU/doc" in res.stdout and "long docs" in res.stdout
    assert "registry" in res.stdout and "Rmix" in res.stdout


def test_bench_cpu_prints_each_run_and_its_threads(local_stack, tmp_path):
    """`bench --cpu`: the four CPU/doc runs (S1 and S2, with the cache and without), each with its
    threads' shares, no model loaded; on the session's stack, left up."""
    local, _ = local_stack
    res = run_cli(["bench", "--cpu", "--docs", "300", "--output", str(tmp_path), "--state-dir",
                   str(local.state_dir), *BROKER], {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **KAFKA_JARS},
                  timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert local.is_up()
    out = json.loads((tmp_path / "cpu.json").read_text())
    assert out["docs"] == 300 and out["warm_up_docs"] == 30  # a warm-up run first, not counted
    assert "warm-up" in res.stdout
    assert {k: set(v) for k, v in out["cpu_per_doc"].items()} == {"S1": {"cache", "no_cache"},
                                                                  "S2": {"cache", "no_cache"}}
    assert all(us > 0 for by_cache in out["cpu_per_doc"].values() for us in by_cache.values())
    for name, by_cache in out["cpu_threads"].items():
        for cache, threads in by_cache.items():
            assert {"polling", "prepare", "embed", "sink", "milvus-write", "other"} <= set(threads), (name, cache)
            assert all(v >= 0 for v in threads.values()) and threads["polling"] > 0 and threads["sink"] > 0
            # the shares cover the whole run (start-up included): at least the busy figure
            assert sum(threads.values()) >= out["cpu_per_doc"][name][cache] * 0.99
    assert {k: set(v) for k, v in out["cpu_gauge_ns"].items()} == {k: set(v) for k, v in out["cpu_per_doc"].items()}
    assert all(0 < ns < 100_000 for by_cache in out["cpu_gauge_ns"].values() for ns in by_cache.values())
    assert "S2, no cache" in res.stdout and "milvus-write" in res.stdout and "busy" in res.stdout
    assert "host gauge" in res.stdout
    assert "loading the model" not in res.stderr
