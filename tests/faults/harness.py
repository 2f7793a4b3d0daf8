"""The fault suite's shared parts: worker processes, fault injection, and the one pass check.

The pass check (``check_nothing_lost``) is the promise of docs/reliability.md, written once:
Milvus (Strong) holds exactly the ids that should be there, one row each, with vectors equal to a
direct encode; every good id reached the output topic at least once; the DLQ holds exactly the bad
records, with reasons and original bytes; and the group's committed offsets are at the end of every
partition (lag 0).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from schemas.codec import Document, decode_embedding, encode_document
from tests.helpers import (
    CLI,
    REPO,
    check_bm25_texts,
    cosine_floor,
    documents_in_milvus,
    min_cosine_to_direct_encode,
    read_topic,
    rows_not_at,
    settings_env,
)
from tools.corpus import stdlib_docstrings
from tools.group_log import owned, owns_partitions, rebalance_events  # noqa: F401 (the scenarios' import)
from worker.commands.produce import document_record, produce_records
from worker.settings import Settings


def short_docs(n: int, prefix: str, unseen: bool = False) -> list[Document]:
    """``n`` documents with short, distinct texts (first sentences of stdlib docstrings). The texts
    are the same for every ``prefix``, so within one scenario a second stream of another prefix finds
    them in the cache (each scenario starts with it empty: the fault suite's ``empty_cache``);
    ``unseen`` ends each with the prefix in brackets, a text of its own."""
    seen: set[str] = set()
    out: list[Document] = []
    for name, doc in stdlib_docstrings():
        text = doc.split("\n\n")[0].replace("\n", " ").strip()[:160]
        if len(text) < 15 or text in seen:
            continue
        seen.add(text)
        out.append(Document(f"{prefix}-{len(out)}", f"{text} [{prefix}]" if unseen else text, None, {"from": name}))
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} distinct short texts available")


@dataclass
class Expected:
    """What the stream should leave behind."""

    good: dict[str, str] = field(default_factory=dict)  # id → text
    deleted: set[str] = field(default_factory=set)
    bad: dict[str, tuple[bytes | None, str]] = field(default_factory=dict)  # key → (value, reason)
    records: int = 0  # input records produced in all

    @property
    def in_milvus(self) -> set[str]:
        return set(self.good) - self.deleted


def produce_docs(s: Settings, docs: list[Document], expected: Expected,
                 encode: Callable[[Document], bytes] = encode_document) -> None:
    """Produce ``docs`` (acknowledged before it returns), their values by ``encode``, and note them
    as expected in Milvus."""
    produce_records(s.kafka_common(), s.input_topic, (document_record(d, stamp=False, encode=encode) for d in docs))
    for d in docs:
        expected.good[d.id] = d.text
    expected.records += len(docs)


def produce_bad(s: Settings, bad: dict[str, tuple[bytes | None, str]], expected: Expected) -> None:
    """Produce raw bad records ``{key: (value, DLQ reason)}`` and note them as expected in the DLQ."""
    produce_records(s.kafka_common(), s.input_topic, ((k, v) for k, (v, _) in bad.items()),
                    **{"message.max.bytes": 60_000_000})
    expected.bad.update(bad)
    expected.records += len(bad)


def produce_tombstones(s: Settings, ids: list[str], expected: Expected, existing: set[str]) -> None:
    """Produce a tombstone for each of ``ids``; those in ``existing`` are expected gone from Milvus."""
    produce_records(s.kafka_common(), s.input_topic, ((i, None) for i in ids))
    expected.deleted |= existing
    expected.records += len(ids)


def worker_env(s: Settings, **extra: str) -> dict[str, str]:
    env = settings_env(s)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class _WarmPool:
    """One worker process kept ready (``tests.faults.warm_worker``: its imports done, waiting for
    its command line), for the next ``WorkerProcess`` (or ``run_cli``) whose environment is the
    suite's own but for its ``EMBEDSTREAM_*`` settings (``_base``); another is started as each is
    taken. A start that finds none ready, or whose environment is another, is a cold start."""

    def __init__(self) -> None:
        self._ready: tuple[subprocess.Popen, dict[str, str]] | None = None
        self.starts = self.handed = 0  # how many starts asked, and how many took a ready process
        self._lock = threading.Lock()  # a test may start commands from several threads

    @staticmethod
    def _base(env: dict[str, str]) -> dict[str, str]:
        """What the imports may read: ``env`` less the worker's settings and pytest's name of the
        test under way (set anew for each test: it made every test's first start a cold one)."""
        return {k: v for k, v in env.items() if not k.startswith("EMBEDSTREAM_") and k != "PYTEST_CURRENT_TEST"}

    def start(self, argv: list[str], env: dict[str, str], log_path: Path,
              err_path: Path | None = None) -> subprocess.Popen | None:
        """The ready process, handed ``argv`` (a ``CLI`` command line), ``env`` and ``log_path`` (its
        stdout and stderr; ``err_path``: stderr's own file); None when there is none for this
        environment. Either way one is made ready for the next start."""
        with self._lock:
            return self._start(argv, env, log_path, err_path)

    def _start(self, argv: list[str], env: dict[str, str], log_path: Path,
               err_path: Path | None) -> subprocess.Popen | None:
        proc, base = None, self._base(env)
        self.starts += 1
        if base != self._base(dict(os.environ)):
            return None  # an environment of its own (not the suite's): cold, the ready one kept for the rest
        ready, self._ready = self._ready, None
        if ready is not None:
            candidate, made_for = ready
            if made_for == base and candidate.poll() is None:
                request = {"argv": ["embedstream", *argv[len(CLI):]], "env": env, "cwd": str(REPO),
                           "log": str(log_path), **({"stderr": str(err_path)} if err_path else {})}
                try:
                    assert candidate.stdin is not None
                    candidate.stdin.write((json.dumps(request) + "\n").encode())
                    candidate.stdin.close()
                    proc = candidate
                    self.handed += 1
                except OSError:
                    candidate.kill()
            else:
                candidate.kill()
        self._ready = (subprocess.Popen([sys.executable, "-m", "tests.faults.warm_worker"], env=base, cwd=REPO,
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL), base)
        return proc

    def close(self) -> None:
        if self._ready is not None:
            self._ready[0].kill()
            self._ready[0].wait(30)
            self._ready = None


_POOL = _WarmPool()
atexit.register(_POOL.close)


def warm_starts() -> str:
    """How many of the suite's worker starts took a ready process, for the suite's summary."""
    return f"{_POOL.handed} of {_POOL.starts} worker starts took a ready-imported process"


class WorkerProcess:
    """``embedstream run`` as a real subprocess, its output in a log file. Every instance is killed
    at the end of its test (``kill_all``), so a failed test leaves no worker behind.

    The process is taken ready-imported from the warm pool when one is there (``_WarmPool``:
    the 2 s of imports of each start, ~200 starts a suite, done while the scenario before runs).
    ``cold=True`` starts ``embedstream run`` from nothing, imports included, as a pod does: for a
    measure of how long a restart takes (the soak). ``instant=True`` runs it with an instant model
    (``tests.faults.instant_worker``)."""

    live: list[WorkerProcess] = []

    @classmethod
    def kill_all(cls) -> None:
        for w in cls.live:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(30)
        cls.live.clear()

    def __init__(self, s: Settings, log_dir: Path, name: str, args: tuple[str, ...] = (), *, cold: bool = False,
                 instant: bool = False, **env: str) -> None:
        self.log_path = log_dir / f"{name}.log"
        # made here, so that ``log()`` reads it before a warm process has opened it (it appends)
        self.log_path.touch()
        argv, full_env = [*CLI, "run", *args], worker_env(s, **env)
        if instant:  # an instant model in place of the real one (tests.faults.instant_worker), started cold
            argv, cold = [sys.executable, "-m", "tests.faults.instant_worker", "run", *args], True
        warm = None if cold else _POOL.start(argv, full_env, self.log_path)  # it opens the log itself
        if warm is None:
            with self.log_path.open("ab") as log:  # the child keeps its own descriptor
                warm = subprocess.Popen(argv, env=full_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        self.proc = warm
        WorkerProcess.live.append(self)
        self.rss_samples: list[int] = []  # resident set size in MiB, sampled every 0.2 s
        threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self) -> None:
        while self.proc.poll() is None:
            try:
                for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss_samples.append(int(line.split()[1]) // 1024)
            except OSError:
                return
            time.sleep(0.2)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics_port(self, timeout: float = 120) -> int:
        """The port the worker serves /metrics on, as it logged it (started with
        ``EMBEDSTREAM_METRICS_PORT=auto``: the system picks a free one, no race for it)."""
        found: list[int] = []

        def logged() -> bool:
            m = re.search(r"metrics on port (\d+)", self.log())
            if m:
                found.append(int(m.group(1)))
            return bool(m)

        wait_until(logged, timeout, what=f"{self.log_path.stem} to serve its metrics")
        return found[0]


def warm_cli(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess | None:
    """``embedstream *args`` in ``env`` to its end in a process of the warm pool, stdout and stderr
    apart, as ``subprocess.run`` gives them (and ``TimeoutExpired`` past ``timeout``, the process
    killed); None when the pool has none ready for ``env`` (the caller starts it cold)."""
    folder = Path(tempfile.mkdtemp(prefix="embedstream-cli-"))
    out, err = folder / "stdout", folder / "stderr"
    out.touch()
    err.touch()
    argv = [*CLI, *args]
    try:
        proc = _POOL.start(argv, env, out, err)
        if proc is None:
            return None
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            dump_stacks(proc)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"),
                                            err.read_text(errors="replace")) from None
        return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"), err.read_text(errors="replace"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_worker(s: Settings, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``embedstream run *args`` with the settings of ``s`` to its end, taken from the warm pool (a
    cold start costs the test the imports): its exit status, and its log (stdout and stderr
    together) as ``stderr``."""
    folder = Path(tempfile.mkdtemp(prefix="embedstream-run-"))
    w = WorkerProcess(s, folder, "run", args, **env)
    try:
        code = w.wait(timeout)
        return subprocess.CompletedProcess(w.proc.args, code, "", w.log())
    except subprocess.TimeoutExpired:
        dump_stacks(w.proc)
        raise AssertionError(f"embedstream run {' '.join(args)} did not end in {timeout:.0f} s; its log (and its "
                             f"threads' stacks, where it was a warm start) ends:\n{w.log()[-6000:]}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def dump_stacks(proc: subprocess.Popen) -> None:
    """End a worker that overran its time with SIGABRT: a warm start (``tests.faults.warm_worker``
    enables ``faulthandler``) writes every thread's stack to its log first, so a hang says where it
    hung; then it is killed for sure."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def metric_samples(port: int, timeout: float = 5):
    """Every sample of a running worker's /metrics (``prometheus_client``'s ``Sample``s)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    for family in text_string_to_metric_families(body):
        yield from family.samples


def scrape(port: int, name: str, **labels: str) -> float:
    """One sample of a running worker's /metrics (0.0 when the series does not exist yet)."""
    for sample in metric_samples(port):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    return 0.0


#: Errors of a group coordinator not ready yet (a fresh Kafka loads __consumer_offsets) or moving.
_COORDINATOR_BUSY = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                     KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)


def committed_offsets(s: Settings, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition of the input topic (−1001 'none' counts as 0)."""
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    try:
        for attempt in range(20):
            try:
                got = c.committed([TopicPartition(s.input_topic, p) for p in range(partitions)], timeout=10)
                break
            except KafkaException as exc:  # Kafka: the coordinator still loading, or moved (NOT_COORDINATOR)
                if exc.args[0].code() not in _COORDINATOR_BUSY or attempt == 19:
                    raise
                time.sleep(0.5)
    finally:
        c.close()
    return {tp.partition: max(tp.offset, 0) for tp in got}


def committed_total(s: Settings, partitions: int) -> int:
    """Sum of the group's committed offsets on the input topic."""
    return sum(committed_offsets(s, partitions).values())


@contextmanager
def committed_reader(s: Settings, partitions: int):
    """A callable giving the group's committed total, on one consumer kept open: fast enough to watch
    a backlog drain every few milliseconds (``committed_total`` opens a consumer per call, ~1 s)."""
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    tps = [TopicPartition(s.input_topic, p) for p in range(partitions)]
    last = [0]

    def total() -> int:
        try:
            last[0] = sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=10))
        except KafkaException as exc:  # the coordinator still loading on a fresh broker, or moved: asked again
            if exc.args[0].code() not in _COORDINATOR_BUSY:
                raise
        return last[0]

    try:
        yield total
    finally:
        c.close()


def wait_until(predicate, timeout: float, every: float = 0.25, what: str = "condition",
               running: tuple[WorkerProcess, ...] = ()) -> float:
    """Wait for ``predicate()``; return the seconds it took; AssertionError on timeout, or at once when
    one of the workers in ``running`` has exited (a worker that died at start-up fails its test in
    seconds, not at the timeout)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        for w in running:
            if w.proc.poll() is not None:
                raise AssertionError(f"{w.log_path.stem} exited with code {w.proc.returncode} while waiting for {what}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def records_in_open_transactions(s: Settings, topic: str, partitions: int) -> int:
    """Records of ``topic`` in a transaction not yet ended: the high watermark (read_uncommitted)
    past the last stable offset (read_committed), summed over partitions."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    marks = {}
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer({**s.kafka_common(), "group.id": f"marks-{uuid.uuid4().hex[:6]}", "isolation.level": isolation})
        try:
            marks[isolation] = [c.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps]
        finally:
            c.close()
    return sum(u - c for u, c in zip(marks["read_uncommitted"], marks["read_committed"]))


def transaction_markers(s: Settings, topic: str, deadline: float = 60.0) -> int:
    """Offsets of ``topic`` that hold no record even a read_uncommitted reader gets: the commit and
    abort markers that transactions write, one per partition a transaction touched. 0 on a topic
    that only non-transactional producers wrote (no compaction runs on the tests' fresh topics).

    Every partition is read to its high-water mark (a read that stopped early would count the records
    it did not read as markers); one that cannot be within ``deadline`` seconds fails the test."""
    c = Consumer({**s.kafka_common(), "group.id": f"marks-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_uncommitted"})
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in partitions}
        c.assign([TopicPartition(topic, p, low) for p, (low, _) in marks.items()])
        records: Counter[int] = Counter()
        done = {p for p, (low, high) in marks.items() if high <= low}
        end = time.monotonic() + deadline
        while len(done) < len(marks):
            assert time.monotonic() < end, f"{topic}: partitions {sorted(set(marks) - done)} not read to their end"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= marks[m.partition()][1]:
                    done.add(m.partition())
                continue
            if m.offset() < marks[m.partition()][1]:  # (anything written since is not in the count)
                records[m.partition()] += 1
    finally:
        c.close()
    return sum(high - low - records[p] for p, (low, high) in marks.items())


def wait_until_each_embedded(ports: tuple[int, ...], what: str, timeout: float = 120) -> None:
    """Until each worker serving /metrics on ``ports`` has embedded documents (its
    ``embedstream_messages_total{outcome="embedded"}``): members that joined own some of the work."""
    wait_until(lambda: all(scrape(p, "embedstream_messages_total", outcome="embedded") > 0 for p in ports), timeout,
               what=f"{what} each to embed documents of their partitions")


def sessions_s(s: Settings, n: int = 3) -> float:
    """``n`` group sessions of ``s`` in seconds: a freeze that long lapses a member's session."""
    return n * int(s.kafka["session.timeout.ms"]) / 1000


def two_join_then_leave(s: Settings, tmp_path: Path, **env: str) -> None:
    """Scenario 5's middle: workers b and c join the group (1 → 3), are each given partitions and each
    embed documents of them (the stream goes on meanwhile), then leave by SIGTERM (3 → 1) and exit 0."""
    b = WorkerProcess(s, tmp_path, "b", EMBEDSTREAM_METRICS_PORT="auto", **env)
    c = WorkerProcess(s, tmp_path, "c", EMBEDSTREAM_METRICS_PORT="auto", **env)
    ports = (b.metrics_port(), c.metrics_port())
    wait_until(lambda: owns_partitions(b.log()) and owns_partitions(c.log()), 120, what="b and c given partitions")
    wait_until_each_embedded(ports, what="b and c")
    b.terminate()
    c.terminate()
    assert b.wait(60) == 0 and c.wait(60) == 0


@contextmanager
def frozen(pid: int):
    """SIGSTOP a process for the duration of the block (SIGCONT even if the block fails)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@dataclass
class Report:
    documents: int
    output_records: int
    duplicates: int
    dead_lettered: int
    #: Dead letters written more than once (a replay at least once writes them again).
    dlq_duplicates: int = 0


def check_nothing_lost(s: Settings, model, expected: Expected, partitions: int, lag: bool = True) -> Report:
    """The shared pass check of the fault suite (see the module doc). Returns what it saw. ``lag=False``:
    a share group, which commits no offsets (its records are acknowledged one by one)."""
    # Milvus: exactly the expected documents, each as exactly the chunks of one version, vectors equal
    # to a direct encode of each chunk's span of the document's newest text.
    docs = documents_in_milvus(s)
    want = expected.in_milvus
    assert set(docs) == want, f"Milvus: {len(want - set(docs))} missing, {len(set(docs) - want)} unexpected"
    stale = rows_not_at(docs, expected.good)
    assert not stale, f"Milvus holds another version than the newest of {len(stale)}: {stale[:5]}"
    floor = cosine_floor(model.precision)
    if want:  # (a scenario of bad records alone has no vectors to compare)
        worst = min_cosine_to_direct_encode(model, docs, expected.good)
        assert worst >= floor, f"a vector differs from a direct encode: min cosine {worst:.4f}"
    if s.sparse == "bm25":  # the sparse side holds the same chunks: each row's text is its chunk's
        check_bm25_texts(s, docs, expected.good)

    # Output topic: every good id at least once; a duplicate is a chunk of one input record written
    # again (a newer version of an id is not one: it is another input record).
    out = read_topic(s, s.output_topic, expect=len(expected.good) + len(expected.deleted), idle=2.0)
    values = [m for m in out if m.value() is not None]
    records = [decode_embedding(m.value()) for m in values]
    missing = set(expected.good) - {m.key().decode() for m in values}
    assert not missing, f"{len(missing)} good ids never reached the output topic, e.g. {sorted(missing)[:3]}"
    seen = Counter((r["source_partition"], r["source_offset"], r["chunk_index"]) for r in records)
    duplicates = sum(seen.values()) - len(seen)
    if lag:  # a consumer group: what never goes backwards (a share group's versions may arrive out of order)
        behind = newer_before_older(out)
        assert not behind, f"{len(behind)} ids end on the output topic with an older version, e.g. {behind[:3]}"

    # DLQ: exactly the bad records, with reason and original bytes; those written again are counted.
    dlq = read_topic(s, s.dlq_topic, expect=len(expected.bad), idle=2.0)
    dlq_by_key = {}
    for m in dlq:
        dlq_by_key.setdefault(m.key().decode(), m)
    dlq_duplicates = len(dlq) - len(dlq_by_key)
    assert set(dlq_by_key) == set(expected.bad), (sorted(dlq_by_key), sorted(expected.bad))
    for key, m in dlq_by_key.items():
        value, reason = expected.bad[key]
        headers = dict(m.headers())
        assert headers["embedstream.error.reason"].decode() == reason, (key, headers)
        if value is not None and len(value) <= 900_000:
            assert m.value() == value, key
        elif value is not None:
            assert int(headers["embedstream.error.original_size"]) == len(value)

    if not lag:
        return Report(len(expected.good), len(values), duplicates, len(dlq_by_key), dlq_duplicates)
    # Lag 0: committed offsets at the end of every partition.
    ends = Counter()
    for m in read_topic(s, s.input_topic, expect=expected.records, idle=2.0):
        ends[m.partition()] = max(ends[m.partition()], m.offset() + 1)
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    committed = c.committed([TopicPartition(s.input_topic, p) for p in range(partitions)], timeout=10)
    c.close()
    lag = {tp.partition: ends[tp.partition] - max(tp.offset, 0) for tp in committed}
    assert all(v == 0 for v in lag.values()), f"lag left: {lag}"
    return Report(len(expected.good), len(values), duplicates, len(dlq_by_key), dlq_duplicates)


def newer_before_older(out: list) -> list[str]:
    """The ids whose last record on the output topic (a key's records keep their order: one partition)
    is of an older input record than one written before it, from the same input partition."""
    versions: dict[str, list[tuple[int, int]]] = {}
    for m in out:
        if m.value() is not None:
            r = decode_embedding(m.value())
            at = (r["source_partition"], r["source_offset"])
        else:
            h = dict(m.headers() or [])
            if "embedstream.source.offset" not in h:
                continue
            at = (int(h["embedstream.source.partition"]), int(h["embedstream.source.offset"]))
        versions.setdefault(m.key().decode(), []).append(at)
    behind = []
    for key, seq in versions.items():
        last = seq[-1]
        if any(p == last[0] and o > last[1] for p, o in seq):
            behind.append(key)
    return sorted(behind)


def record_row(scenario: str, injected: str, report: Report, recovery_s: float | None) -> None:
    """Append one line to the suite's table (printed at the end of the session)."""
    path = Path(os.environ.get("EMBEDSTREAM_FAULT_TABLE", REPO / ".embedstream" / "fault-table.tsv"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        rec = "" if recovery_s is None else f"{recovery_s:.1f}"
        dup = f"{report.duplicates}" + (f" (+{report.dlq_duplicates} in the DLQ)" if report.dlq_duplicates else "")
        fh.write(f"{scenario}\t{injected}\t{report.documents}\t{report.dead_lettered}\t{dup}\t{rec}\n")


@contextmanager
def milvus_hold(env: dict[str, str]):
    """``(hold, worker_env)``: a :class:`tools.grpc_hold.GrpcHold` in front of the stack's Milvus, and
    the environment of a worker whose Milvus calls go through it (with no deadline to speak of: a held
    read must come back as an answer, not as a timeout)."""
    from urllib.parse import urlsplit

    from tools.grpc_hold import GrpcHold

    milvus = urlsplit(env["EMBEDSTREAM_MILVUS_URI"])
    with GrpcHold((milvus.hostname, milvus.port)) as hold:
        yield hold, {"EMBEDSTREAM_MILVUS_URI": f"http://127.0.0.1:{hold.port}",
                     "EMBEDSTREAM_MILVUS_TIMEOUT_SECONDS": "600"}
