"""At-least-once: the idempotent producer, and offsets stored in the consumer and committed by it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import wait

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from schemas.errors import TransientError
from worker.core.delivery.base import Delivery, GroupWriter
from worker.core.records import Batch
from worker.process import metrics

log = logging.getLogger(__name__)


class AtLeastOnce(Delivery):
    """``EMBEDSTREAM_DELIVERY=at-least-once`` (``worker.core.delivery`` tells the order)."""

    def __init__(self, consumer: Consumer, new_producer: Callable[[], Producer], timeout_s: float) -> None:
        self.consumer = consumer
        self._new_producer = new_producer
        self.timeout_s = timeout_s
        self._producer = new_producer()
        self._dirty = False

    @property
    def producer(self) -> Producer:
        return self._producer

    def write(self, group: list[Batch], writer: GroupWriter) -> None:
        planned = writer.plan(group)
        # Milvus writes on a helper thread while this one encodes and hands the records to the
        # producer (librdkafka sends them meanwhile): the server works while Python does. Both
        # must be confirmed before the batches count as done; the order between them does not matter.
        write = writer.write_milvus(planned)
        t0 = time.perf_counter()
        try:
            # Records acknowledged by an earlier attempt (which then failed on Milvus) are not
            # produced again: an outage would otherwise repeat the group's output at every retry.
            delivery = None if all(b.delivered for b in group) else writer.produce(planned, self._producer)
        except BaseException:
            wait([write])  # never leave a write running behind a retry: one writer at a time
            raise
        try:
            if delivery is not None:
                try:
                    delivery.confirm()
                except TransientError:
                    if delivery.broken:
                        self._replace_producer()
                    raise
                for batch in group:
                    batch.delivered = True
                metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
        finally:
            metrics.SINK_SECONDS.labels("milvus").observe(write.result())  # raises the write's error
        writer.written(planned)

    def _replace_producer(self) -> None:
        """Drop a producer that can deliver nothing more (``DeliveryBatch.broken``) for a new one; what
        the old one still held is purged (the group is retried whole)."""
        log.warning("the producer was fenced or failed fatally: replacing it before the retry")
        old, self._producer = self._producer, self._new_producer()
        old.purge()
        old.flush(0)

    def close(self) -> None:
        # close() flushes without a time limit: only call it once nothing is left to deliver.
        if self._producer.flush(self.timeout_s) == 0:
            self._producer.close()

    def store(self, offsets: list[TopicPartition]) -> None:
        self.consumer.store_offsets(offsets=offsets)
        self._dirty = True

    def commit(self, sync: bool) -> bool:
        if not self._dirty:
            return True
        try:
            if sync:
                self.consumer.commit(asynchronous=False)
            else:
                self.consumer.commit(asynchronous=True)
        except KafkaException as exc:
            if not (exc.args and exc.args[0].code() == KafkaError._NO_OFFSET):
                raise
        self._dirty = False
        return True

    def recommit(self, offsets: list[TopicPartition]) -> None:
        self.consumer.commit(offsets=offsets, asynchronous=False)
