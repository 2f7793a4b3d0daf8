"""How long partitions stand still while the group rebalances, as a producer and a consumer of the
output see it: a steady stream to every partition while a second ``embedstream run`` joins the
group and later leaves it (SIGTERM), each record's latency from its produce to its output.

A partition that moves (or, under an eager protocol, any partition) stops for the rebalance: its
records produced meanwhile wait, and their latency shows for how long. The figure does not depend
on the worker's log, its timestamps or the broker's view; the log is read only to know when a
rebalance has finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from schemas.codec import Document, encode_document
from tools.bench import workloads
from tools.bench.measure import drop_collection, flush_cache, fresh_topics
from tools.group_log import owned
from worker.commands.tail import tail_records
from worker.settings import Settings

#: Seconds of undisturbed stream before each rebalance and after it has finished: the baseline.
SETTLE_S = 5.0
#: A partition stalled in a rebalance when one of its records waited this much longer than the
#: steady stream's p99.
STALL_S = 0.5


class _Member:
    """One ``embedstream run`` of the group, its output in ``log_path``."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "worker.commands.cli", "run"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)

    def owned(self) -> set[int]:
        return owned(self.log_path.read_text(errors="replace"))

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)


def _until(check: Callable[[], bool], timeout: float, what: str, members: list[_Member]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for m in members:
            if m.proc.poll() is not None:
                raise RuntimeError(f"a worker exited ({m.proc.returncode}) while waiting for {what}: see {m.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f}s (logs in {members[0].log_path.parent})")
        time.sleep(0.1)


class _SteadyStream:
    """One document a partition every ``1 / rate`` seconds, each stamped with when it was produced."""

    def __init__(self, s: Settings, partitions: int, rate: float, texts: list[str]) -> None:
        from connectors.kafka import make_producer

        self.s, self.partitions, self.period, self.texts = s, partitions, 1.0 / rate, texts
        self.sent: dict[str, tuple[int, float]] = {}  # id → (partition, produced at, s since the epoch)
        self.producer = make_producer(s.kafka_common(), **{"linger.ms": 5})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-stream", daemon=True)

    def __enter__(self) -> _SteadyStream:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(30)

    def _run(self) -> None:
        seq, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            for p in range(self.partitions):
                doc_id = f"p{p}-{seq}"
                text = f"{self.texts[(seq * self.partitions + p) % len(self.texts)]} ({doc_id})"
                self.sent[doc_id] = (p, now)
                self.producer.produce(self.s.input_topic, key=doc_id, partition=p,
                                      value=encode_document(Document(doc_id, text, None, {}, int(now * 1000))))
            self.producer.poll(0)
            seq += 1
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def rebalance_stall(base: Settings, protocol: str, logs: Path, say: Callable[[str], None], *,
                    partitions: int = 6, rate: float = 4.0) -> dict:
    """One worker owns ``partitions`` partitions of a fresh topic while ``rate`` documents a second go
    to each; a second worker joins (1 → 2), then leaves by SIGTERM (2 → 1), both under the group
    ``protocol`` (``classic`` | ``consumer``). For the steady stream and for each rebalance (records
    produced from the second worker's start, or its SIGTERM, until the group has settled plus
    :data:`SETTLE_S`): the p50 and the largest latency, and how many partitions had a record wait
    :data:`STALL_S` or more past the steady p99 (``stalled``). ``missing``: records never
    output (0, or the run says so)."""
    s = fresh_topics(base, partitions=partitions)
    flush_cache(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(s.environment())
    env.update(EMBEDSTREAM_GROUP_PROTOCOL=protocol, EMBEDSTREAM_METRICS_PORT="0", EMBEDSTREAM_LOG_LEVEL="INFO")
    logs.mkdir(parents=True, exist_ok=True)
    every = set(range(partitions))
    a = _Member(env, logs / f"{protocol}-a.log")
    members = [a]
    marks: dict[str, float] = {}
    try:
        say(f"rebalance ({protocol}): the first worker takes every partition")
        _until(lambda: a.owned() == every, 180, "the first worker owns every partition", members)
        with _SteadyStream(s, partitions, rate, workloads.short_texts(2000)) as stream:
            time.sleep(SETTLE_S)
            say(f"rebalance ({protocol}): a second worker joins")
            marks["join"] = time.time()
            b = _Member(env, logs / f"{protocol}-b.log")
            members.append(b)
            _until(lambda: bool(b.owned()) and a.owned() | b.owned() == every and not a.owned() & b.owned(), 180,
                   "the two workers share the partitions", members)
            time.sleep(SETTLE_S)
            marks["join_end"] = time.time()
            say(f"rebalance ({protocol}): the second worker leaves")
            marks["leave"] = time.time()
            if b.stop() != 0:
                raise RuntimeError(f"the second worker did not stop cleanly on SIGTERM: see {b.log_path}")
            members.remove(b)
            _until(lambda: a.owned() == every, 180, "the first worker owns every partition again", members)
            time.sleep(SETTLE_S)
            marks["leave_end"] = time.time()
        sent = dict(stream.sent)
        say(f"rebalance ({protocol}): reading the output")
        out_at: dict[str, float] = {}
        for rec in tail_records(s, from_beginning=True, timeout=5.0):
            if rec.get("id") in sent and rec.get("timestamp", 0) > 0:
                out_at.setdefault(rec["id"], rec["timestamp"] / 1000)  # the first output of a repeat
    finally:
        for m in members:
            m.stop()
    drop_collection(s)
    return {"protocol": protocol, "partitions": partitions, "rate_per_partition": rate,
            "missing": len(set(sent) - set(out_at)), **_windows(sent, out_at, marks)}


def _windows(sent: dict[str, tuple[int, float]], out_at: dict[str, float], marks: dict[str, float]) -> dict:
    """Latency figures of the steady stream (before the join) and of each rebalance window."""
    def latencies(lo: float, hi: float) -> dict[int, list[float]]:
        by_p: dict[int, list[float]] = {}
        for doc_id, (p, at) in sent.items():
            if lo <= at < hi and doc_id in out_at:
                by_p.setdefault(p, []).append(out_at[doc_id] - at)
        return by_p

    steady = [x for xs in latencies(0, marks["join"]).values() for x in xs]
    p99 = float(np.percentile(steady, 99)) if steady else float("nan")
    out: dict = {"steady": {"p50_s": float(np.percentile(steady, 50)) if steady else float("nan"), "p99_s": p99,
                            "n": len(steady)}}
    for name, lo, hi in (("join", marks["join"], marks["join_end"]), ("leave", marks["leave"], marks["leave_end"])):
        by_p = latencies(lo, hi)
        flat = [x for xs in by_p.values() for x in xs]
        worst = {p: max(xs) for p, xs in by_p.items()}
        out[name] = {"max_s": max(flat) if flat else float("nan"),
                     "p50_s": float(np.percentile(flat, 50)) if flat else float("nan"),
                     "stalled": sum(1 for w in worst.values() if w >= p99 + STALL_S),
                     "window_s": hi - lo, "n": len(flat)}
    return out
