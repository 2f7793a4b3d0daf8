"""``embedstream bench``: the benchmark (the tools of a checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    err,
    fail,
    settings_or_exit,
    tool,
)

#: The options of ``bench`` (each a run of its own where it says "Only").
Quick = Annotated[bool, typer.Option("--quick", help="Small workloads: the whole run in under 3 minutes")]
PeerPython = Annotated[str | None, typer.Option(
    help="Python of a virtualenv with infinity-emb[torch] (make bench-peer-env) to measure the peer")]
Docs = Annotated[int | None, typer.Option(help="Override the documents per workload", min=10)]
LatencySeconds = Annotated[float | None, typer.Option(help="Override the length of each S5 latency run", min=1)]
Output = Annotated[Path, typer.Option(help="Where to write bench.json and bench.png")]
Cpu = Annotated[bool, typer.Option("--cpu", help="Only the CPU/doc rows, each thread's share beside them: an instant "
                                   "model, no model loaded, about a minute (--docs: documents a run, default 20,000; "
                                   "a tenth of them first, unmeasured, to warm up). Writes cpu.json")]
Processes = Annotated[str | None, typer.Option(
    "--processes", help="Only R1 at these process counts, e.g. 1,2,4,8: for S1 and S2 the raw encode, then "
    "`embedstream run --processes K` end to end for each K (cold cache; the best K of S2 once more without "
    "Redis), with tokens/s and the GPU's utilisation (--docs: documents a run, default 20,000). Writes "
    "processes.json")]
Lanes = Annotated[bool, typer.Option(
    "--lanes", help="Only the backfill lane's rows: on S1 and S2, the live lane's p99 at 25, 50 and 75 % of "
    "capacity, alone and with a backfill lane beside it, and the backfill's docs/s against the capacity left "
    "(--docs: the capacity run's documents, default 2,000; --latency-seconds: each measured stream's length, "
    "default 20, after 5 s of warm-up). Writes lanes.json")]
Brokers = Annotated[str | None, typer.Option(
    "--brokers", help="Only the broker rows, on each of these local brokers in turn, e.g. tansu,kafka: R1, Rio, "
    "Reos and Rdup90, and how long partitions stand still while a second worker joins and leaves, under each "
    "group protocol the broker serves (--docs: documents a workload, default 1,000). Writes brokers.json")]


@app.command()
@opt.with_settings("device", "precision")
def bench(quick: Quick = False, peer_python: PeerPython = None, docs: Docs = None,
          latency_seconds: LatencySeconds = None, output: Output = Path("."),
          state_dir: opt.StateDir = Path(".embedstream/bench"), broker: opt.Broker = "tansu", cpu: Cpu = False,
          processes: Processes = None, brokers: Brokers = None, lanes: Lanes = False,
          overrides: dict[str, object] | None = None) -> None:
    """Measure the workloads of docs/benchmarks.md on a local stack and print the ratio table.

    The stack lives in --state-dir: started there and stopped at the end, or, where `embedstream dev up
    --state-dir` already runs one, used as it is and left up (every workload makes its own topics,
    group and collection).

    Every figure is a ratio to a denominator measured in the same run: raw SentenceTransformer.encode,
    an instant model (what Kafka + Redis + Milvus cost), Milvus bulk upserts, and optionally the
    infinity-emb engine. Writes bench.json and bench.png.
    """
    bench_run = tool("bench.run")
    s = None if cpu else settings_or_exit(overrides)
    if s is not None and s.models is not None:
        raise fail("bench measures one model (EMBEDSTREAM_MODEL); unset EMBEDSTREAM_MODELS")
    counts = _process_counts(processes) if processes is not None else None
    broker_list = _broker_list(brokers) if brokers is not None else None
    if sum(map(bool, (counts, cpu, broker_list, lanes))) > 1:
        raise fail("--cpu, --processes, --brokers and --lanes are separate runs: give one of them")
    with console.status("benchmarking…") as status:
        def say(message: str) -> None:
            status.update(message)
            err.print(f"[dim]{message}[/]")

        if s is None:
            out = bench_run.run_cpu(docs=docs or 20_000, state_dir=state_dir, say=say, broker=broker)
        elif broker_list:
            out = tool("bench.brokers").run_brokers(brokers=broker_list, docs=docs, device=s.device,
                                                    precision=s.precision, state_dir=state_dir, say=say, model=s.model)
        elif lanes:
            out = tool("bench.lanes").run_lanes(docs=docs or 2000, seconds=latency_seconds or 20, device=s.device,
                                                precision=s.precision, state_dir=state_dir, say=say, model=s.model,
                                                broker=broker)
        elif counts:
            out = bench_run.run_processes(counts=counts, docs=docs or 20_000, device=s.device, precision=s.precision,
                                          state_dir=state_dir, say=say, model=s.model, broker=broker)
        else:
            out = bench_run.run_bench(quick=quick, device=s.device, precision=s.precision, peer_python=peer_python,
                                      docs=docs, latency_seconds=latency_seconds, state_dir=state_dir, say=say,
                                      model=s.model, broker=broker)
    run = "cpu" if s is None else "brokers" if broker_list else "lanes" if lanes else "processes" if counts else "bench"
    _write(out, output, run)


def _write(out: dict, output: Path, run: str) -> None:
    """Write ``<run>.json`` (and the chart of the full run) under ``output``, and print its table."""
    report = tool("bench.report")
    output.mkdir(parents=True, exist_ok=True)
    report.write_json(out, output / f"{run}.json")
    if run == "bench":
        report.write_chart(out, output / "bench.png")
    tables = {"cpu": report.cpu_table, "brokers": report.brokers_table, "processes": report.processes_table,
              "lanes": report.lanes_table, "bench": report.ratio_table}
    console.print(tables[run](out))
    err.print(f"wrote {output / f'{run}.json'}" + (f" and {output / 'bench.png'}" if run == "bench" else ""))


def _broker_list(value: str) -> list[str]:
    """``--brokers tansu,kafka`` → ``["tansu", "kafka"]``; an unknown name stops with the known ones."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [n for n in names if n not in ("tansu", "kafka", "mock")]
    if not names or unknown:
        raise fail(f"--brokers takes local brokers separated by commas (tansu, kafka, mock), not {value!r}")
    return names



def _process_counts(value: str) -> list[int]:
    """``--processes 1,2,4,8`` → ``[1, 2, 4, 8]``; a bad list stops with what to give."""
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(k < 1 for k in counts):
        raise fail(f"--processes {value!r}: give process counts of at least 1, separated by commas, e.g. 1,2,4,8")
    return counts
