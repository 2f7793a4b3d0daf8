"""The bench's CPU tooling without a stack: each thread's CPU read as it ends, grouped by name; the
patch it needs gone after the block; distinct texts past the corpus; the tables of ``bench --cpu`` and
``bench --processes``."""

from __future__ import annotations

import threading
import time

import pytest
from rich.console import Console

from tools.bench import workloads
from tools.bench.measure import _thread_group, host_gauge, thread_cpu
from tools.bench.report import cpu_table, lanes_table, processes_table


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_thread_names_group_by_what_they_run():
    assert _thread_group("milvus-write_0") == "milvus-write"
    assert _thread_group("Thread-12 (serve_forever)") == "serve_forever"
    assert _thread_group("sink") == "sink" and _thread_group("fence-beat") == "fence-beat"
    assert _thread_group("Thread-7 (_run)", "grpc._cython.cygrpc") == "grpc"


def test_each_thread_that_ends_in_the_block_adds_its_own_cpu_under_its_group():
    into: dict[str, float] = {}
    original = threading.Thread.run
    with thread_cpu(into):
        threads = [threading.Thread(target=_spin, args=(0.05,), name=f"spin_{i}") for i in range(2)]
        threads.append(threading.Thread(target=time.sleep, args=(0.1,), name="sleeper"))

        def poll() -> None:
            _spin(0.01)

        poll.__module__ = "grpc._cython.cygrpc"  # as gRPC's own threads run
        threads.append(threading.Thread(target=poll))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert threading.Thread.run is original  # the patch is gone
    assert set(into) == {"spin", "sleeper", "grpc"}
    assert 0.09 <= into["spin"] < 0.5 and into["sleeper"] < 0.02  # CPU, not wall time
    after = threading.Thread(target=_spin, args=(0.01,), name="later")
    after.start()
    after.join()
    assert "later" not in into


def test_distinct_texts_go_past_the_corpus_without_a_repeat():
    texts = workloads.distinct(["a", "b", "c"], 8)
    assert texts[:3] == ["a", "b", "c"] and len(set(texts)) == 8 and texts[3] == "a (1)"


def test_the_cpu_table_shows_each_run_against_the_goal_and_its_threads_in_pipeline_order():
    threads = {"other": 3.0, "sink": 9.0, "polling": 7.0, "metrics": 0.1, "embed": 4.0, "milvus-write": 3.0}
    out = {"docs": 20_000, "cpu_per_doc": {"S2": {"cache": 28.4, "no_cache": 31.0}},
           "cpu_threads": {"S2": {"cache": threads, "no_cache": {**threads, "embed": 2.5}}}}
    console = Console(width=80, record=True)
    console.print(cpu_table(out))
    lines = console.export_text().splitlines()
    rows = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
    table = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}
    assert list(table) == ["busy", "polling", "embed", "sink", "milvus-write", "metrics", "other"]
    assert table["busy"] == ["28.4 ✓", "31.0 ✗"] and table["embed"] == ["4.0", "2.5"]
    assert "S2, cache" in "".join(lines) and "S2, no cache" in "".join(lines)
    console = Console(width=100, record=True)
    console.print(cpu_table({**out, "cpu_gauge_ns": {"S2": {"cache": 112.4, "no_cache": 181.0}}}))
    rows = [line.split("│")[1:-1] for line in console.export_text().splitlines() if line.startswith("│")]
    assert [c.strip() for c in rows[-1]] == ["host gauge, ns", "112", "181"]


def test_the_host_gauge_times_the_loop_in_cpu_while_the_block_runs():
    """Samples come from a process of its own, one every period while the block runs, in ns a step
    of CPU time: a block that only sleeps still gets them, and the probe is gone after it."""
    speeds: list[float] = []
    with host_gauge(speeds, steps=2_000, period=0.02):
        time.sleep(0.6)
    assert len(speeds) >= 3 and all(5 < ns < 50_000 for ns in speeds)
    before = len(speeds)
    time.sleep(0.1)
    assert len(speeds) == before


def test_the_processes_table_marks_r1_against_the_gpu_goal_and_says_what_the_gpu_did():
    out = {"machine": {"gpu": "NVIDIA H100 80GB HBM3"}, "docs": 20_000, "model": "m", "precision": "fp16",
           "device": "cuda", "raw": {"S1": {"docs_per_s": 6800.0, "batch_size": 512}},
           "runs": [{"set": "S1", "processes": 1, "cache": True, "docs_per_s": 1570.0, "r1": 0.23,
                     "tokens_per_s": 31_400.0, "gpu_busy_mean": 8.2, "gpu_busy_max": 11.0, "tflops": 0.71},
                    {"set": "S1", "processes": 4, "cache": False, "docs_per_s": 6500.0, "r1": 0.956,
                     "tokens_per_s": 130_000.0, "gpu_busy_mean": None, "gpu_busy_max": None}]}
    console = Console(width=120, record=True)
    console.print(processes_table(out))
    text = console.export_text()
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert rows[0] == ["S1", "1", "on", "1,570", "0.23 ✗", "31,400", "0.71", "8 / 11"]
    assert rows[1] == ["S1", "4", "off", "6,500", "0.96 ✓", "130,000", "—", "—"]  # a run from before TFLOP/s
    assert "H100" in text and "6,800 docs/s at batch 512" in " ".join(text.split())


def test_the_lanes_table_marks_the_live_p99_and_the_backfill_s_share_against_their_goals_at_each_load():
    def row(workload, load, peak, alone, lane, docs):
        return {"workload": workload, "load": load, "peak_docs_per_s": peak, "alone": {"p50_s": 0.18, "p99_s": alone},
                "with_lane": {"p50_s": 0.3, "p99_s": lane, "backfill_docs_per_s": docs, "backfill_batches": 140,
                              "backfill_waited_s": 9.0},
                "p99_ratio": lane / alone, "backfill_share_of_left": docs / ((1 - load) * peak)}

    out = {"model": "m", "precision": "int8", "device": "cpu", "seconds": 20.0, "warmup_s": 5.0,
           "rows": [row("S1", 0.25, 1000.0, 0.2, 0.246, 700.0),  # +46 ms: within the slack, past 1.2x
                    row("S1", 0.5, 1000.0, 0.8, 1.62, 300.0),
                    row("S2", 0.75, 200.0, 0.9, 1.3, 10.0)]}  # no share goal at 75 %; p99 within 1.5x
    console = Console(width=220, record=True)
    console.print(lanes_table(out))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in console.export_text().splitlines()
            if line.startswith("│")]
    assert rows[0] == ["S1", "25%", "1,000", "0.180 / 0.200", "0.300 / 0.246", "1.23 (≤ 1.2) ✓", "700",
                       "0.93 (≥ 0.8) ✓", "140, 9.0"]
    assert rows[1] == ["S1", "50%", "1,000", "0.180 / 0.800", "0.300 / 1.620", "2.02 (≤ 1.2) ✗", "300",
                       "0.60 (≥ 0.8) ✗", "140, 9.0"]
    assert rows[2] == ["S2", "75%", "200", "0.180 / 0.900", "0.300 / 1.300", "1.44 (≤ 1.5) ✓", "10", "0.20", "140, 9.0"]


def test_process_counts_are_a_comma_list_of_positive_numbers():
    import typer

    from worker.commands.cli.bench import _process_counts

    assert _process_counts("1,2,4,8") == [1, 2, 4, 8] and _process_counts("3") == [3]
    for bad in ("", "0,2", "two", "1,,x"):
        with pytest.raises(typer.Exit):
            _process_counts(bad)
