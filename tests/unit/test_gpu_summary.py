"""The GPU check's summary page (``tools/bench/gpu_summary.py``) from a folder as ``tools/gpu_check.sh``
leaves it: R1_gpu by set and process count, the cache on and off, the quick bench's rows (a zero one
named), the GPU test's line and gauges, the sampler's threads; and which count to sample next."""

from __future__ import annotations

import json

from tools.bench import gpu_summary


def _run(set_: str, k: int, docs_per_s: float, raw: float, cache: bool = True) -> dict:
    return {"set": set_, "processes": k, "cache": cache, "docs": 1000, "seconds": 1000 / docs_per_s,
            "docs_per_s": docs_per_s, "r1": docs_per_s / raw, "tokens_per_s": docs_per_s * 30,
            "gpu_busy_mean": 40.0, "gpu_busy_max": 70.0, "tflops": docs_per_s * 30 * 4.5e7 / 1e12}


def _folder(tmp_path, s2_best: float):
    raw = {"S1": {"docs_per_s": 8000, "batch_size": 512, "tokens": 1}, "S2": {"docs_per_s": 5000, "batch_size": 256,
                                                                              "tokens": 1}}
    runs = [_run("S1", k, 2000 * k, 8000) for k in (1, 2, 4)]
    runs += [_run("S2", 1, 1500, 5000), _run("S2", 4, s2_best, 5000), _run("S2", 4, s2_best * 0.9, 5000, cache=False)]
    (tmp_path / "processes").mkdir()
    (tmp_path / "processes" / "processes.json").write_text(json.dumps(
        {"docs": 1000, "model": "m", "precision": "fp16", "device": "cuda", "machine": {"gpu": "NVIDIA H200"},
         "raw": raw, "runs": runs}))
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "bench.json").write_text(json.dumps(
        {"device": "cuda", "workloads": {"S1": {"docs_per_s": 900.0}, "long": {"docs_per_s": 0.0}},
         "ratios": {"R1": 0.93}}))
    (tmp_path / "steps.txt").write_text("test-gpu: exit 0 in 80 s (limit 150 s)\n")
    (tmp_path / "test-gpu.txt").write_text("NVML gauges: {'embedstream_gpu_memory_used_bytes{gpu=\"0\"}': 1.0}\n"
                                           "3 passed in 70.1s\n")
    (tmp_path / "sampler").mkdir()
    (tmp_path / "sampler" / "sampler-12.txt").write_text("THREAD embed 900\nTHREAD poll 900\n"
                                                        "400\tembed\tforward.py:run:70\tforward.py:run:70\n")
    return tmp_path


def test_the_page_has_every_figure_and_names_a_zero_row(tmp_path, capsys):
    folder = _folder(tmp_path, 4700.0)
    page = gpu_summary.page(folder)
    assert "on NVIDIA H200" in page and "| S2 | 4 | on | 4,700 | 0.94 |" in page
    assert "| S1 | 4 | on | 8,000 | 1.00 | 240,000 | 10.80 | 40 / 70 |" in page
    assert "on ÷ off = 1.11" in page  # the cache never slower
    assert "zero or missing: long" in page and "R1 0.93" in page
    assert "make test-gpu: 3 passed in 70.1s" in page and "NVML gauges" in page
    assert "threads embed 900, poll 900" in page and "forward.py:run:70" in page
    assert gpu_summary.main([str(folder), "--below-goal"]) == 0
    assert capsys.readouterr().out == ""  # S2's best K at 0.94: nothing to sample


def test_below_the_goal_the_best_count_of_s2_is_what_to_sample(tmp_path, capsys):
    folder = _folder(tmp_path, 3000.0)
    assert gpu_summary.main([str(folder), "--below-goal"]) == 0
    assert capsys.readouterr().out.strip() == "4"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no processes.json" in gpu_summary.page(empty)
