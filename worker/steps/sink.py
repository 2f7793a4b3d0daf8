"""Write a group of finished batches: Milvus, the output and dead-letter topics, and the cache.

The order is the delivery contract: a batch counts as done (its offsets may be committed) only
when Milvus has acknowledged the upserts and deletes *and* the broker has acknowledged every output
and dead-letter record. A group is written with one Milvus upsert and one delete (the last
operation per id across the group wins) and done as a whole. Any outage raises
:class:`TransientError` and the whole step is retried:
Milvus upserts are idempotent, the output topic is at-least-once. The cache is filled while
Milvus writes, best-effort; it never fails a batch.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from confluent_kafka import Producer

from connectors.kafka import DeliveryBatch
from connectors.milvus import MilvusStore
from connectors.redis_cache import RedisCache
from schemas.codec import encode_embedding
from worker import metrics
from worker.records import Batch, DeadLetter, Delete, Item
from worker.settings import Settings


def final_operations(group: list[Batch]) -> tuple[dict[str, Item], list[str]]:
    """Per id, the last operation of the group wins: ``(upserts by id, ids to delete)``."""
    last: dict[str, Item | Delete] = {}
    for batch in group:
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
    """``process(group)`` makes the batches durable; raises :class:`TransientError` to be retried."""

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
        self._milvus = ThreadPoolExecutor(1, thread_name_prefix="milvus-write")

    def close(self) -> None:
        """Release the Milvus writer thread and the producer (call once the step is no longer used)."""
        self._milvus.shutdown(wait=True)
        # close() flushes without a time limit: only call it once nothing is left to deliver.
        if self.producer.flush(self.s.kafka_timeout_seconds) == 0:
            self.producer.close()

    def _write_milvus(self, upserts: dict[str, Item], deletes: list[str], now: int) -> float:
        """Upsert then delete (ids never in both); returns the seconds it took."""
        t0 = time.perf_counter()
        items = list(upserts.values())
        if items:
            self.store.upsert_columns(list(upserts), np.stack([it.vector for it in items]), self.model_id,
                                      [it.hash for it in items], [it.metadata for it in items], now)
        self.store.delete(deletes)
        return time.perf_counter() - t0

    def _produce(self, group: list[Batch], now: int) -> DeliveryBatch:
        """Hand every output and dead-letter record of ``group`` to the producer (not yet confirmed)."""
        delivery = DeliveryBatch(self.producer, self.s.kafka_timeout_seconds)
        for e in (e for batch in group for e in batch.entries):
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
        return delivery

    def process(self, group: list[Batch]) -> None:
        now = int(time.time() * 1000)
        upserts, deletes = final_operations(group)
        # Milvus writes on a helper thread while this one encodes and hands the records to the
        # producer (librdkafka sends them meanwhile): the server works while Python does. Both
        # must be confirmed before the batches count as done; the order between them does not matter.
        write = self._milvus.submit(self._write_milvus, upserts, deletes, now)
        t0 = time.perf_counter()
        try:
            # Records acknowledged by an earlier attempt (which then failed on Milvus) are not
            # produced again: an outage would otherwise repeat the group's output at every retry.
            delivery = None if all(b.delivered for b in group) else self._produce(group, now)
            # A vector depends only on the text and the model, so the cache may be filled before the
            # batches are durable: do it while Milvus is still writing.
            fresh = {h: v for batch in group for h, v in batch.fresh.items()}
            if self.cache is not None and fresh:
                self.cache.set_many(fresh)
        except BaseException:
            wait([write])  # never leave a write running behind a retry: one writer at a time
            raise
        try:
            if delivery is not None:
                delivery.confirm()
                for batch in group:
                    batch.delivered = True
                metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
        finally:
            metrics.SINK_SECONDS.labels("milvus").observe(write.result())  # raises the write's error
