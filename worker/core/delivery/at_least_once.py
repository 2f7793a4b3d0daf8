"""At-least-once: the idempotent producer; the offsets are the polling thread's ledger's
(``worker.core.ledger.OffsetLedger``, or a share group's acknowledgements)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from schemas.errors import TransientError
from worker.core.delivery.base import Attempt, Delivery
from worker.core.records import Batch, TopicPartitionKey

log = logging.getLogger(__name__)


class AtLeastOnce(Delivery):
    """``EMBEDSTREAM_DELIVERY=at-least-once`` (``worker.core.delivery`` tells the order)."""

    def __init__(self, new_producer: Callable[[], Producer], timeout_s: float) -> None:
        self._new_producer = new_producer
        self.timeout_s = timeout_s
        self._producer = new_producer()

    @property
    def producer(self) -> Producer:
        return self._producer

    def attempt(self, group: list[Batch]) -> Attempt:
        return _Attempt(self, group)

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


class _Attempt(Attempt):
    """At-least-once: the records are durable once acknowledged; the offsets are the polling
    thread's to commit once the group leaves the pipeline."""

    def __init__(self, delivery: AtLeastOnce, group: list[Batch]) -> None:
        self._delivery = delivery
        self._group = group

    def begin(self) -> Producer | None:
        # Records acknowledged by an earlier attempt (which then failed on Milvus) are not produced
        # again: an outage would otherwise repeat the group's output at every retry.
        return None if all(b.delivered for b in self._group) else self._delivery.producer

    def sent(self, records: DeliveryBatch) -> None:
        try:
            records.confirm()
        except TransientError:
            if records.broken:
                self._delivery._replace_producer()
            raise
        for batch in self._group:
            batch.delivered = True

    def commit(self, offsets: list[TopicPartition]) -> dict[TopicPartitionKey, int]:
        return {}  # stored and committed by the polling thread's ledger (worker.core.ledger)
