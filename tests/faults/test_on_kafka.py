"""Promises that only Apache Kafka can show: exactly-once aborts, static members beside live ones,
and the broker's record size limits. Each scenario is skipped, with its reason, on another broker
(EMBEDSTREAM_TEST_BROKER=tansu): Tansu shows aborted transactions to read_committed readers, never
gives a restarted static member its partitions back beside live ones, and enforces no
``max.message.bytes``.

How a kill lands *inside* a transaction, every time: the worker is frozen (SIGSTOP) at a random
point of its stream, and the output topic's partitions are read at both isolation levels: a high
watermark past the last stable offset is a transaction with records in it and no commit yet. If the
freeze missed one, the worker runs on and is frozen again a moment later.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections import Counter

import pytest

from connectors.kafka import make_admin
from schemas.codec import Document, decode_embedding
from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_offsets,
    committed_total,
    owned,
    owns_partitions,
    produce_docs,
    rebalance_events,
    record_row,
    records_in_open_transactions,
    run_worker,
    short_docs,
    wait_until,
    wait_until_each_embedded,
)
from tests.helpers import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.faults]

DONE = re.compile(r"done: (\d+) embedded")

#: A transaction kept open through a Milvus outage is aborted after half its timeout: 5 s here.
EXACTLY_ONCE = {"EMBEDSTREAM_DELIVERY": "exactly-once", "EMBEDSTREAM_REDIS_URL": "",
                "EMBEDSTREAM_KAFKA__TRANSACTION_TIMEOUT_MS": "10000"}


@pytest.fixture(autouse=True)
def on_kafka(fault_stack):
    local, _ = fault_stack
    if local.broker_kind() != "kafka":
        pytest.skip(f"needs Apache Kafka (the fault stack runs {local.broker_kind()}): "
                    "unset EMBEDSTREAM_TEST_BROKER, or set it to kafka")


def freeze_inside_a_transaction(s, w: WorkerProcess, tries: int = 60) -> int:
    """SIGSTOP ``w`` at a moment its transaction holds output records (returns how many); the worker
    stays frozen. A freeze between transactions lets it run on for a moment and tries again."""
    for _ in range(tries):
        assert w.proc.poll() is None, "the worker exited before a freeze landed inside a transaction"
        os.kill(w.proc.pid, signal.SIGSTOP)
        time.sleep(0.5)  # the markers of a commit that returned just before the freeze land meanwhile
        held = records_in_open_transactions(s, s.output_topic, PARTITIONS)
        if held:
            return held
        os.kill(w.proc.pid, signal.SIGCONT)
        time.sleep(0.15)
    raise AssertionError(f"in {tries} freezes the worker was never inside a transaction")


def _outputs(s, isolation: str) -> Counter:
    """(source partition, source offset, chunk) of each output record at ``isolation``."""
    out = Counter()
    for m in read_topic(s, s.output_topic, idle=2.0, isolation=isolation):
        if m.value() is not None:
            r = decode_embedding(m.value())
            out[(r["source_partition"], r["source_offset"], r["chunk_index"])] += 1
    return out


def _check_aborted_and_exact(fs, model, expected: Expected, held: int) -> tuple:
    """read_committed sees each input's output once; read_uncommitted sees the aborted records too."""
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.duplicates == 0, report
    committed, raw = _outputs(fs, "read_committed"), _outputs(fs, "read_uncommitted")
    assert max(committed.values()) == 1
    repeated = sum(raw.values()) - len(raw)
    assert repeated >= held, f"the aborted transaction's {held} records are not in the log ({repeated} repeats)"
    return report, repeated


@pytest.mark.guarantee
def test_a_worker_killed_inside_its_transaction_leaves_nothing_a_read_committed_reader_sees(fs, model, tmp_path):
    """kill -9 between producing a group's records and committing its transaction: the restarted
    worker (the same transactional.id) aborts it and redoes the group. With ``EMBEDSTREAM_SPARSE=bm25``:
    the rows' texts end as the dense rows do."""
    fs = fs.model_copy(update={"sparse": "bm25"})
    expected = Expected()
    # 16 KB of metadata a document: a transaction's records take long enough to write (the output
    # topic, then Milvus) that a freeze lands inside one (with short records, 60 freezes missed)
    docs = [Document(d.id, d.text, None, {"from": d.metadata["from"], "pad": "x" * 16_000})
            for d in short_docs(1500, "kk", unseen=True)]
    produce_docs(fs, docs, expected)
    w = WorkerProcess(fs, tmp_path, "w", EMBEDSTREAM_GROUP_INSTANCE_ID="kk-w", **EXACTLY_ONCE)
    wait_until(lambda: committed_total(fs, PARTITIONS) > 0, 180, what="the first transaction committed")
    before = committed_offsets(fs, PARTITIONS)
    held = freeze_inside_a_transaction(fs, w)
    at_kill = committed_offsets(fs, PARTITIONS)
    w.kill9()
    # the group's offsets move only with a committed transaction: none moved for the open one
    assert sum(at_kill.values()) < expected.records and all(at_kill[p] >= before[p] for p in at_kill)
    w2 = WorkerProcess(fs, tmp_path, "w2", ("--stop-when-idle", "0.5"), EMBEDSTREAM_GROUP_INSTANCE_ID="kk-w",
                       **EXACTLY_ONCE)
    assert w2.wait(300) == 0, w2.log()[-3000:]
    report, repeated = _check_aborted_and_exact(fs, model, expected, held)
    record_row("kafka: exactly-once abort (kill -9)", f"kill -9 inside a transaction of {held} records", report, None)


def test_a_milvus_failure_after_the_produce_aborts_the_transaction(fs, model, monkeypatch, caplog):
    """Milvus fails after the group's records were produced, for longer than the worker keeps a
    transaction open (half its timeout: 5 s here): the transaction is aborted, no offset moves while
    it fails, and the group is redone. Real Kafka, real Milvus; the worker runs in this process, its
    upserts failing for 8 s (from outside, a frozen Milvus fails the group's version reads first,
    before anything is produced: measured, 18 of 18 failures were reads)."""
    import threading

    from connectors.milvus.connection import transient
    from connectors.milvus.writes import MilvusStore
    from worker.assembly.runner import build_worker

    s = fs.model_copy(update={"delivery": "exactly-once", "redis_url": None, "metrics_port": 0,
                              "kafka": {**fs.kafka, "transaction.timeout.ms": "10000"}})
    expected = Expected()
    produce_docs(s, short_docs(1200, "km", unseen=True), expected)
    failing = threading.Event()
    real_upsert = MilvusStore.upsert_chunks

    def upsert(self, rows, model_id, updated_at):
        if failing.is_set():
            time.sleep(1.0)
            raise transient(TimeoutError("Milvus did not answer (injected)"))
        return real_upsert(self, rows, model_id, updated_at)

    monkeypatch.setattr(MilvusStore, "upsert_chunks", upsert)
    worker = build_worker(s, embedder=model)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(stats=worker.run(stop_when_idle=3.0)))
    thread.start()
    try:
        wait_until(lambda: committed_total(s, PARTITIONS) > 0, 120, what="the first transaction committed")
        failing.set()
        held = wait_until(lambda: records_in_open_transactions(s, s.output_topic, PARTITIONS) > 0, 30,
                          what="output records held in a transaction while Milvus fails")
        held = records_in_open_transactions(s, s.output_topic, PARTITIONS)
        during = committed_total(s, PARTITIONS)
        time.sleep(8)  # past half the transaction timeout: aborted (and, while failing, begun again)
        assert committed_total(s, PARTITIONS) == during, "offsets were committed while Milvus failed"
    finally:
        failing.clear()
        thread.join(300)
    assert not thread.is_alive() and "stats" in result, "the worker did not finish"
    assert during < expected.records
    assert any("transaction aborted" in r.getMessage() for r in caplog.records), "no transaction was aborted"
    report, repeated = _check_aborted_and_exact(s, model, expected, held)
    record_row("kafka: exactly-once abort (Milvus)", f"Milvus upserts failing 8 s inside a transaction of "
               f"{held} records", report, None)


STATIC_SESSION = {"session.timeout.ms": "10000", "heartbeat.interval.ms": "1000"}


@pytest.mark.alone  # a restart timed against a 10 s session, with no rebalance allowed
def test_static_members_beside_live_ones(fault_stack, model, tmp_path):
    """Three static members. One killed with -9 and restarted within its session gets its own
    partitions back, and the two others see no rebalance; one stopped for good hands its partitions
    on once its session expires. Nothing is lost; Milvus is exact."""
    from tests.helpers import fresh_settings

    _, env = fault_stack
    s = fresh_settings(env, partitions=PARTITIONS, max_batch_size=32, commit_interval_ms=0,
                       shutdown_grace_seconds=20, kafka=dict(STATIC_SESSION))
    every = set(range(PARTITIONS))
    expected = Expected()
    docs = short_docs(1200, "st")
    produce_docs(s, docs[:300], expected)
    ids = {n: f"st-{n}-{uuid.uuid4().hex[:4]}" for n in "abc"}
    workers = {n: WorkerProcess(s, tmp_path, n, EMBEDSTREAM_GROUP_INSTANCE_ID=ids[n]) for n in "abc"}

    def settled() -> bool:
        held = [owned(w.log()) for w in workers.values()]
        return all(held) and set().union(*held) == every and sum(map(len, held)) == PARTITIONS

    wait_until(lambda: settled() and committed_total(s, PARTITIONS) >= 300, 120,
               what="three members each given partitions, and the first documents committed")
    time.sleep(2)  # no rebalance round left
    assert settled()
    mine = {n: owned(w.log()) for n, w in workers.items()}
    events = {n: len(rebalance_events(workers[n].log())) for n in "ac"}

    workers["b"].kill9()
    produce_docs(s, docs[300:600], expected)
    workers["b"] = WorkerProcess(s, tmp_path, "b2", EMBEDSTREAM_GROUP_INSTANCE_ID=ids["b"])
    wait_until(lambda: owned(workers["b"].log()), 60, what="the restarted member given partitions")
    assert owned(workers["b"].log()) == mine["b"], "the restarted static member got other partitions"
    wait_until(lambda: committed_total(s, PARTITIONS) >= 600, 120, what="the second documents committed")
    for n in "ac":  # no rebalance: neither was revoked nor given anything anew
        log = workers[n].log()
        assert len(rebalance_events(log)) == events[n], f"{n} saw a rebalance:\n{log[-2000:]}"

    workers["c"].terminate()  # a static member does not leave: its partitions wait out its session
    assert workers["c"].wait(60) == 0
    stopped = time.monotonic()
    produce_docs(s, docs[600:], expected)
    moved = wait_until(lambda: owned(workers["a"].log()) | owned(workers["b"].log()) == every, 60,
                       what="c's partitions handed on")
    assert time.monotonic() - stopped >= 5, "c's partitions moved before its session could expire"
    wait_until(lambda: committed_total(s, PARTITIONS) >= expected.records, 180, what="everything committed")
    for n in "ab":
        workers[n].terminate()
        assert workers[n].wait(60) == 0
    report = check_nothing_lost(s, model, expected, PARTITIONS)
    record_row("kafka: static members", "kill -9 + restart within the session; one stopped for good", report, moved)


def _alter_topic(s, topic: str, max_bytes: int) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from connectors.kafka import make_admin

    admin = make_admin(s.kafka_common())
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(30)


def test_size_limits_on_the_real_broker(fault_stack, tmp_path):
    """An input topic that takes 4 MB, output and DLQ topics that take 64 KB: a dead letter of 3 MB
    is cut to fit and marked. An output record the broker refuses (its topic's limit lowered under the
    running worker) dead-letters its input record (``output_too_large``, the broker's answer) and the
    worker goes on; a dead letter the broker refuses (nowhere else to put it) ends the run with exit 5
    and one line; raised again, the worker resumes at that record."""
    from connectors.kafka import make_producer
    from schemas.codec import encode_document
    from tests.helpers import fresh_settings

    _, env = fault_stack
    limit = 65_536
    s = fresh_settings(env, partitions=1, topic_config={"input": {"max.message.bytes": str(4 * 1024 * 1024)},
                                                        "output": {"max.message.bytes": str(limit)},
                                                        "dlq": {"max.message.bytes": str(limit)}})
    big = encode_document(Document("too-long", "word " * 600_000))  # 3 MB: text_too_long
    producer = make_producer(s.kafka_common(), **{"message.max.bytes": 5_000_000})
    producer.produce(s.input_topic, key="too-long", value=big)
    producer.produce(s.input_topic, key="fine", value=encode_document(Document("fine", "a short text")))
    assert producer.flush(30) == 0
    first = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    dlq = read_topic(s, s.dlq_topic, expect=1)
    assert len(dlq) == 1 and len(dlq[0].value() or b"") < limit
    headers = dict(dlq[0].headers())
    assert headers["embedstream.error.reason"] == b"text_too_long"
    assert int(headers["embedstream.error.original_size"]) == len(big)

    # 20 KB of metadata: an output record of ~22 KB, over a limit lowered to 16 KB once the worker
    # has read the topic's limit (a limit it knows at start-up it fits records to instead)
    fat = Document("fat", "a document with a lot of metadata", None, {"blob": "m" * 20_000})
    gate = Document("gate", "the worker reads this one first")
    producer.produce(s.input_topic, key="gate", value=encode_document(gate))
    assert producer.flush(30) == 0
    w = WorkerProcess(s, tmp_path, "w", EMBEDSTREAM_MAX_BATCH_WAIT_MS="10")
    wait_until(lambda: len(read_topic(s, s.output_topic, idle=0.5)) >= 2, 120, what="gate embedded")
    _alter_topic(s, s.output_topic, 16_384)
    producer.produce(s.input_topic, key="fat", value=encode_document(fat))
    producer.produce(s.input_topic, key="after", value=encode_document(Document("after", "written after it")))
    assert producer.flush(30) == 0
    wait_until(lambda: "after" in {m.key().decode() for m in read_topic(s, s.output_topic, idle=0.5)}, 120,
               what="the record after the refused one embedded")
    dead = {m.key().decode(): dict(m.headers()) for m in read_topic(s, s.dlq_topic, expect=2)}
    assert dead["fat"]["embedstream.error.reason"] == b"output_too_large", dead["fat"]
    assert b"MSG_SIZE_TOO_LARGE" in dead["fat"]["embedstream.error.message"]
    assert "fat" not in {m.key().decode() for m in read_topic(s, s.output_topic, idle=1.0)}

    # a dead letter of ~30 KB (cut to the 64 KB the worker knows) into a DLQ topic lowered to 16 KB
    _alter_topic(s, s.dlq_topic, 16_384)
    producer.produce(s.input_topic, key="junk", value=b"{" + b"x" * 30_000)  # not JSON: decode_error
    assert producer.flush(30) == 0
    assert w.wait(120) == 5, w.log()[-3000:]
    last = [line for line in w.log().splitlines() if line.strip()][-1]
    assert "refused" in last and s.dlq_topic in last and "max.message.bytes" in last, last

    _alter_topic(s, s.dlq_topic, limit)  # fixed: the worker resumes at that record
    again = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    keys = Counter(m.key().decode() for m in read_topic(s, s.output_topic, expect=3))
    # "after" shared a produce request with the refused record: its group was written again (at least
    # once: a duplicate is allowed, a loss is not)
    assert keys["fine"] == 1 and keys["gate"] == 1 and keys["after"] >= 1 and "fat" not in keys
    assert Counter(m.key().decode() for m in read_topic(s, s.dlq_topic, expect=3))["junk"] == 1


def test_a_topic_that_takes_less_than_16_kb_stops_the_start_naming_it(fault_stack):
    """A DLQ topic whose ``max.message.bytes`` is 8 KB (a dead letter's own headers need up to ~6 KB):
    `embedstream run` refuses to start, exit 2, one line naming the topic and the minimum."""
    from tests.helpers import fresh_settings

    _, env = fault_stack
    s = fresh_settings(env, partitions=1, topic_config={"dlq": {"max.message.bytes": "8192"}})
    res = run_worker(s, "--stop-when-idle", "1", timeout=180)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert s.dlq_topic in last and "8,192" in last and "16,384" in last, last


def test_two_exactly_once_workers_with_one_instance_id_end_the_older_with_exit_4(fs, model, tmp_path):
    """Exit 4 through `embedstream run`: a second exactly-once worker started with the first one's
    instance id (so its transactional.id) fences the first, which stops with exit code 4 and its
    line, writing nothing more. The newer one finishes the stream: a read_committed reader sees each
    input's output once."""
    expected = Expected()
    produce_docs(fs, short_docs(3000, "fenced", unseen=True), expected)
    same = {**EXACTLY_ONCE, "EMBEDSTREAM_GROUP_INSTANCE_ID": "one-pod"}
    a = WorkerProcess(fs, tmp_path, "a", **same)
    wait_until(lambda: committed_total(fs, PARTITIONS) > 0, 180, what="the first worker's first transaction")
    b = WorkerProcess(fs, tmp_path, "b", ("--stop-when-idle", "5"), **same)
    assert a.wait(120) == 4, a.log()[-3000:]
    at_exit = committed_total(fs, PARTITIONS)
    assert at_exit < expected.records, "the first worker finished the stream before the second started"
    last = [line for line in a.log().splitlines() if line.strip()][-1]
    assert "fence" in last and "EMBEDSTREAM_GROUP_INSTANCE_ID" in last, last
    assert b.wait(300) == 0, b.log()[-3000:]
    assert DONE.search(b.log()) and int(DONE.search(b.log())[1]) > 0, "the second worker did the rest"
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.duplicates == 0, report
    assert max(_outputs(fs, "read_committed").values()) == 1
    record_row("kafka: exit 4", "a second worker with the same instance id", report, None)


def test_kip_848_kill_and_one_three_one(fs, model, tmp_path):
    """The consumer group protocol of KIP-848 (``EMBEDSTREAM_GROUP_PROTOCOL=consumer``): a member
    killed with -9 and restarted, then two members joining and leaving while documents arrive.
    Nothing is lost; every repeat lies in the killed member's uncommitted window."""
    import threading

    kip848 = {"EMBEDSTREAM_GROUP_PROTOCOL": "consumer"}
    expected = Expected()
    docs = short_docs(1800, "kp", unseen=True)
    produce_docs(fs, docs[:900], expected)
    w = WorkerProcess(fs, tmp_path, "a", **kip848)
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 200, 180, what="first commits")
    w.kill9()
    at_kill = committed_offsets(fs, PARTITIONS)
    a = WorkerProcess(fs, tmp_path, "a2", ("--stop-when-idle", "5"), **kip848)
    wait_until(lambda: committed_total(fs, PARTITIONS) > sum(at_kill.values()), 120, what="progress after restart")

    def trickle():  # ~15 s of arrivals: the joiners get documents of their own partitions
        for i in range(900, len(docs), 30):
            produce_docs(fs, docs[i:i + 30], expected)
            time.sleep(0.5)

    producer = threading.Thread(target=trickle)
    producer.start()
    b = WorkerProcess(fs, tmp_path, "b", EMBEDSTREAM_METRICS_PORT="auto", **kip848)
    c = WorkerProcess(fs, tmp_path, "c", EMBEDSTREAM_METRICS_PORT="auto", **kip848)
    ports = (b.metrics_port(), c.metrics_port())
    wait_until(lambda: owns_partitions(b.log()) and owns_partitions(c.log()), 120,
               what="b and c given partitions")
    # the protocol that ran, as the broker tells it (not the worker's own word for what it asked)
    from confluent_kafka import ConsumerGroupType

    admin = make_admin(fs.kafka_common())  # kept: a collected admin client never answers its futures
    group = admin.describe_consumer_groups([fs.group_id], request_timeout=10)[fs.group_id].result(timeout=30)
    assert group.type == ConsumerGroupType.CONSUMER and len(group.members) == 3, (group.type, group.members)
    wait_until_each_embedded(ports, what="b and c")
    b.terminate()
    c.terminate()
    assert b.wait(60) == 0 and c.wait(60) == 0
    producer.join(120)
    assert a.wait(300) == 0, a.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    window = fs.max_inflight_batches * fs.max_batch_size
    seen = Counter((r["source_partition"], r["source_offset"])
                   for r in (decode_embedding(m.value()) for m in read_topic(fs, fs.output_topic)
                             if m.value() is not None))
    stray = [(p, o) for (p, o), n in seen.items() if n > 1 and not at_kill[p] <= o < at_kill[p] + window]
    # b and c leave by SIGTERM: they commit what they did before their partitions go, so repeats
    # come from the kill alone
    assert not stray, f"records repeated outside the kill's uncommitted window: {stray[:5]}"
    record_row("kafka: KIP-848", "kill -9 + restart, then 1 → 3 → 1", report, None)
