"""Offsets of finished batches, the commits' rhythm, and who else committed.

An offset is *stored* only once its batch has left the pipeline and only for partitions this
member still owns; what is stored is committed at most every ``interval`` seconds (0: after every
store), and synchronously on revoke and at shutdown. A failed commit leaves the stored offsets in
place, so the next commit carries them. *How* stored offsets become committed (the consumer's
commits, or transactions) is the delivery's (``worker.core.delivery``, which tells the whole order).

This class also keeps, per owned partition, the highest offset this member stored or found
committed: a committed offset past it was committed by another member (``membership_holds``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from schemas.errors import TransientError
from worker.core.delivery import Delivery
from worker.core.records import TopicPartitionKey
from worker.process import metrics

log = logging.getLogger(__name__)


class OffsetCommitter:
    """Stores the next offsets of finished batches and has the delivery commit them (polling thread)."""

    def __init__(self, consumer: Consumer, interval: float, delivery: Delivery,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.delivery = delivery
        delivery.on_committed = self._committed_elsewhere
        self._lock = threading.Lock()
        self.interval = interval
        self._clock = clock
        self._last = clock()
        #: Per owned partition, the highest offset this member stored, or found committed at its
        #: last rebalance: a committed offset beyond it was committed by another member.
        self._known: dict[TopicPartitionKey, int] = {}

    def store(self, offsets: Mapping[TopicPartitionKey, int], owned: Container[TopicPartitionKey]) -> None:
        """Store ``offsets`` (next offset per partition) of a finished batch; partitions not ``owned``
        any more (revoked or lost meanwhile) are skipped: their new owner redoes them."""
        mine = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in owned]
        if not mine:
            return
        self.delivery.store(mine)
        with self._lock:
            for tp in mine:
                key = (tp.topic, tp.partition)
                self._known[key] = max(self._known.get(key, 0), tp.offset)

    def _committed_elsewhere(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        """The delivery committed ``offsets`` itself (exactly-once, from the sink thread)."""
        with self._lock:
            for tp, o in offsets.items():
                self._known[tp] = max(self._known.get(tp, 0), o)

    def barrier(self) -> None:
        """After a revoke published the smaller ownership: a commit under way finishes first."""
        self.delivery.barrier()

    def new_generation(self, owned: Iterable[TopicPartitionKey], timeout: float = 10.0) -> None:
        """A rebalance this member took part in has just assigned it ``owned`` (any assign callback,
        even an empty one): the group says what it owns now. What is committed for those partitions
        now becomes the line past which a commit means a takeover. (Seen on the local Tansu: a woken
        member reported the partition it still believed it owned, the sticky assignor gave it back,
        and the member that had taken it over and committed it further revoked it.)"""
        self.delivery.new_generation(self.consumer)
        owned = set(owned)
        with self._lock:
            self._known = {tp: o for tp, o in self._known.items() if tp in owned}
        if not owned:
            return
        try:
            found = self.consumer.committed([TopicPartition(t, n) for t, n in owned], timeout=timeout)
            log.debug("committed at the assignment: %s", {p.partition: p.offset for p in found})
            for p in found:
                key = (p.topic, p.partition)
                if p.offset >= 0:
                    with self._lock:
                        self._known[key] = max(self._known.get(key, 0), p.offset)
        except KafkaException as exc:
            log.warning("could not read the committed offsets after a rebalance (%s): a later takeover check "
                        "compares with this member's own offsets only", exc)

    def behind(self, ends: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """Of ``ends`` (offsets per partition), those past what this member stored or found committed."""
        return {tp: end for tp, end in ends.items() if end > self._known.get(tp, -1)}

    def forget(self, tps: Iterable[TopicPartitionKey]) -> None:
        """The partitions left this member (revoked or lost): what it stored for them is history."""
        tps = list(tps)
        with self._lock:
            for tp in tps:
                self._known.pop(tp, None)
        self.delivery.forget(tps)

    def refresh_generation(self) -> None:
        """Tell the delivery the group's generation as the consumer knows it now. Safe outside a
        callback under the cooperative and KIP-848 protocols: a partition moves only after its owner
        revoked it, so until this member's revoke it is still this member's in the new generation."""
        self.delivery.new_generation(self.consumer)

    def tick(self) -> None:
        """Commit what is stored if the interval has passed (every call with interval 0); first the
        delivery learns the group's generation, which a rebalance may move on without a callback."""
        self.refresh_generation()
        if self.interval == 0:
            self.commit(sync=True)
        elif self._clock() - self._last >= self.interval:
            self.commit(sync=False)

    def commit(self, sync: bool, attempts: int = 1) -> bool:
        """Commit the stored offsets; True when nothing is left uncommitted. A failure is retried by
        the next call (the stored offsets stay), or here up to ``attempts`` times, 0.5 s apart."""
        self._last = self._clock()
        for attempt in range(attempts):
            t0 = time.perf_counter()
            try:
                done = self.delivery.commit(sync)
                metrics.COMMIT_SECONDS.labels("sync" if sync else "async").observe(time.perf_counter() - t0)
                return done
            except (KafkaException, TransientError) as exc:
                metrics.COMMIT_FAILURES.inc()
                last = attempt == attempts - 1
                log.log(logging.ERROR if last and attempts > 1 else logging.WARNING, "commit failed (%s)%s", exc,
                        "; the next commit retries it" if last else "; retrying")
                if not last:
                    time.sleep(0.5)
        return False

    def membership_holds(self, timeout: float = 10.0) -> bool:
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
                self.delivery.recommit(committed)
            return True
        except (KafkaException, TransientError) as exc:
            log.warning("membership not proven: the group refused a commit (%s)", exc)
            return False
