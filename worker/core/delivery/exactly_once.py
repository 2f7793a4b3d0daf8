"""Exactly-once: each group one Kafka transaction, its offsets inside it (``connectors.transactions``
says how each kind of Kafka error is met; ``worker.core.delivery`` tells the order)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from connectors.transactions import Transactions
from schemas.errors import TransientError
from worker.core.delivery.base import Attempt, Delivery, Planned
from worker.core.records import Batch, TopicPartitionKey

log = logging.getLogger(__name__)


class ExactlyOnce(Delivery):
    """``EMBEDSTREAM_DELIVERY=exactly-once``: the sink commits each group's records and offsets in
    one transaction; the consumer never commits (the polling thread's half is
    ``worker.core.ledger.TransactionLedger``, on the same transactions)."""

    def __init__(self, transactions: Transactions, close_timeout_s: float) -> None:
        self.txn = transactions
        self.close_timeout_s = close_timeout_s
        #: The group whose records are in the open transaction while Milvus is retried.
        self._carried: tuple[list[Batch], Planned] | None = None
        #: The group whose commit failed last, its transaction's number and its offsets: its retry asks
        #: the transactions how that one ended (a commit that timed out may have gone through since,
        #: finished by this retry or by the ledger's next transaction of offsets alone).
        self._committing: tuple[list[Batch], int, dict[TopicPartitionKey, int]] | None = None

    @property
    def producer(self) -> Producer:
        return self.txn.producer

    def attempt(self, group: list[Batch]) -> Attempt:
        """The group as one transaction: records, Milvus, then offsets and commit.

        A Milvus outage does not abort it: its records stay in the open transaction and the retry
        writes Milvus alone, then commits (an abort would cost the redo, and a broker without
        aborted-transaction filtering, like Tansu, would show the aborted records), for at most half
        the transaction timeout; any other failure aborts it and the retry redoes the group."""
        attempt = _Attempt(self, group)
        txn = self.txn
        if txn.pending:  # a commit timed out: it may still go through, never redo it
            with txn.lock:
                txn.finish_pending()
        committing, self._committing = self._committing, None
        if committing is not None and committing[0] is group and txn.ended(committing[1]):
            self._done(group)  # this group's commit went through after all: nothing is left to do
            attempt.finished, attempt.committed = True, committing[2]
            return attempt
        if self._carried is not None and self._carried[0] is group and txn.open:
            attempt.carried = self._carried[1]
        self._carried = None
        return attempt

    @staticmethod
    def _done(group: list[Batch]) -> None:
        """The group's transaction committed: its records are out for good."""
        for batch in group:
            batch.delivered = True

    def close(self) -> None:
        self.txn.close(self.close_timeout_s)


class _Attempt(Attempt):
    """Exactly-once: the group's records and offsets in one transaction."""

    durable_when_sent = False  # a read_committed reader sees them at the commit

    def __init__(self, delivery: ExactlyOnce, group: list[Batch]) -> None:
        self._delivery = delivery
        self._group = group
        self._keep_open = False

    def begin(self) -> Producer | None:
        if self.carried is not None:
            return None  # its records are in the transaction still open
        self._delivery.txn.begin()
        return self._delivery.txn.producer

    def sent(self, records: DeliveryBatch) -> None:
        records.confirm()

    def milvus_failed(self, planned: Planned) -> None:
        txn = self._delivery.txn
        self._keep_open = txn.open_for() < txn.keep_open_s
        if self._keep_open:
            self._delivery._carried = (self._group, planned)

    def holding(self):
        return self._delivery.txn.lock  # a revoke waits for this: no offsets of a partition given away commit

    def commit(self, offsets: list[TopicPartition]) -> dict[TopicPartitionKey, int]:
        committed = {(tp.topic, tp.partition): tp.offset for tp in offsets}
        delivery = self._delivery
        try:
            delivery.txn.commit(offsets)
        except BaseException:
            delivery._committing = (self._group, delivery.txn.number, committed)
            raise
        log.debug("transaction committed: offsets %s", {tp.partition: tp.offset for tp in offsets})
        delivery._done(self._group)
        return committed

    def abort(self, exc: BaseException) -> BaseException:
        txn = self._delivery.txn
        if not self._keep_open:
            self._delivery._carried = None
            if not txn.pending and txn.open:
                txn.abort()
                log.warning("transaction aborted (%s): its %d batches are redone", exc, len(self._group))
        if isinstance(exc, KafkaException):  # a produce refused by the transaction's state
            return TransientError("kafka", f"{exc}: the transaction was aborted, its batches are redone")
        return exc
