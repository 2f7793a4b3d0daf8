"""Write one finished batch: the output and dead-letter topics and Milvus, then the cache.

The order is the delivery contract: a batch counts as done (its offsets may be committed) only
when Milvus has acknowledged the upserts and deletes *and* the broker has acknowledged every output
and dead-letter record. Any outage raises :class:`TransientError` and the whole step is retried:
Milvus upserts are idempotent, the output topic is at-least-once. The cache is filled last and
best-effort; it never fails a batch.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from connectors.kafka import DeliveryBatch
from connectors.milvus import MilvusStore
from connectors.redis_cache import RedisCache
from schemas.codec import encode_embedding
from worker import metrics
from worker.records import Batch, DeadLetter, Delete, Item
from worker.settings import Settings


def final_operations(batch: Batch) -> tuple[dict[str, Item], list[str]]:
    """Per id, the last operation of the batch wins: ``(upserts by id, ids to delete)``."""
    last: dict[str, Item | Delete] = {}
    for e in batch.entries:
        if isinstance(e, (Item, Delete)):
            last[e.id] = e
    upserts = {i: e for i, e in last.items() if isinstance(e, Item)}
    deletes = [i for i, e in last.items() if isinstance(e, Delete)]
    return upserts, deletes


def dlq_headers(d: DeadLetter, max_value: int) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """The value and headers of the dead-letter record for ``d`` (contract headers added)."""
    headers = list(d.headers or [])
    value = d.value
    if value is not None and len(value) > max_value:
        # A value over the hard limit cannot be re-produced whole (the broker caps message size):
        # keep its head and say so.
        headers.append(("embedstream.error.original_size", str(len(value)).encode()))
        value = value[:max_value]
    headers += [
        ("embedstream.error.reason", d.reason.encode()),
        ("embedstream.error.message", d.message.encode("utf-8", "replace")[:4096]),
        ("embedstream.source.topic", d.source.topic.encode()),
        ("embedstream.source.partition", str(d.source.partition).encode()),
        ("embedstream.source.offset", str(d.source.offset).encode()),
    ]
    return value, headers


class SinkStep:
    """``process(batch)`` makes the batch durable; raises :class:`TransientError` to be retried."""

    def __init__(self, settings: Settings, store: MilvusStore, producer: Producer, model_id: str, dim: int,
                 cache: RedisCache | None, dlq_value_limit: int = 900_000) -> None:
        self.s = settings
        self.store = store
        self.producer = producer
        self.model_id = model_id
        self.dim = dim
        self.cache = cache
        self.dlq_value_limit = dlq_value_limit
        self._model_header = model_id.encode()

    def process(self, batch: Batch) -> Batch:
        now = int(time.time() * 1000)
        upserts, deletes = final_operations(batch)
        # Hand the records to the producer first: librdkafka sends them while Milvus upserts. Both
        # must be confirmed before the batch counts as done; the order between them does not matter.
        t0 = time.perf_counter()
        delivery = DeliveryBatch(self.producer, self.s.kafka_timeout_seconds)
        for e in batch.entries:
            if isinstance(e, Item):
                rec = {"id": e.id, "model": self.model_id, "dim": self.dim, "vector": e.vector,
                       "content_hash": e.hash, "cached": e.cached, "source_topic": e.source.topic,
                       "source_partition": e.source.partition, "source_offset": e.source.offset,
                       "metadata": e.metadata, "embedded_at": now}
                delivery.produce(self.s.output_topic, e.id.encode(), encode_embedding(rec),
                                 [("embedstream.model", self._model_header),
                                  ("embedstream.cached", b"true" if e.cached else b"false")])
            elif isinstance(e, Delete):
                delivery.produce(self.s.output_topic, e.id.encode(), None, [("embedstream.model", self._model_header)])
            else:
                value, headers = dlq_headers(e, self.dlq_value_limit)
                delivery.produce(self.s.dlq_topic, e.key, value, headers)
        t1 = time.perf_counter()
        self.store.upsert([{"id": i, "vector": it.vector, "model": self.model_id, "content_hash": it.hash,
                            "metadata": it.metadata, "updated_at": now} for i, it in upserts.items()])
        self.store.delete(deletes)
        t2 = time.perf_counter()
        metrics.SINK_SECONDS.labels("milvus").observe(t2 - t1)
        delivery.confirm()
        metrics.SINK_SECONDS.labels("output").observe((t1 - t0) + (time.perf_counter() - t2))

        if self.cache is not None and batch.fresh:
            self.cache.set_many(batch.fresh)
        return batch
