"""Scenarios 5, 6, 7 and 8: rebalances, a slow model, poison pills, the DLQ circuit breaker."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition

from schemas.codec import Document, encode_document
from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_total,
    produce_bad,
    produce_docs,
    produce_tombstones,
    record_row,
    run_worker,
    short_docs,
    two_join_then_leave,
    wait_until,
)
from tests.helpers import fresh_settings, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_rebalance_one_three_one_while_producing(fs, model, tmp_path):
    expected = Expected()
    docs = short_docs(3000, "rb")
    lock = threading.Lock()

    def trickle():
        for i in range(0, len(docs), 100):
            with lock:
                produce_docs(fs, docs[i:i + 100], expected)
            time.sleep(0.5)

    producer = threading.Thread(target=trickle)
    a = WorkerProcess(fs, tmp_path, "a", ("--stop-when-idle", "5"))
    producer.start()
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 300, 180, what="first commits")
    two_join_then_leave(fs, tmp_path)
    producer.join(120)
    assert a.wait(300) == 0, a.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    record_row("5 rebalance 1→3→1", "2 workers joined, then SIGTERM", report, None)


class SlowModel:
    """The real model, plus a sleep per batch longer than half of max.poll.interval.ms."""

    def __init__(self, model, seconds: float) -> None:
        self._m, self.seconds = model, seconds

    def __getattr__(self, name):
        return getattr(self._m, name)

    def embed(self, texts):
        time.sleep(self.seconds)
        return self._m.embed(texts)

    def embed_prepared(self, prepared):  # the worker's call
        time.sleep(self.seconds)
        return self._m.embed_prepared(prepared)

    def warmup(self):
        pass


def test_slow_model_never_gets_the_worker_evicted(fault_stack, model, tmp_path):
    from worker.assembly.runner import build_worker

    _, env = fault_stack
    # no cache: earlier tests cached these texts, and a cache hit would never reach the slow model
    s = fresh_settings(env, partitions=PARTITIONS, max_batch_size=40, max_inflight_batches=2, commit_interval_ms=0,
                       redis_url=None)
    s.kafka["max.poll.interval.ms"] = "7000"  # librdkafka's floor is session.timeout.ms (6000)
    expected = Expected()
    produce_docs(s, short_docs(240, "slow"), expected)
    worker = build_worker(s, embedder=SlowModel(model, 4.0))  # 4 s a batch > 3.5 s = ½ max.poll.interval
    revokes, lost = [], []
    worker.rebalance.on_revoke = _spy(worker.rebalance.on_revoke, revokes)  # type: ignore[method-assign]
    worker.rebalance.on_lost = _spy(worker.rebalance.on_lost, lost)  # type: ignore[method-assign]
    t0 = time.monotonic()
    stats = worker.run(stop_when_idle=2)
    assert stats.embedded == 240
    assert worker.assignment.pauses >= 1, "partitions were never paused although the model was the bottleneck"
    assert not lost and len(revokes) <= 1, (revokes, lost)  # only the final close
    report = check_nothing_lost(s, model, expected, PARTITIONS)
    record_row("6 slow model", f"4 s per batch, max.poll.interval 7 s, {worker.assignment.pauses} pauses", report,
               time.monotonic() - t0)


def _spy(fn, calls):
    def wrapper(consumer, partitions):
        calls.append([p.partition for p in partitions])
        return fn(consumer, partitions)

    return wrapper


@pytest.mark.guarantee
def test_poison_pills_go_to_the_dlq_and_block_nothing(fs, model, tmp_path):
    expected = Expected()
    docs = short_docs(600, "pp")
    bad = {
        "pp-bad-avro": (b"\x02\x06abc\xff\x00", "decode_error"),
        "pp-json-garbage": (b'{"id": "pp-json-garbage", "text": tru', "decode_error"),
        "pp-empty": (encode_document(Document("pp-empty", "  \n ")), "empty_text"),
        "pp-utf8": (b'{"id": "pp-utf8", "text": "caf\xe9"}', "invalid_utf8"),
        "pp-huge": (b"{" + b" " * 50_000_000 + b"}", "text_too_long"),
        "pp-model": (encode_document(Document("pp-model", "hello", model="some/other-model")), "unknown_model"),
    }
    for i in range(0, 600, 100):  # bad records interleaved with good ones
        produce_docs(fs, docs[i:i + 100], expected)
        produce_bad(fs, dict(list(bad.items())[i // 100:i // 100 + 1]), expected)
    # tombstones, one for an id that never existed
    produce_tombstones(fs, ["pp-3", "pp-7", "pp-unknown-id"], expected, existing={"pp-3", "pp-7"})
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "0.5"))
    assert w.wait(300) == 0, w.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.dead_lettered == len(bad)
    record_row("7 poison pills", "bad Avro, JSON garbage, empty, bad UTF-8, 50 MB, unknown model, tombstones",
               report, None)


@pytest.mark.guarantee
def test_a_producers_run_of_bad_records_never_trips_the_breaker(fault_stack, model, tmp_path):
    """The breaker stops a worker whose own settings are wrong, never one producer's flood: 100 records
    asking for a model no worker serves, past a run limit of 20, are dead-lettered with their reason and
    the documents after them embedded; the worker exits 0 with everything committed. (A run of reasons
    that point at the worker trips it: tests/unit/test_loop.py, tests/unit/test_dlq_limit.py.)"""
    _, env = fault_stack
    s = fresh_settings(env, partitions=1, max_batch_size=16, commit_interval_ms=0, dlq_max_consecutive=20)
    expected = Expected()
    produce_docs(s, short_docs(50, "brk-good"), expected)
    produce_bad(s, {f"brk-bad-{i}": (encode_document(Document(f"brk-bad-{i}", "x", model="wrong-model")),
                                     "unknown_model") for i in range(100)}, expected)
    produce_docs(s, short_docs(50, "brk-after"), expected)
    w = WorkerProcess(s, tmp_path, "w", ("--stop-when-idle", "1"))
    code = w.wait(300)
    assert code == 0, w.log()[-3000:]
    assert "halting" not in w.log()
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    [tp] = c.committed([TopicPartition(s.input_topic, 0)], timeout=10)
    c.close()
    assert tp.offset == 200
    report = check_nothing_lost(s, model, expected, 1)
    assert report.dead_lettered == 100
    record_row("8 DLQ breaker", "100 unknown_model in a row (limit 20): dead-lettered, nothing halted", report, None)


@pytest.mark.guarantee
def test_a_collection_that_refuses_every_document_trips_the_breaker(fault_stack, model, tmp_path):
    """The breaker's own case, end to end: the worker's collection is wrong (made elsewhere with its
    excerpt field two characters long), so Milvus refuses every document. They are found by halves and
    dead-lettered ``milvus_rejected``; once they weigh past the ratio the worker stops (exit 3) with the
    halting line naming the reason, committing nothing past the first unprocessed record."""
    from pymilvus import MilvusClient

    from connectors.milvus.schema import add_indexes, collection_schema

    _, env = fault_stack
    s = fresh_settings(env, partitions=1, max_batch_size=8, commit_interval_ms=0, dlq_ratio_window=20,
                       dlq_max_ratio=0.5)
    expected = Expected()
    produce_docs(s, short_docs(1, "brk-first"), expected)
    first = run_worker(s, "--stop-when-idle", "0.5")  # the worker makes its collection behind the alias
    assert first.returncode == 0, first.stderr[-3000:]
    client = MilvusClient(uri=s.milvus_uri, timeout=30)
    target = client.describe_alias(s.milvus_collection)["collection_name"]
    client.drop_alias(s.milvus_collection)
    client.drop_collection(target)
    schema = collection_schema(model.dim)
    next(f for f in schema.fields if f.name == "excerpt").params["max_length"] = 2
    client.create_collection(target, schema=schema)
    client.create_index(target, add_indexes(client.prepare_index_params()))
    client.load_collection(target)
    client.create_alias(target, s.milvus_collection)
    client.close()
    produce_docs(s, short_docs(200, "brk-refused"), expected)
    w = WorkerProcess(s, tmp_path, "w", ("--stop-when-idle", "1"))
    code = w.wait(300)
    log = w.log()
    assert code == 3, log[-3000:]
    assert "halting" in log and "milvus_rejected" in log and "embedstream migrate" in log
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    [tp] = c.committed([TopicPartition(s.input_topic, 0)], timeout=10)
    c.close()
    dlq = read_topic(s, s.dlq_topic)
    reasons = Counter(dict(m.headers())["embedstream.error.reason"].decode() for m in dlq)
    assert set(reasons) == {"milvus_rejected"} and reasons["milvus_rejected"] >= 10, reasons
    # stopped well before the end, and nothing committed past what was dead-lettered
    assert tp.offset < 1 + 200 and tp.offset <= 1 + len(dlq), (tp.offset, len(dlq))
    record_row("8 DLQ breaker", f"a collection refusing every document: stopped at {tp.offset - 1} of 200",
               type("R", (), {"documents": 0, "dead_lettered": len(dlq), "duplicates": 0, "dlq_duplicates": 0})(),
               None)


def test_memory_stays_bounded_under_floods(fs, model, tmp_path):
    """A flood of tiny records, a burst of tombstones and oversized values: the worker's memory stays
    within its documented bound (model + in-flight batches × EMBEDSTREAM_MAX_BATCH_BYTES + librdkafka's
    queue), whatever the input."""
    expected = Expected()
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "4"))
    wait_until(lambda: "assigned [" in w.log(), 120, what="the worker to join")
    baseline = max(w.rss_samples[-5:])
    tiny = [Document(f"tiny-{i}", f"t {i}") for i in range(6000)]
    produce_docs(fs, tiny, expected)
    half = [f"tiny-{i}" for i in range(0, 6000, 2)]  # a burst of tombstones for half of them
    produce_tombstones(fs, half, expected, existing=set(half))
    produce_bad(fs, {f"huge-{i}": (b"{" + b" " * 40_000_000 + b"}", "text_too_long") for i in range(3)},
                expected)
    assert w.wait(400) == 0, w.log()[-3000:]
    peak = max(w.rss_samples)
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    # in flight: (4 batches + the open one) × 16 MiB of text, plus librdkafka's 64 MiB queue and one
    # 40 MB record being fetched; 600 MiB leaves room for allocator slack.
    assert peak - baseline < 600, f"RSS grew from {baseline} to {peak} MiB"
    record_row("12 bounded memory", f"6,000 tiny + 3,000 tombstones + 3 × 40 MB; RSS {baseline} → {peak} MiB",
               report, None)
