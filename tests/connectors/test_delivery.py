"""DeliveryBatch's contract: confirm returns once the broker acknowledged every record, and raises
TransientError (never returns) when it did not."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError

from connectors.kafka import DeliveryBatch, create_topics, make_admin, make_producer
from schemas.errors import TransientError
from tests.unit.fakes import RecordingProducer


def _producer(kind, stack_env, down: bool = False):
    if kind == "fake":
        return RecordingProducer(fail=KafkaError(KafkaError._MSG_TIMED_OUT) if down else None), "t"
    if down:
        return make_producer({"bootstrap.servers": "127.0.0.1:1"}, delivery_timeout_s=1), "t"
    common = {"bootstrap.servers": stack_env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"]}
    topic = f"contract-{uuid.uuid4().hex[:8]}"
    create_topics(make_admin(common), [topic], 1)
    return make_producer(common, delivery_timeout_s=10), topic


def _written(kind, stack_env, producer, topic: str) -> list[tuple[bytes, bytes | None]]:
    """(key, value) of every record on ``topic``, in order: what the fake recorded, or what a reader of
    the real broker gets back."""
    if kind == "fake":
        return [(key, value) for _, key, value, _ in producer.records]
    from tests.helpers import read_topic
    from worker.settings import Settings

    s = Settings(kafka_bootstrap_servers=stack_env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"])
    return [(m.key(), m.value()) for m in read_topic(s, topic, expect=4, idle=1.0)]


def test_confirm_returns_once_every_record_is_acknowledged(kind, stack_env):
    producer, topic = _producer(kind, stack_env)
    delivery = DeliveryBatch(producer, 10)
    for i in range(3):
        delivery.produce(topic, f"k{i}".encode(), b"v")
    delivery.produce(topic, b"gone", None)  # a tombstone
    delivery.confirm()
    assert _written(kind, stack_env, producer, topic) == [(b"k0", b"v"), (b"k1", b"v"), (b"k2", b"v"), (b"gone", None)]


def test_confirm_raises_transient_when_the_broker_does_not_acknowledge(kind, stack_env):
    producer, topic = _producer(kind, stack_env, down=True)
    delivery = DeliveryBatch(producer, 3)
    delivery.produce(topic, b"k", b"v")
    with pytest.raises(TransientError):
        delivery.confirm()
    assert not delivery.broken  # an unreachable broker is an outage: the same producer retries

