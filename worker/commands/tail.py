"""``embedstream tail``: read the output topic and print each record as one JSON line.

Reads by direct partition assignment (no consumer group, nothing committed), so tailing never
disturbs the worker's group.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from connectors.kafka import logged
from schemas.codec import DecodeError, decode_embedding
from worker.settings import Settings


def tail_records(settings: Settings, *, topic: str | None = None, from_beginning: bool = False,
                 max_records: int | None = None, timeout: float | None = None,
                 decode: Callable[[bytes, list | None], dict] = decode_embedding,
                 read_committed: bool = True) -> Iterator[dict]:
    """Yield the records of ``topic`` (default: the output topic) as dicts.

    ``read_committed``: a transactional producer's records only once their transaction committed
    (never an aborted one's), as a consumer of an exactly-once output reads them; False shows
    everything written.

    Stops after ``max_records``, or once no record arrived for ``timeout`` seconds (None: never).
    A tombstone yields ``{"id": key, "tombstone": True}``; a value that does not decode yields
    ``{"id": key, "error": reason}`` rather than stopping the tail.
    """
    topic = topic or settings.output_topic
    consumer = Consumer(logged({
        **settings.kafka_common(),
        "group.id": f"embedstream-tail-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    }))
    try:
        meta = consumer.list_topics(topic, timeout=10)
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            raise RuntimeError(f"topic {topic!r} not found on {settings.kafka_bootstrap_servers}")
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(topic, p, start) for p in sorted(tmeta.partitions)])
        seen = 0
        last = time.monotonic()
        while max_records is None or seen < max_records:
            msgs = consumer.consume(num_messages=500, timeout=0.2)
            if not msgs:
                if timeout is not None and time.monotonic() - last > timeout:
                    return
                continue
            last = time.monotonic()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {topic}: {err}")
                yield _render(msg, decode)
                seen += 1
                if max_records is not None and seen >= max_records:
                    return
    finally:
        consumer.close()


def _render(msg, decode: Callable[[bytes, list | None], dict]) -> dict:
    key = msg.key().decode("utf-8", "replace") if msg.key() is not None else None
    meta = {"partition": msg.partition(), "offset": msg.offset(), "timestamp": msg.timestamp()[1]}
    if msg.value() is None:
        return {"id": key, "tombstone": True, **meta}
    try:
        return {**decode(msg.value(), msg.headers()), **meta}
    except DecodeError as exc:
        return {"id": key, "error": exc.reason, "message": exc.message, **meta}


def to_json_line(record: dict, vectors: bool = True) -> str:
    if not vectors and "vector" in record:
        record = {k: v for k, v in record.items() if k != "vector"}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))
