"""The summary of a GPU check (``tools/gpu_check.sh``): one Markdown page from what its steps wrote.

``python -m tools.bench.gpu_summary OUT`` prints it: the GPU, each step's exit, R1_gpu for S1 and S2 at
each process count with SM %, tokens/s and TFLOP/s, the cache on and off at the best count, each row
of the quick bench (a zero or a missing row is named), the NVML gauges the GPU test read, and, when
the sampler ran, each process's threads by where they spend their time.
``--below-goal`` prints only the best process count of S2 when its R1_gpu is under the goal (what the
check samples next), else nothing.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

R1_GPU_GOAL = 0.9


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def best_s2(processes: dict) -> dict | None:
    """The S2 run with the cache at the most docs/s."""
    runs = [r for r in processes.get("runs", []) if r["set"] == "S2" and r["cache"]]
    return max(runs, key=lambda r: r["docs_per_s"]) if runs else None


def processes_lines(processes: dict) -> list[str]:
    raw = ", ".join(f"{name} {r['docs_per_s']:,.0f} docs/s (batch {r['batch_size']})"
                    for name, r in processes["raw"].items())
    out = [f"R1_gpu: {processes['docs']:,} documents a run, {processes['model']} {processes['precision']} on "
           f"{processes['machine'].get('gpu', processes['device'])}; raw encode: {raw}", "",
           "| set | K | cache | docs/s | R1_gpu | tokens/s | TFLOP/s | SM % mean / max |",
           "|---|---|---|---|---|---|---|---|"]
    for r in processes["runs"]:
        busy = "—" if r.get("gpu_busy_mean") is None else f"{r['gpu_busy_mean']:.0f} / {r['gpu_busy_max']:.0f}"
        out.append(f"| {r['set']} | {r['processes']} | {'on' if r['cache'] else 'off'} | {r['docs_per_s']:,.0f} | "
                   f"{r['r1']:.2f} | {r['tokens_per_s']:,.0f} | {r.get('tflops', 0):.2f} | {busy} |")
    best = best_s2(processes)
    off = [r for r in processes["runs"] if not r["cache"]]
    if best and off:
        on_s, off_s = best["docs_per_s"], off[0]["docs_per_s"]
        out.append(f"\nCache at K={best['processes']} (S2): on {on_s:,.0f}, off {off_s:,.0f} docs/s: on ÷ off = "
                   f"{on_s / off_s:.2f} (never slower: ≥ 1.0)")
    return out


def quick_lines(bench: dict) -> list[str]:
    rows = {name: w.get("docs_per_s") for name, w in bench.get("workloads", {}).items() if isinstance(w, dict)}
    zero = sorted(name for name, v in rows.items() if not v)
    out = [f"Quick bench on {bench.get('device')}: {len(rows)} rows, " + (f"zero or missing: {', '.join(zero)}" if zero
                                                                         else "every row non-zero"),
           "", "| row | docs/s |", "|---|---|"]
    out += [f"| {name} | {v or 0:,.1f} |" for name, v in sorted(rows.items())]
    ratios = bench.get("ratios", {})
    out.append("\nRatios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items() if isinstance(v, float)))
    return out


def sampler_lines(folder: Path, top: int = 12) -> list[str]:
    """Each sampled process's threads (their samples: wall time, waiting included), then its ``top``
    most frequent frames (count, thread, innermost frame, innermost frame of the project's own)."""
    out = []
    for path in sorted(folder.glob("sampler-*.txt")):
        text = path.read_text(errors="replace").splitlines()
        threads = [line[len("THREAD "):] for line in text if line.startswith("THREAD ")]
        frames = [line for line in text if not line.startswith("THREAD ")][:top]
        if threads:
            out += [f"\n{path.name}: threads " + ", ".join(threads), *(f"    {f}" for f in frames)]
    return out


def page(folder: Path) -> str:
    lines = ["# GPU check", ""]
    gpu = folder / "gpu.txt"
    lines += ["```", gpu.read_text().strip() if gpu.exists() else "(no gpu.txt)", "```", ""]
    steps = folder / "steps.txt"
    lines += ["Steps:", "```", steps.read_text().strip() if steps.exists() else "(none)", "```", ""]
    tests = folder / "test-gpu.txt"
    if tests.exists():
        found = tests.read_text(errors="replace")
        last = [line for line in found.splitlines() if re.search(r"passed|failed|error|skipped|no tests ran", line)]
        gauges = [line for line in found.splitlines() if line.startswith("NVML gauges")]
        lines += [f"make test-gpu: {last[-1] if last else '(no result line)'}", *gauges, ""]
    processes = _load(folder / "processes" / "processes.json")
    lines += processes_lines(processes) if processes else ["(no processes.json: see processes.txt)"]
    lines.append("")
    bench = _load(folder / "quick" / "bench.json")
    lines += quick_lines(bench) if bench else ["(no quick bench.json: see quick.txt)"]
    sampled = folder / "sampler"
    if sampled.exists():
        lines += ["", "Sampler (wall time, each process's threads):", *sampler_lines(sampled)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--below-goal", action="store_true")
    args = parser.parse_args(argv)
    if args.below_goal:
        processes = _load(args.folder / "processes" / "processes.json")
        best = best_s2(processes) if processes else None
        if best and best["r1"] is not None and best["r1"] < R1_GPU_GOAL:
            print(best["processes"])
        return 0
    print(page(args.folder), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

