"""A consumer group's ledger: offsets of finished batches, the commits' rhythm, and who else committed.

An offset is *stored* only once its batch has left the pipeline and only for partitions this
member still owns; what is stored is committed at most every ``interval`` seconds (0: after every
store), and synchronously on revoke and at shutdown. A failed commit leaves the stored offsets in
place, so the next commit carries them. Here the consumer commits them (at-least-once);
:class:`~worker.core.ledger.transactions.TransactionLedger` commits them through transactions.

The ledger also keeps, per owned partition, the highest offset this member stored or found
committed: a committed offset past it was committed by another member (:meth:`OffsetLedger.prove`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from schemas.errors import TransientError
from worker.core.ledger.base import Ledger
from worker.core.records import Batch, TopicPartitionKey, Written

log = logging.getLogger(__name__)


class OffsetLedger(Ledger):
    """``EMBEDSTREAM_DELIVERY=at-least-once`` in a consumer group: offsets stored in the consumer and
    committed by it. ``owned``: the partitions this member owns now (the loop's ``Assignment``)."""

    def __init__(self, consumer: Consumer, interval: float, owned: Container[TopicPartitionKey] = frozenset(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.interval = interval
        self.owned = owned
        self._clock = clock
        self._last = clock()
        self._dirty = False
        #: Per owned partition, the highest offset this member stored, or found committed at its
        #: last rebalance: a committed offset beyond it was committed by another member.
        self._known: dict[TopicPartitionKey, int] = {}

    # -- what the loop calls -------------------------------------------------------------------
    def finished(self, batch: Batch, written: Written) -> int:
        self.store(written.offsets(batch))
        return 0

    def store(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Store ``offsets`` (next offset per partition); partitions not owned any more (revoked or
        lost meanwhile) are skipped: their new owner redoes them."""
        mine = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in self.owned]
        if not mine:
            return
        self._store(mine)
        self._saw({(tp.topic, tp.partition): tp.offset for tp in mine})

    def tick(self) -> None:
        """Commit what is stored if the interval has passed (every call with interval 0); first the
        group's generation is read again, which a rebalance may move on without a callback."""
        self.refresh()
        if self.interval == 0:
            self.flush(sync=True)
        elif self._clock() - self._last >= self.interval:
            self.flush(sync=False)

    def flush(self, sync: bool, attempts: int = 1) -> bool:
        self._last = self._clock()
        return super().flush(sync, attempts)

    def assigned(self, owned: Iterable[TopicPartitionKey], timeout: float = 10.0) -> None:
        """A rebalance this member took part in has just assigned it ``owned`` (any assign callback,
        even an empty one): the group says what it owns now. What is committed for those partitions
        now becomes the line past which a commit means a takeover. (Seen on the local Tansu: a woken
        member reported the partition it still believed it owned, the sticky assignor gave it back,
        and the member that had taken it over and committed it further revoked it.)"""
        self.refresh()
        owned = set(owned)
        self._known = {tp: o for tp, o in self._known.items() if tp in owned}
        if not owned:
            return
        try:
            found = self.consumer.committed([TopicPartition(t, n) for t, n in owned], timeout=timeout)
            log.debug("committed at the assignment: %s", {p.partition: p.offset for p in found})
            self._saw({(p.topic, p.partition): p.offset for p in found if p.offset >= 0})
        except KafkaException as exc:
            log.warning("could not read the committed offsets after a rebalance (%s): a later takeover check "
                        "compares with this member's own offsets only", exc)

    def revoked(self, tps: Iterable[TopicPartitionKey]) -> None:
        """The partitions left this member (revoked or lost), and the smaller ownership is published:
        a commit under way finishes first, then what was stored for them is history."""
        tps = list(tps)
        self._barrier()
        for tp in tps:
            self._known.pop(tp, None)
        self._forget(tps)

    def behind(self, ends: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """Of ``ends`` (offsets per partition), those past what this member stored or found committed."""
        return {tp: end for tp, end in ends.items() if end > self._known.get(tp, -1)}

    def prove(self, timeout: float = 10.0) -> bool:
        """Prove, after a stall, that this member still owns its partitions: nobody else committed
        for them meanwhile, and the group accepts a commit from it.

        1. The offsets committed for its partitions are read; one beyond the highest this member
           ever stored for that partition was committed by the member that took it over.
        2. Those committed offsets are committed again, synchronously: Kafka's coordinator refuses a
           commit from an evicted member or an old generation, or during a rebalance. Re-committing
           the committed values moves nothing.

        The first check is what holds on a broker that accepts any commit (the local Tansu accepted
        the woken member's while another member owned and committed the partition). False on any
        sign of a loss, a refusal or an error; True when nothing is assigned or committed."""
        try:
            parts = self.consumer.assignment()
            if not parts:
                return True
            committed = [TopicPartition(p.topic, p.partition, p.offset)
                         for p in self.consumer.committed(parts, timeout=timeout) if p.offset >= 0]
            taken = [(p.partition, p.offset) for p in committed
                     if p.offset > self._known.get((p.topic, p.partition), p.offset)]
            if taken:
                log.warning("membership not proven: other members committed %s past this member's offsets "
                            "(the partitions were taken over)", ", ".join(f"{p}@{o}" for p, o in taken))
                return False
            if committed:
                self._recommit(committed)
            return True
        except (KafkaException, TransientError) as exc:
            log.warning("membership not proven: the group refused a commit (%s)", exc)
            return False

    def refresh(self) -> None:
        """The group's generation as the consumer knows it now, for commits made with it (safe outside
        a callback under the cooperative and KIP-848 protocols: a partition moves only after its owner
        revoked it, so until this member's revoke it is still this member's in the new generation)."""
        return None  # the consumer's own commits carry it

    def _saw(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        """``offsets`` are committed, or about to be, by this member (or were found committed)."""
        for tp, o in offsets.items():
            self._known[tp] = max(self._known.get(tp, 0), o)

    # -- how the offsets become committed: the consumer's commits ---------------------------------
    def _store(self, offsets: list[TopicPartition]) -> None:
        self.consumer.store_offsets(offsets=offsets)
        self._dirty = True

    def _send(self, sync: bool) -> bool:
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

    def _recommit(self, offsets: list[TopicPartition]) -> None:
        """Commit ``offsets`` (committed already) again, synchronously: raises on a refusal."""
        self.consumer.commit(offsets=offsets, asynchronous=False)

    def _barrier(self) -> None:
        return None  # the consumer commits on this thread: nothing can be under way

    def _forget(self, tps: list[TopicPartitionKey]) -> None:
        return None  # the consumer forgets them itself
