"""What every group member's loop holds, a consumer group's (``worker.core.loop.Worker``) or a share
group's (``worker.core.share_loop.ShareWorker``): the chain of steps it drives, the records it holds
back while the schema registry is out, its stop, its counters and its idle trim."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.errors import TransientError
from worker.core.fence import Fence
from worker.core.offsets import OffsetCommitter
from worker.core.pipeline import Pipeline
from worker.core.records import TopicPartitionKey
from worker.core.stats import RunStats
from worker.process.heap import IdleTrim
from worker.process.metrics import Health
from worker.process.signals import GracefulStop

log = logging.getLogger(__name__)


class Intake(Protocol):
    """What the loop asks of the polling thread's steps (``worker.steps.polling.intake.Intake``)."""

    batcher: Any

    def add(self, messages: list) -> None: ...
    def poll(self) -> None: ...
    def flush(self) -> None: ...
    def drop(self, partitions: Iterable[TopicPartitionKey]) -> int: ...
    def __len__(self) -> int: ...


@dataclass
class Chain:
    """The assembled steps the loop drives (``worker.assembly.chain.build_chain``)."""

    intake: Intake
    pipeline: Pipeline
    committer: OffsetCommitter
    #: Whether this member may still write for a partition (ticked by the loop, read by the sink).
    fence: Fence
    #: True when the model has nothing waiting: the loop closes a batch by its deadline only then.
    model_free: Callable[[], bool]

#: Longest a stop waits, after giving up on unfinished batches, for a stage to leave its step.
ABORT_WAIT_S = 30.0


class Held:
    """Consumed records intake could not take yet because the schema registry did not answer: kept
    in consumption order and offered again with capped exponential backoff. Nothing after them is
    consumed meanwhile (the loop holds, then pauses), so none is skipped and none is committed."""

    def __init__(self, backoff_max: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff_max = backoff_max
        self._clock = clock
        self.msgs: list = []
        self._delay = 0.0
        self._retry_at = 0.0

    def __bool__(self) -> bool:
        return bool(self.msgs)

    def hold(self, msgs: list, exc: TransientError) -> None:
        self._delay = min(max(2 * self._delay, 0.5), self.backoff_max)
        self._retry_at = self._clock() + self._delay
        self.msgs = msgs
        log.warning("%s: holding %d records, retrying in %.1fs", exc, len(msgs), self._delay)

    def take(self, more: list) -> list:
        """The held records (when their retry is due) followed by ``more``; [] while not due (then
        ``more`` joins the held ones)."""
        if not self.msgs:
            return more
        if self._clock() < self._retry_at:
            self.msgs.extend(more)
            return []
        msgs, self.msgs = self.msgs + more, []
        return msgs

    def taken(self) -> None:
        """Intake took them: the outage is over."""
        if self._delay:
            log.info("schema registry answers again")
        self._delay = 0.0

    def drop(self, tps: Iterable[TopicPartitionKey]) -> None:
        tps = set(tps)
        self.msgs = [m for m in self.msgs if (m.topic(), m.partition()) not in tps]


class Member:
    """What a group member's loop holds, a consumer group's (:class:`Worker`) or a share group's
    (``worker.core.share_loop.ShareWorker``): its consumer and chain, its stop, its counters, the
    records it holds back, its idle trim and where it serves its metrics."""

    def __init__(self, consumer, topic: str, chain: Chain, *, shutdown_grace: float, health: Health,
                 backoff_max: float = 10.0, on_progress: Callable[[RunStats], None] | None = None,
                 stats: RunStats | None = None) -> None:
        self.consumer = consumer
        self.topic = topic
        self.chain = chain
        self.shutdown_grace = shutdown_grace
        self.health = health
        self.on_progress = on_progress
        #: The run's counters (``stats``: a caller's own, e.g. one that also reads a CPU clock).
        self.stats = stats if stats is not None else RunStats()
        #: Set by SIGTERM/SIGINT once ``stop.install()`` ran (the command does; tests stop it by hand).
        self.stop = GracefulStop()
        self.held = Held(backoff_max)
        #: Hands the heap's free pages back once the input has been quiet a while (``worker.process.heap``).
        self.idle_trim = IdleTrim()
        #: Where /metrics, /healthz and /readyz are served (None: not served).
        self.metrics_port: int | None = None
        #: Leave the group before closing (``leave_group``); off for a static member, which keeps its
        #: partitions until its session expires, so that a restart takes them back without a rebalance.
        self.leave_before_close = True
