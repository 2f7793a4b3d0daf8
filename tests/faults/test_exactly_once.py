"""Scenario 13: ``EMBEDSTREAM_DELIVERY=exactly-once`` under the faults of scenarios 1, 3, 7 and 9.

Every reader here is ``read_committed`` (librdkafka's default, and ``read_topic``'s); each scenario
also checks what only transactions give, so that an at-least-once worker fails it: the markers its
commits leave on the output topic. (Records held from read_committed readers while Milvus fails are
shown in ``test_on_kafka.py``: a frozen Milvus fails a group's version reads before its produce.)
0 duplicates after an interrupted transaction is asserted where the broker hides aborted
transactions (Apache Kafka, the suite's default), and is a visible xfail elsewhere. The faults
share streams to keep the suite's time: Milvus frozen, poison pills and SIGTERM + restart in one
stream, the broker frozen and a rebalance in another. kill -9 inside a transaction, and the restart
that aborts it, is ``test_on_kafka.py``'s (each copy of the output at both isolation levels).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from connectors.kafka import create_topics, make_admin
from schemas.codec import Document, decode_embedding, encode_document
from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_offsets,
    committed_total,
    frozen,
    produce_bad,
    produce_docs,
    rebalance_events,
    record_row,
    sessions_s,
    short_docs,
    transaction_markers,
    two_join_then_leave,
    wait_until,
)
from tests.helpers import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.faults]

EXACTLY_ONCE = {"EMBEDSTREAM_DELIVERY": "exactly-once"}
#: Without the cache: the scenarios' texts are hot from earlier ones, and with them a stream can be
#: committed whole before its fault begins; uncached, the model sets the pace and the fault lands mid-stream.
UNCACHED = {**EXACTLY_ONCE, "EMBEDSTREAM_REDIS_URL": ""}


def _dlq_copies(fs, expected: Expected) -> Counter:
    return Counter(m.key().decode() for m in read_topic(fs, fs.dlq_topic, expect=len(expected.bad), idle=2.0))


def test_exactly_once_through_milvus_frozen_poison_pills_and_sigterm(fs, model, parts, tmp_path):
    expected = Expected()
    docs = short_docs(1500, "eo")
    bad = {
        "eo-bad-avro": (b"\x02\x06abc\xff\x00", "decode_error"),
        "eo-empty": (encode_document(Document("eo-empty", "  \n ")), "empty_text"),
        "eo-utf8": (b'{"id": "eo-utf8", "text": "caf\xe9"}', "invalid_utf8"),
    }
    for i in range(0, 1500, 500):  # bad records interleaved with good ones
        produce_docs(fs, docs[i:i + 500], expected)
        produce_bad(fs, dict(list(bad.items())[i // 500:i // 500 + 1]), expected)
    w = WorkerProcess(fs, tmp_path, "w", EMBEDSTREAM_GROUP_INSTANCE_ID="eo-w", **UNCACHED)
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    with frozen(parts["milvus"]):
        time.sleep(2)  # a transaction past Milvus when the freeze began may still commit
        during = committed_total(fs, PARTITIONS)
        time.sleep(6)
        assert committed_total(fs, PARTITIONS) == during, "offsets were committed while Milvus was down"
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.5 * expected.records, 120, what="50% committed")
    w.terminate()
    assert w.wait(fs.shutdown_grace_seconds + 15) == 0, w.log()[-3000:]
    w2 = WorkerProcess(fs, tmp_path, "w2", ("--stop-when-idle", "0.5"), EMBEDSTREAM_GROUP_INSTANCE_ID="eo-w",
                       **UNCACHED)
    assert w2.wait(300) == 0, w2.log()[-3000:]
    assert "sink: milvus" in w.log(), "the worker never met the Milvus outage"
    assert_transactional(fs)
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.duplicates == 0, report
    assert _dlq_copies(fs, expected) == Counter(set(expected.bad))  # each bad record dead-lettered once
    record_row("13 exactly-once: 3+7+9", "Milvus frozen 8 s, 3 poison pills, SIGTERM at 50%", report, None)


def assert_transactional(fs) -> None:
    """The worker wrote its output in transactions: each one left a marker on the output topic, an
    offset with no record behind it (an at-least-once worker leaves none)."""
    assert transaction_markers(fs, fs.output_topic) > 0, "no transaction markers on the output topic"


def exact_or_xfail(fs, report, stray: list) -> None:
    """0 duplicates where the broker hides aborted transactions (Kafka); elsewhere (Tansu) what still
    holds, every repeat inside an interrupted transaction's window, then a visible xfail."""
    if broker_hides_aborted_transactions(fs):
        assert report.duplicates == 0, (report, "repeated (partition, offset):", repeats_outside(fs, [])[:20])
        return
    assert not stray, f"records repeated outside an interrupted transaction: {stray[:5]}"
    pytest.xfail("this broker shows aborted transactions to read_committed readers: 0 duplicates is "
                 "checked on Apache Kafka (EMBEDSTREAM_TEST_BROKER=kafka)")


def broker_hides_aborted_transactions(fs) -> bool:
    """Whether read_committed readers never see an aborted transaction's records, neither one aborted
    by its producer nor one left open by a producer whose ``transactional.id`` initialised again (Kafka:
    both hidden). Measured on the local Tansu: both are shown once a later transaction commits (it
    keeps no index of aborted transactions), so every abort there shows up as duplicates."""
    topic = fs.output_topic + "-probe"
    tid = f"probe-{uuid.uuid4().hex[:8]}"
    create_topics(make_admin(fs.kafka_common()), [topic], 1)
    first = Producer({**fs.kafka_common(), "transactional.id": tid})
    first.init_transactions(10)
    first.begin_transaction()
    first.produce(topic, b"aborted")
    first.flush(10)
    first.abort_transaction(10)
    first.begin_transaction()
    first.produce(topic, b"left open")
    first.flush(10)
    second = Producer({**fs.kafka_common(), "transactional.id": tid})
    second.init_transactions(30)  # fences the first and ends its transaction
    second.begin_transaction()
    second.produce(topic, b"committed")
    second.commit_transaction(10)
    values = [m.value() for m in read_topic(fs, topic, expect=1, idle=2.0)]
    first.purge()
    assert b"committed" in values, values
    return b"aborted" not in values and b"left open" not in values


def repeats_outside(fs, at: list[dict[int, int]]) -> list[tuple[int, int]]:
    """Output records seen more than once whose input offset lies outside every window of ``at``
    (committed offsets per partition when a transaction was interrupted), each no wider than the
    batches a worker holds."""
    window = fs.max_inflight_batches * fs.max_batch_size
    seen = Counter((r["source_partition"], r["source_offset"])
                   for r in (decode_embedding(m.value()) for m in read_topic(fs, fs.output_topic)
                             if m.value() is not None))
    return [(p, o) for (p, o), n in seen.items() if n > 1 and not any(c[p] <= o < c[p] + window for c in at)]


def test_exactly_once_through_broker_frozen_and_rebalance(fs, model, parts, tmp_path):
    """Scenarios 2 and 5 in one stream: the broker frozen past the session timeout, then 1 → 3 → 1
    workers while documents keep arriving. The freeze costs the member its session, and the
    transaction it had open is aborted and redone: 0 duplicates where the broker hides aborted
    transactions; on Tansu, repeats only in that transaction's window."""
    expected = Expected()
    docs = short_docs(1500, "eb")
    lock = threading.Lock()
    produce_docs(fs, docs[:600], expected)

    def trickle():  # ~15 s of arrivals: the three members share them
        for i in range(600, len(docs), 30):
            with lock:
                produce_docs(fs, docs[i:i + 30], expected)
            time.sleep(0.5)

    # Dynamic members here. With static ones (as the chart runs them) this passed alone twice, but in
    # the suite Tansu never gave the partitions of b and c back to a after they left by SIGTERM (a
    # static member does not leave: its session expires), and a stopped idle with 256 records unowned;
    # the soak saw Tansu hold a restarted static member's join for minutes. The transactional ids
    # are then host-pid ones (no restarts in this stream).
    a = WorkerProcess(fs, tmp_path, "a", ("--stop-when-idle", "5"), **UNCACHED)
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    at_freeze = committed_offsets(fs, PARTITIONS)
    before = len(a.log())
    with frozen(parts["broker"]):
        time.sleep(sessions_s(fs))
    # the member's session lapsed: the broker took its partitions, and it lost them, then joined again
    wait_until(lambda: any(what == "lost" for what, _ in rebalance_events(a.log()[before:])), 60,
               what="a to learn that its session lapsed in the freeze")
    wait_until(lambda: committed_total(fs, PARTITIONS) > sum(at_freeze.values()), 120,
               what="progress after the broker came back")  # 600 produced: 20 % is not all of them
    producer = threading.Thread(target=trickle)
    producer.start()
    two_join_then_leave(fs, tmp_path, **UNCACHED)
    producer.join(120)
    assert a.wait(300) == 0, a.log()[-3000:]
    assert_transactional(fs)
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    record_row("13 exactly-once: 2+5", "SIGSTOP broker past 3 sessions (lapsed), then 1 → 3 → 1 workers", report,
               None)
    exact_or_xfail(fs, report, repeats_outside(fs, [at_freeze]))
