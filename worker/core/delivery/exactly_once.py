"""Exactly-once: each group one Kafka transaction, its offsets inside it (``connectors.transactions``
says how each kind of Kafka error is met; ``worker.core.delivery`` tells the order)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from connectors.transactions import Transactions
from schemas.errors import TransientError
from worker.core.delivery.base import Attempt, Delivery, Planned, written_offsets
from worker.core.records import Batch, TopicPartitionKey

log = logging.getLogger(__name__)


class ExactlyOnce(Delivery):
    """``EMBEDSTREAM_DELIVERY=exactly-once``: the sink commits each group's records and offsets in
    one transaction; the consumer never commits."""

    def __init__(self, transactions: Transactions, close_timeout_s: float) -> None:
        self.txn = transactions
        self.close_timeout_s = close_timeout_s
        #: The group whose records are in the open transaction while Milvus is retried.
        self._carried: tuple[list[Batch], Planned] | None = None
        #: Per partition, the offset its last transaction committed (written by the sink's thread),
        #: and what the polling thread stored past it, to commit in a transaction of its own.
        self._in_txn: dict[TopicPartitionKey, int] = {}
        self._ahead: dict[TopicPartitionKey, int] = {}
        self._lock = threading.Lock()

    @property
    def producer(self) -> Producer:
        return self.txn.producer

    # -- the sink thread ---------------------------------------------------------------------
    def attempt(self, group: list[Batch]) -> Attempt:
        """The group as one transaction: records, Milvus, then offsets and commit.

        A Milvus outage does not abort it: its records stay in the open transaction and the retry
        writes Milvus alone, then commits (an abort would cost the redo, and a broker without
        aborted-transaction filtering, like Tansu, would show the aborted records), for at most half
        the transaction timeout; any other failure aborts it and the retry redoes the group."""
        attempt = _Attempt(self, group)
        txn = self.txn
        if txn.pending:  # the last attempt's commit timed out: it may still go through, never redo it
            with txn.lock:
                txn.finish_pending()
            self._done(group)
            attempt.finished = True
        elif self._carried is not None and self._carried[0] is group and txn.open:
            attempt.carried = self._carried[1]
        self._carried = None
        return attempt

    def _done(self, group: list[Batch]) -> None:
        for batch in group:
            batch.delivered = True
        self.committed(written_offsets(group))

    def committed(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        """A transaction committed ``offsets`` (next offset per partition): the committer is told."""
        with self._lock:
            for tp, o in offsets.items():
                self._in_txn[tp] = max(self._in_txn.get(tp, -1), o)
        self.on_committed(offsets)

    def close(self) -> None:
        self.txn.close(self.close_timeout_s)

    # -- the polling thread ------------------------------------------------------------------
    def store(self, offsets: list[TopicPartition]) -> None:
        with self._lock:
            self._ahead.update({(tp.topic, tp.partition): tp.offset for tp in offsets
                                if tp.offset > self._in_txn.get((tp.topic, tp.partition), -1)})

    def commit(self, sync: bool) -> bool:
        """What was stored past the transactions' offsets, in a transaction of offsets alone (False, kept for
        the next commit, while a group's transaction is open)."""
        if not self._ahead:
            return True
        ahead = dict(self._ahead)
        if not self.txn.commit_offsets([TopicPartition(t, p, o) for (t, p), o in ahead.items()]):
            return False  # a group's transaction is open: the next commit carries them
        self.committed(ahead)
        with self._lock:
            self._ahead = {tp: o for tp, o in self._ahead.items() if o > ahead.get(tp, -1)}
        return not self._ahead

    def recommit(self, offsets: list[TopicPartition]) -> None:
        # Offsets only ever go through a transaction; while a group's is open, none can prove anything.
        if not self.txn.commit_offsets(offsets):
            raise TransientError("kafka", "a group's transaction is open: the commit that proves the "
                                 "membership waits for it to end")

    def barrier(self) -> None:
        with self.txn.lock:
            pass

    def new_generation(self, consumer: Consumer) -> None:
        # The generation the transactions' offsets are committed under. Asked for here, on the
        # polling thread: from the sink's thread, librdkafka's consumer_group_metadata blocked for
        # good once the consumer had paused its partitions (measured, librdkafka 2.16). Asked at
        # every tick too: on Kafka a member joining gave this one nothing new and called no callback,
        # yet moved the generation on, and every commit under the old one was refused (ILLEGAL_GENERATION)
        # until the next callback, 20 s later.
        metadata = consumer.consumer_group_metadata()
        if metadata != self.txn.group_metadata:  # a value (generation, member id): compared, not identity
            self.txn.group_metadata = metadata

    def forget(self, tps: Iterable[TopicPartitionKey]) -> None:
        with self._lock:
            for tp in tps:
                self._in_txn.pop(tp, None)
                self._ahead.pop(tp, None)


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

    def commit(self, offsets: list[TopicPartition]) -> None:
        self._delivery.txn.commit(offsets)
        log.debug("transaction committed: offsets %s", {tp.partition: tp.offset for tp in offsets})
        self._delivery._done(self._group)

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
