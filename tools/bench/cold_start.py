"""How long a new worker takes to be useful: ``embedstream run`` started as a fresh process (what a
scaled-out pod or a restarted worker is), timed from the process start to

- **ready**: ``/readyz`` answers 200 (its model loaded, its partitions assigned);
- **first record**: the group has committed the first record of its input (embedded, written to
  Milvus and the output topic).

Each run is a fresh topic of one partition holding one document, a fresh group and a fresh
collection, on the stack of ``base``; the process's own log line ``started in …`` gives where its
time went. Run it as ``python -m tools.bench.cold_start`` (``--help``), on a warm disk (a first run
also pays the page cache: it is reported, not counted)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tools.bench.measure import drop_collection, fresh_topics, produce_texts
from tools.dev import free_port
from worker.settings import Settings

#: The worker's own account of its start (``worker.assembly.runner``), e.g. ``started in 4.1s: …``.
_STARTED = re.compile(r"started in ([0-9.]+)s: (.*)")


def _get(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=0.5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _committed(watcher, tp) -> int:
    """The group's committed offset of ``tp``; -1 while the coordinator is still settling (a fresh
    broker answers NOT_COORDINATOR for a moment)."""
    from confluent_kafka import KafkaException

    try:
        return watcher.committed([tp], timeout=5)[0].offset
    except KafkaException:
        return -1


def one_start(base: Settings, log_path: Path, timeout_s: float = 120.0) -> dict:
    """One cold start (the module doc); returns its times in seconds and the worker's own account."""
    from confluent_kafka import Consumer, TopicPartition

    s = fresh_topics(base, partitions=1, commit_interval_ms=0)
    produce_texts(s, ["a first document, to see how long a new worker takes to embed it"], "cold")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(s.environment())
    env.update(EMBEDSTREAM_METRICS_PORT=str(port), EMBEDSTREAM_LOG_FORMAT="text")
    watcher = Consumer({**s.kafka_common(), "group.id": s.group_id})
    out: dict = {}
    with log_path.open("w") as log:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "worker.commands.cli", "run"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            while "first_record_s" not in out:
                now = time.monotonic() - started
                if proc.poll() is not None or now > timeout_s:
                    raise RuntimeError(f"the worker exited ({proc.returncode}) or took over {timeout_s:.0f}s: "
                                       f"see {log_path}")
                if "ready_s" not in out and _get(port, "/readyz") == 200:
                    out["ready_s"] = now
                if _committed(watcher, TopicPartition(s.input_topic, 0)) >= 1:
                    out["first_record_s"] = now
                    out.setdefault("ready_s", now)
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        finally:
            watcher.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    found = _STARTED.search(log_path.read_text())
    out["account"] = found.group(2) if found else ""
    drop_collection(s)
    return out


def cold_starts(base: Settings, runs: int, log_dir: Path) -> dict:
    """A first start (page cache warmed, not counted), then ``runs`` counted ones."""
    log_dir.mkdir(parents=True, exist_ok=True)
    one_start(base, log_dir / "cold-start-0.log")
    results = [one_start(base, log_dir / f"cold-start-{i}.log") for i in range(1, runs + 1)]
    return {"runs": results,
            "ready_s": statistics.median(r["ready_s"] for r in results),
            "first_record_s": statistics.median(r["first_record_s"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="counted starts (after one uncounted)")
    parser.add_argument("--broker", default="kafka", help="the local stack's broker: kafka, tansu or mock")
    parser.add_argument("--state-dir", default=".embedstream/cold-start", help="the local stack's directory")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    from tools.dev import LocalStack

    stack = LocalStack(args.state_dir, broker=args.broker)
    env, started = stack.up()
    try:
        os.environ.update(env)
        base = Settings()
        result = cold_starts(base, args.runs, Path(args.state_dir) / "logs")
    finally:
        if started:
            stack.down()
    for r in result["runs"]:
        print(f"ready {r['ready_s']:5.2f} s   first record {r['first_record_s']:5.2f} s   {r['account']}")
    print(f"median: ready {result['ready_s']:.2f} s, first record {result['first_record_s']:.2f} s")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
