"""What one member does when the group moves partitions: the consumer's rebalance call-backs.

They run inside ``consume()``, on the polling thread. On assign the ledger and the fence learn the
new partitions; on revoke the batches in flight are finished (within a budget) and committed
synchronously before the partitions go; on *lost* nothing is committed for them (another member may
own them already). Either way what is still batching for them is dropped, to be read again by their
next owner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, TopicPartition

from worker.core.assignment import Assignment
from worker.core.ledger import OffsetLedger
from worker.core.member import Chain
from worker.core.records import TopicPartitionKey
from worker.process.metrics import ASSIGNED_PARTITIONS, REBALANCES, Health, forget_lag
from worker.process.startup import StartClock

log = logging.getLogger(__name__)

#: Longest a revoke waits for the batches in flight (the rebalance waits for it) before it commits
#: what finished.
REVOKE_BUDGET_S = 20.0


class Rebalance:
    """The call-backs ``subscribe`` takes, for the loop's chain (``worker.core.member.Chain``).
    ``finish_inflight(seconds)`` collects finished batches until none is in flight or the time is up;
    ``drop_held(partitions)`` forgets the records the loop holds back for them."""

    def __init__(self, chain: Chain, ledger: OffsetLedger, assignment: Assignment, health: Health, *, grace: float,
                 finish_inflight: Callable[[float], bool],
                 drop_held: Callable[[Iterable[TopicPartitionKey]], None]) -> None:
        self.chain = chain
        self.ledger = ledger
        self.assignment = assignment
        self.health = health
        self.grace = grace
        self._finish_inflight = finish_inflight
        self._drop_held = drop_held
        #: Read out once, at the first assignment (``worker.process.startup``); None: not timed.
        self.startup: StartClock | None = None

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assignment.add(consumer, partitions)
        # Inside close() (another member left at the same time) the read of the committed offsets
        # times out after 10 s on Tansu. Skipping it there once left close() hung for over a minute
        # in a zombie scenario (in librdkafka, after the revoke): it stays, a known 10 s.
        self.ledger.assigned(self.assignment.partitions)
        self.chain.fence.publish(self.assignment.partitions)
        self._owned(len(self.assignment), "assigned")
        log.info("assigned %s", sorted(p.partition for p in partitions))
        if self.startup is not None and partitions:
            self.startup.mark("the rest, and joining the group")
            log.info("%s", self.startup.account())
            self.startup = None

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Finish what is in flight (within a budget) and commit it before the partitions go. After a
        stall (the fence is closed) nothing in flight can be written: give them up at once."""
        # The in-flight transactions commit under the generation that revokes (the one they began
        # under is refused now): without this they failed until the budget ran out, 20 s a revoke.
        self.ledger.refresh()
        if not self.chain.fence.suspect:
            self._finish_inflight(min(self.grace, REVOKE_BUDGET_S))
        self.ledger.flush(sync=True)
        dropped = self._forget(partitions, lost=False)
        REBALANCES.labels("revoked").inc()
        log.info("revoked %s (dropped %d uncommitted records still batching)",
                 sorted(p.partition for p in partitions), dropped)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Another member may own them already: commit nothing for them."""
        self._forget(partitions, lost=True)
        REBALANCES.labels("lost").inc()
        log.warning("lost %s: committing nothing for them", sorted(p.partition for p in partitions))

    def _forget(self, partitions: list[TopicPartition], lost: bool) -> int:
        """Drop what is batching for ``partitions`` and stop owning them; returns the entries dropped."""
        tps = {(p.topic, p.partition) for p in partitions}
        dropped = self.chain.intake.drop(tps)
        self._drop_held(tps)
        for topic in {t for t, _ in tps}:
            forget_lag(topic, [p for t, p in tps if t == topic])
        self.assignment.remove(tps, lost=lost)
        self.chain.fence.publish(self.assignment.partitions)
        self.ledger.revoked(tps)  # after the smaller ownership is published (exactly-once: TransactionLedger)
        self._owned(len(self.assignment))
        return dropped

    def _owned(self, count: int, event: str | None = None) -> None:
        """How many partitions this member owns now, for /readyz and the gauge; ``event``: the
        rebalance event that made it so, counted."""
        self.health.assigned = count
        ASSIGNED_PARTITIONS.set(count)
        if event is not None:
            REBALANCES.labels(event).inc()
