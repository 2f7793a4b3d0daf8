"""Share groups: a record delivered too often is dead-lettered first; a finished batch's records are
acknowledged one by one (released where the sink left them unwritten); exactly-once is refused."""

from __future__ import annotations

import pytest
from confluent_kafka import AcknowledgeType

from schemas.codec import Document, encode_document
from schemas.errors import TransientError
from worker.core.ledger import ShareLedger
from worker.core.records import Batch, DeadLetter, Item, Written
from worker.settings import Settings
from worker.steps.polling.validate import Validator

from .fakes import FakeMessage


def _record(offset: int, deliveries: int | None, partition: int = 0) -> FakeMessage:
    return FakeMessage(b"d", encode_document(Document("d", "some text")), partition=partition, offset=offset,
                       deliveries=deliveries)


def test_a_record_delivered_more_than_the_limit_is_dead_lettered_before_it_is_read():
    share = Validator(1000, lambda name: "", max_deliveries=2)
    assert isinstance(share.validate(_record(0, 1)), Item) and isinstance(share.validate(_record(1, 2)), Item)
    dead = share.validate(_record(2, 3))
    assert isinstance(dead, DeadLetter) and dead.reason == "delivery_count_exceeded"
    assert "delivered 3 times" in dead.message and "EMBEDSTREAM_SHARE_MAX_DELIVERIES=2" in dead.message
    assert dead.value == _record(2, 3).value()  # the original bytes, as every dead letter keeps them
    assert isinstance(Validator(1000, lambda name: "").validate(_record(3, 9)), Item)  # a consumer group: no limit


class _ShareConsumer:
    def __init__(self, refused: bool = False) -> None:
        self.acks: list[tuple[str, int, int, AcknowledgeType]] = []
        self.sent: list[str] = []
        self.refused = refused

    def acknowledge_offset(self, topic, partition, offset, kind):
        self.acks.append((topic, partition, offset, kind))

    def commit_async(self):
        self.sent.append("async")

    def commit_sync(self, timeout):
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        self.sent.append("sync")
        error = KafkaException(KafkaError(KafkaError.INVALID_RECORD_STATE)) if self.refused else None
        return {TopicPartition("docs", 0): error}


def _acknowledged(kind: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("embedstream_share_acknowledgements_total", {"type": kind}) or 0.0


def test_a_finished_batch_is_accepted_record_by_record_and_what_the_sink_left_is_released(caplog):
    consumer = _ShareConsumer()
    acks = ShareLedger(consumer, 5.0)
    batch = Batch()
    for offset, partition in ((4, 0), (9, 0), (2, 1)):
        v = Validator(1000, lambda name: "")
        batch.add(v.validate(_record(offset, 1, partition)))
    written = Written(fenced=frozenset({("docs", 1)}))  # the sink left partition 1 unwritten
    assert acks.flush(sync=False) and consumer.sent == []  # nothing acknowledged: nothing to send
    before = {t: _acknowledged(t) for t in ("accept", "release", "reject")}
    assert acks.finished(batch, written) == 1
    assert {t: _acknowledged(t) - n for t, n in before.items()} == {"accept": 2, "release": 1, "reject": 0}
    assert consumer.acks == [("docs", 0, 4, AcknowledgeType.ACCEPT), ("docs", 0, 9, AcknowledgeType.ACCEPT),
                             ("docs", 1, 2, AcknowledgeType.RELEASE)]
    assert acks.flush(sync=False) and consumer.sent == ["async"]
    assert acks.flush(sync=True) and consumer.sent == ["async"]  # sent already
    refusing = ShareLedger(_ShareConsumer(refused=True), 5.0)
    refusing.finished(batch, written)
    assert refusing.flush(sync=True) and "refused acknowledgements of ['docs[0]']" in caplog.text


def test_a_share_group_refuses_exactly_once_at_start_up():
    with pytest.raises(ValueError, match="share groups have no transactions"):
        Settings(group_type="share", delivery="exactly-once")
    assert Settings(group_type="share").share_max_deliveries == 4


class _TimedShareConsumer(_ShareConsumer):
    def __init__(self, failing: bool = False) -> None:
        super().__init__()
        self.timeouts: list = []
        self.failing = failing
        self.tries = 0

    def commit_sync(self, timeout):
        self.timeouts.append(timeout)
        return super().commit_sync(timeout)

    def commit_async(self):
        self.tries += 1
        if self.failing:
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        super().commit_async()


def _finished(acks: ShareLedger, *fenced_partitions: int) -> int:
    """Hand ``acks`` a batch of three records (partition 0, then two of 1), the sink having left
    ``fenced_partitions`` unwritten; what ``finished`` returns."""
    batch = Batch()
    for offset, partition in ((1, 0), (2, 1), (3, 1)):
        batch.add(Validator(1000, lambda name: "").validate(_record(offset, 1, partition)))
    return acks.finished(batch, Written(fenced=frozenset(("docs", p) for p in fenced_partitions)))


def test_acknowledgements_wait_for_the_broker_as_long_as_configured_and_count_every_release():
    consumer = _TimedShareConsumer()
    acks = ShareLedger(consumer, 7.5)
    before = _acknowledged("release")
    assert _finished(acks, 1) == 2  # both records of partition 1
    assert _acknowledged("release") - before == 2
    assert acks.flush(sync=True) and consumer.timeouts == [7.5]
    # what was acknowledged goes with the next commit, whatever came after it
    _finished(acks)
    acks.finished(Batch(), Written())
    assert acks.flush(sync=True) and consumer.timeouts == [7.5, 7.5]


def test_acknowledgements_the_broker_cannot_take_now_are_a_kafka_outage_to_retry():
    consumer = _TimedShareConsumer(failing=True)
    acks = ShareLedger(consumer, 5.0)
    _finished(acks)
    with pytest.raises(TransientError) as raised:
        acks._send(sync=False)
    assert raised.value.system == "kafka" and str(raised.value).startswith("kafka: acknowledging records: ")
    tries = consumer.tries
    assert acks.flush(sync=False) is False  # a warning; what was acknowledged goes with the next send
    assert consumer.tries == tries + 1  # once: the polling thread never waits to try again
    consumer.failing = False
    assert acks.flush(sync=False) and consumer.sent == ["async"]


def test_the_reject_series_is_exported_at_0_and_a_tick_sends_only_what_was_acknowledged():
    """``embedstream_share_acknowledgements_total{type="reject"}`` exists from the start (a dashboard
    and an alert read it; this worker dead-letters instead of rejecting); a tick with nothing
    acknowledged sends nothing (and times no commit)."""
    from prometheus_client import REGISTRY

    consumer = _ShareConsumer()
    acks = ShareLedger(consumer, 5.0)
    assert REGISTRY.get_sample_value("embedstream_share_acknowledgements_total", {"type": "reject"}) is not None
    timed = REGISTRY.get_sample_value("embedstream_commit_seconds_count", {"mode": "async"}) or 0.0
    acks.tick()
    assert consumer.sent == [] and REGISTRY.get_sample_value("embedstream_commit_seconds_count",
                                                               {"mode": "async"}) == timed
    _finished(acks)
    acks.tick()
    assert consumer.sent == ["async"]
