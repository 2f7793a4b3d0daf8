"""A consumer group's ledger under exactly-once: every offset goes through a transaction.

The sink commits each group's offsets in the group's own transaction (``worker.core.delivery.exactly_once``);
those reach the ledger with the batch (``Written.committed``), as the batch leaves the pipeline. What the
polling thread stores past them (a drained partition's end past a commit marker) is committed here
by a transaction of offsets alone; the consumer never commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container

from confluent_kafka import Consumer, TopicPartition

from connectors.transactions import Transactions
from schemas.errors import TransientError
from worker.core.ledger.offsets import OffsetLedger
from worker.core.records import Batch, TopicPartitionKey, Written


class TransactionLedger(OffsetLedger):
    """``EMBEDSTREAM_DELIVERY=exactly-once``: offsets committed through ``transactions`` (the sink's)."""

    def __init__(self, consumer: Consumer, interval: float, transactions: Transactions,
                 owned: Container[TopicPartitionKey] = frozenset(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(consumer, interval, owned, clock)
        self.txn = transactions
        #: Per partition, the offset its last transaction committed, and what was stored past it, to
        #: commit in a transaction of its own.
        self._in_txn: dict[TopicPartitionKey, int] = {}
        self._ahead: dict[TopicPartitionKey, int] = {}

    def finished(self, batch: Batch, written: Written) -> int:
        self.committed(written.committed)  # before its offsets are stored: those are no longer ahead
        return super().finished(batch, written)

    def committed(self, offsets: dict[TopicPartitionKey, int]) -> None:
        """A transaction committed ``offsets`` (next offset per partition)."""
        for tp, o in offsets.items():
            self._in_txn[tp] = max(self._in_txn.get(tp, -1), o)
        self._saw(offsets)

    def refresh(self) -> None:
        # The generation the transactions' offsets are committed under. Asked for here, on the
        # polling thread: from the sink's thread, librdkafka's consumer_group_metadata blocked for
        # good once the consumer had paused its partitions (measured, librdkafka 2.16). Asked at
        # every tick too: on Kafka a member joining gave this one nothing new and called no callback,
        # yet moved the generation on, and every commit under the old one was refused (ILLEGAL_GENERATION)
        # until the next callback, 20 s later.
        metadata = self.consumer.consumer_group_metadata()
        if metadata != self.txn.group_metadata:  # a value (generation, member id): compared, not identity
            self.txn.group_metadata = metadata

    def _store(self, offsets: list[TopicPartition]) -> None:
        self._ahead.update({(tp.topic, tp.partition): tp.offset for tp in offsets
                            if tp.offset > self._in_txn.get((tp.topic, tp.partition), -1)})

    def _send(self, sync: bool) -> bool:
        """What was stored past the transactions' offsets, in a transaction of offsets alone (False,
        kept for the next commit, while a group's transaction is open)."""
        if not self._ahead:
            return True
        ahead = dict(self._ahead)
        if not self.txn.commit_offsets([TopicPartition(t, p, o) for (t, p), o in ahead.items()]):
            return False  # a group's transaction is open: the next commit carries them
        self.committed(ahead)
        self._ahead = {tp: o for tp, o in self._ahead.items() if o > ahead.get(tp, -1)}
        return not self._ahead

    def _recommit(self, offsets: list[TopicPartition]) -> None:
        # Offsets only ever go through a transaction; while a group's is open, none can prove anything.
        if not self.txn.commit_offsets(offsets):
            raise TransientError("kafka", "a group's transaction is open: the commit that proves the "
                                 "membership waits for it to end")

    def _barrier(self) -> None:
        # Exactly-once: a transaction that checked the ownership before it shrank finishes now; any
        # later one sees the smaller ownership and leaves these partitions out (worker.steps.writing.sink).
        with self.txn.lock:
            pass

    def _forget(self, tps: list[TopicPartitionKey]) -> None:
        for tp in tps:
            self._in_txn.pop(tp, None)
            self._ahead.pop(tp, None)
