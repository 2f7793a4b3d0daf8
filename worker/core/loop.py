"""The polling loop: the cycle that drives the chain, on the consumer's thread.

Each turn: consume what is there → intake (validate, estimate, batch) → submit closed batches to
the pipeline → collect finished ones and store their offsets → pause or resume → commit if due →
check for idle. The parts each own one thing: ``Intake`` the batching, ``Pipeline`` the stages,
``OffsetLedger`` what is committed and when, ``Assignment`` the partitions with their pause and
end state, ``RunStats`` the counting. The chain is assembled in ``worker.assembly.chain.build_chain``.

Rebalance call-backs (``worker.core.rebalance``) and signal handlers run on this thread too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer

from worker.core.assignment import Assignment
from worker.core.ledger import OffsetLedger
from worker.core.member import Chain, Member
from worker.core.rebalance import Rebalance
from worker.core.stats import RunStats
from worker.process.metrics import Health

log = logging.getLogger(__name__)


#: Records taken from the consumer per call when some are at hand (at least a batch's worth; never
#: more than the batches still allowed in flight hold: ``Worker._chunk``).
CONSUME_CHUNK = 500


class Worker(Member):
    """One consumer-group member (the skeleton is ``Member.run``); what is its own: the assignment,
    the rebalance call-backs, pausing a full pipeline, and the ends past commit markers."""

    ledger: OffsetLedger

    def __init__(self, consumer: Consumer, topic: str, chain: Chain, ledger: OffsetLedger, assignment: Assignment,
                 *, max_inflight: int, shutdown_grace: float, health: Health, backoff_max: float = 10.0,
                 on_progress: Callable[[RunStats], None] | None = None, stats: RunStats | None = None) -> None:
        super().__init__(consumer, topic, chain, ledger, shutdown_grace=shutdown_grace, health=health,
                         backoff_max=backoff_max, on_progress=on_progress, stats=stats)
        self.assignment = assignment
        ledger.owned = assignment  # offsets are stored only for partitions owned when their batch finishes
        self.max_inflight = max_inflight
        #: The group's rebalance call-backs (``worker.core.rebalance``), on this thread.
        self.rebalance = Rebalance(chain, ledger, assignment, health, grace=shutdown_grace,
                                   finish_inflight=self._wait_inflight, drop_held=self.held.drop)
        #: Leave the group before closing (``leave_group``); off for a static member, which keeps its
        #: partitions until its session expires, so that a restart takes them back without a rebalance.
        self.leave_before_close = True

    # -- the skeleton's parts ------------------------------------------------------------------
    def _join(self) -> None:
        rebalance = self.rebalance
        self.consumer.subscribe([self.topic], on_assign=rebalance.on_assign, on_revoke=rebalance.on_revoke,
                                on_lost=rebalance.on_lost)
        log.info("joining the group on %s: waiting for partitions", self.topic)

    def _leave(self) -> None:
        if self.leave_before_close:
            leave_group(self.consumer)
        self.consumer.close()

    def _turn(self, stop_when_idle: float | None) -> bool:
        """One turn of the loop (the module doc); True when the input has been idle ``stop_when_idle``
        seconds (then the loop stops)."""
        chain = self.chain
        self.health.tick()
        chain.fence.tick(self._membership_proven)
        # A full pipeline holds off consuming for ``pause_after`` before it pauses: pausing drops what
        # librdkafka prefetched, and after a resume the first record came back only 0.7-0.8 s later
        # (measured on Tansu). Holding serves no callbacks meanwhile.
        waiting = chain.pipeline.inflight >= self.max_inflight or bool(self.held)  # full: consume no more
        holding = waiting and not self.assignment.paused
        self._take(self.assignment.records([] if holding else self._consume()))
        # A batch past its deadline closes only when the model is free: until then it keeps growing
        # instead of queueing as many small batches (continuous batching).
        if chain.model_free():
            chain.intake.poll()
        self._collect(0.02 if holding else 0.0)
        self.assignment.update_pause(self.consumer, waiting)
        quiet = not len(chain.intake) and not chain.pipeline.inflight and not self.held
        if quiet:
            self._step_past_markers()
        self.idle_trim.tick(quiet)
        self.ledger.tick()
        if stop_when_idle is not None and self.assignment.idle_for(stop_when_idle, quiet,
                                                                   self.health.last_kafka_error):
            log.info("idle for %.1fs: stopping", stop_when_idle)
            return True
        return False

    def _hold_input(self) -> None:
        if len(self.assignment):
            self.consumer.pause(self.consumer.assignment())

    def _stopped(self) -> None:
        if len(self.assignment):
            log_committed(self.consumer)

    # -- its own -------------------------------------------------------------------------------
    def _membership_proven(self) -> bool:
        """After a stall: the proof ``worker.core.fence`` asks for before writes resume (same member id,
        no takeover commit, a commit the group accepts)."""
        return self.assignment.same_member(self.consumer) and self.ledger.prove()

    def _step_past_markers(self) -> None:
        """With nothing batching, held or in flight, a partition at its end is done up to that end.
        A transactional producer's input ends in a commit marker that the consumer never hands out,
        so the offset after the last record stays one short of the end, and lag (KEDA's included)
        reads 1 on a drained partition forever: store the end itself. Never while the fence is
        closed (what this member owns is in doubt)."""
        if self.chain.fence.suspect:
            return
        ahead = self.ledger.behind(self.assignment.ends_reached())
        if ahead:
            self.ledger.store(ahead)

    def _consume(self) -> list:
        """What the consumer holds now, else wait briefly for the first record.

        ``consume(n, timeout)`` blocks until it has ``n`` records *or* the timeout passes, so asking
        for a chunk with a timeout stalls the loop whenever fewer records are at hand. Take what is
        there without waiting; only when nothing is, wait for one record."""
        msgs = self.consumer.consume(self._chunk(), 0)
        if msgs:
            return msgs
        busy = len(self.chain.intake) or self.chain.pipeline.inflight
        return self.consumer.consume(1, 0.02 if busy else 0.2)

    def _chunk(self) -> int:
        """Records to take in one call: a batch's worth or ``CONSUME_CHUNK``, whichever is more, but
        no more than the in-flight batches still allowed hold with what is batching (a large chunk
        would otherwise queue batches past the limit, each record held the longer)."""
        max_size = self.chain.intake.batcher.max_size
        room = (self.max_inflight - self.chain.pipeline.inflight) * max_size - len(self.chain.intake)
        return max(1, min(max(CONSUME_CHUNK, max_size), room))


#: Longest the stop serves the group's last call-backs before it closes the consumer anyway.
LEAVE_BUDGET_S = 10.0


def leave_group(consumer: Consumer, budget_s: float = LEAVE_BUDGET_S) -> None:
    """Unsubscribe and serve the call-backs that follow here, until nothing is assigned, before
    ``close()``. librdkafka hangs for good when an incremental assignment reaches a consumer while it
    closes (confluentinc/librdkafka#4527; seen here: a member given another's partitions as both
    stopped, stuck in ``close()`` inside the assign); an assignment served by ``poll`` is harmless.
    Records ``poll`` returns meanwhile are left unprocessed and uncommitted (their next owner reads
    them); any failure leaves the rest to ``close()``."""
    try:
        consumer.unsubscribe()
        deadline = time.monotonic() + budget_s
        while consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
    except Exception as exc:  # a consumer already failed: close() does what it can
        log.debug("leaving the group before closing: %s", exc)


def log_committed(consumer: Consumer) -> None:
    """Say what the group has committed for ``consumer``'s partitions (at a graceful stop)."""
    committed = consumer.committed(consumer.assignment(), timeout=10)
    # A partition the group never committed reads back as OFFSET_INVALID (-1001): not an offset.
    done = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    never = sorted(tp.partition for tp in committed if tp.offset < 0)
    log.info("shutdown: committed %s%s", done or "nothing", f"; nothing yet for partitions {never}" if never else "")
