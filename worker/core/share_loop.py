"""The polling loop of a share-group member (``EMBEDSTREAM_GROUP_TYPE=share``, KIP-932).

A share group has no partition assignment of the kind a consumer group has: the broker hands each
member records of any partition, locked to it for a while (``share.record.lock.duration.ms``), and
counts their deliveries. So there are no rebalances, no offsets and no pausing here; the chain is the
same (intake, the pipeline's stages, the sink), and the input is acknowledged record by record
(``worker.core.ledger.share``).

Each turn: when every record of the last poll is acknowledged (the share consumer polls again only
then), poll the next records (at most ``max.poll.records``: the in-flight bound), take them into
intake and close their batches at once (nothing more can arrive before they are acknowledged, so a
batch's deadline would only wait); collect finished batches and acknowledge their records; send the
acknowledgements. A record delivered more than ``EMBEDSTREAM_SHARE_MAX_DELIVERIES`` times becomes a
dead letter in intake (``delivery_count_exceeded``), acknowledged once the DLQ has it.

Ordering is not kept across a share group (two versions of a document may be embedded by two
workers at once): Milvus ends at the newest version by the version guard
(``worker.steps.writing.versions``), and each output record names the input offset it came from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from connectors.kafka import access_refused
from worker.core.ledger import ShareLedger
from worker.core.member import Chain, Member
from worker.core.records import Batch, TopicPartitionKey, Written
from worker.core.stats import RunStats
from worker.process.metrics import (
    ASSIGNED_PARTITIONS,
    SHARE_ACK_SECONDS,
    SHARE_LOCK_EXPIRIES,
    SHARE_REDELIVERIES,
    Health,
)
from worker.process.startup import StartClock

log = logging.getLogger(__name__)


def lock_margin(lock_s: float | None) -> float | None:
    """How long a poll's records stay this member's to write: their lock, less a margin (the broker
    started it when it acquired them, before they arrived here): a fifth of it, at most a second."""
    return None if lock_s is None else lock_s - min(1.0, lock_s / 5)


class ShareWorker(Member):
    """One share-group member (the skeleton is ``Member.run``); what is its own: the poll gate (the
    next poll only once every record of the last is acknowledged), the partitions it learns of, and
    the records' lock. ``partitions``: the input topic's, every one of which this member may be handed
    records of."""

    ledger: ShareLedger
    UNFINISHED = "their records go back to the share group"

    def __init__(self, consumer, topic: str, chain: Chain, ledger: ShareLedger, partitions: list[TopicPartitionKey],
                 *, shutdown_grace: float, health: Health, backoff_max: float = 10.0,
                 on_progress: Callable[[RunStats], None] | None = None, stats: RunStats | None = None) -> None:
        super().__init__(consumer, topic, chain, ledger, shutdown_grace=shutdown_grace, health=health,
                         backoff_max=backoff_max, on_progress=on_progress, stats=stats)
        self.partitions = partitions
        #: Read out at the first poll (``worker.process.startup``); None: not timed.
        self.startup: StartClock | None = None
        #: Records polled and not yet acknowledged (the next poll waits for 0).
        self.outstanding = 0
        #: How long the broker locks a record to this member (None: not known); a poll whose records
        #: take more than half of it to acknowledge is said (``_acknowledged``).
        self.lock_s: float | None = None
        self._polled_at = 0.0
        self._said_at = float("-inf")
        self._quiet_since = time.monotonic()

    # -- the skeleton's parts ------------------------------------------------------------------
    def _join(self) -> None:
        self.consumer.subscribe([self.topic])
        self.chain.fence.publish(self.partitions)  # any partition's records may be handed to this member
        log.info("joining the share group on %s", self.topic)
        self._quiet_since = time.monotonic()

    def _turn(self, stop_when_idle: float | None) -> bool:
        """One turn (the module doc); True when nothing has arrived for ``stop_when_idle`` seconds with
        nothing left in flight."""
        chain = self.chain
        self.health.tick()
        chain.fence.tick(lambda: True)  # no partition is ever taken from a share member
        got = self._poll() if not self.outstanding else self._take([])
        chain.intake.flush()  # nothing more arrives before these are acknowledged
        self._collect(0.05 if self.outstanding else 0.0)
        quiet = not self.outstanding and not got
        self._quiet_since = self._quiet_since if quiet else time.monotonic()
        self.idle_trim.tick(quiet)
        self.ledger.tick()
        if stop_when_idle is not None and quiet and time.monotonic() - self._quiet_since >= stop_when_idle:
            log.info("idle for %.1fs: stopping", stop_when_idle)
            return True
        return False

    def _finished(self, batch: Batch, written: Written) -> None:
        released = self.ledger.finished(batch, written)
        # every record outstanding came with the last poll (the next waits until all are acknowledged)
        held = time.monotonic() - self._polled_at
        SHARE_ACK_SECONDS.observe_many([held] * len(batch.entries))
        if self.lock_s is not None and held > self.lock_s:
            SHARE_LOCK_EXPIRIES.inc(len(batch.entries))
        if released:
            log.warning("%d records left unwritten after a stall: released for another delivery", released)
        self.outstanding -= len(batch.entries)

    def _collected(self) -> None:
        self.ledger.flush(sync=False)
        if not self.outstanding:
            self._acknowledged(time.monotonic() - self._polled_at)

    # -- its own -------------------------------------------------------------------------------
    def _poll(self) -> int:
        """Poll the next records (the acknowledgements made so far go with the poll); how many came."""
        msgs = self.consumer.poll(0.2)
        if self.startup is not None:
            self.startup.mark("the rest, and joining the share group")
            log.info("%s", self.startup.account())
            self.startup = None
        if not self.health.assigned:
            self.health.assigned = len(self.partitions)
            ASSIGNED_PARTITIONS.set(len(self.partitions))
        self._polled_at = time.monotonic()
        good = []
        for m in msgs:
            if m.error() is not None:
                denied = access_refused(m.error(), "reading its input (Read on the input topic and on the share group)")
                if denied is not None:
                    raise denied
                log.warning("share consumer: %s", m.error())
            else:
                good.append(m)
        self._know_partitions(good)
        if good:
            self.chain.fence.lock(lock_margin(self.lock_s))
        again = sum(1 for m in good if (m.delivery_count() or 1) > 1)
        if again:
            SHARE_REDELIVERIES.inc(again)
        self.outstanding += len(good)
        return self._take(good)

    def _know_partitions(self, msgs: list) -> None:
        """Records of a partition added to the topic since this member started (no rebalance tells a
        share member of one): its records are this member's to write like any other's, so the fence
        is told before they are taken (else it would leave them unwritten, released again and again
        until the broker archives them)."""
        new = {(m.topic(), m.partition()) for m in msgs} - set(self.partitions)
        if not new:
            return
        self.partitions = sorted({*self.partitions, *new})
        self.chain.fence.publish(self.partitions)
        self.health.assigned = len(self.partitions)
        ASSIGNED_PARTITIONS.set(len(self.partitions))
        log.info("records of partitions %s too (added to %s since this member started)",
                 sorted(p for _, p in new), self.topic)

    def _acknowledged(self, took: float) -> None:
        """A poll's records are all acknowledged, ``took`` seconds after it: past half their lock, a
        slower one would lose its locks (its records delivered again, and dead-lettered after
        EMBEDSTREAM_SHARE_MAX_DELIVERIES): say what to change, at most once a minute."""
        now = time.monotonic()
        if self.lock_s is None or took <= self.lock_s / 2 or now - self._said_at < 60:
            return
        self._said_at = now
        log.warning("a poll's records took %.1fs to acknowledge, over half their %.1fs lock: poll fewer at a time "
                    "(EMBEDSTREAM_MAX_INFLIGHT_BATCHES x EMBEDSTREAM_MAX_BATCH_SIZE records a poll) or lock them "
                    "longer (the group's share.record.lock.duration.ms)", took, self.lock_s)
