"""Every group member's loop, a consumer group's (``worker.core.loop.Worker``) or a share group's
(``worker.core.share_loop.ShareWorker``), in one skeleton: join → turns → the one stop ladder. Shared
here: the chain of steps it drives, taking records into intake (and holding them back while the
schema registry is out), collecting finished batches into the ledger, waiting for the batches in
flight, the stop, the counters and the idle trim. Each kind adds only what is its own: a consumer
group's assignment, rebalances and pausing; a share group's poll gate and lock."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.errors import DlqLimitExceeded, RecordRefused, TransientError
from worker.core.fence import Fence
from worker.core.ledger import Ledger
from worker.core.pipeline import Pipeline
from worker.core.records import Batch, TopicPartitionKey, Written
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
    """What a group member's loop holds and does, a consumer group's (``worker.core.loop.Worker``) or
    a share group's (``worker.core.share_loop.ShareWorker``): its consumer, chain and ledger, its
    stop, its counters, the records it holds back, its idle trim and where it serves its metrics.
    ``run()`` blocks until stopped, idle (if asked), or a bug."""

    #: What becomes of the batches a stop leaves unfinished (said in its warning).
    UNFINISHED = "not committing them"

    def __init__(self, consumer, topic: str, chain: Chain, ledger: Ledger, *, shutdown_grace: float,
                 health: Health, backoff_max: float = 10.0, on_progress: Callable[[RunStats], None] | None = None,
                 stats: RunStats | None = None) -> None:
        self.consumer = consumer
        self.topic = topic
        self.chain = chain
        #: What becomes of finished batches' input (``worker.core.ledger``), on this thread.
        self.ledger = ledger
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

    # -- the skeleton ----------------------------------------------------------------------------
    def run(self, stop_when_idle: float | None = None) -> RunStats:
        """Join the group and turn the loop until a stop is asked, the input is idle ``stop_when_idle``
        seconds (None: never), or something raises; then stop in the one order (:meth:`_stop`)."""
        self._join()
        self.chain.fence.start()
        try:
            while not self.stop.requested and not self._turn(stop_when_idle):
                pass
            self._stop(self.shutdown_grace, flush=True, commit=10)
        except DlqLimitExceeded:
            # Finish and commit the batches already in flight (all before the bad run), then halt;
            # the open batch holds the bad run: never committed past.
            self._stop(self.shutdown_grace, commit=5)
            raise
        except RecordRefused:
            # The broker refuses a record for good: commit what finished before it, then stop there.
            self._stop(0, commit=5)
            raise
        except BaseException:
            # The consumer died (or a bug): nothing more commits. The stage threads still end before the
            # process may exit: one still inside the model's native code at exit aborted the process
            # ("terminate called without an active exception", exit -6 or -11 instead of 4).
            self._stop(0)
            raise
        finally:
            self.chain.fence.stop()
            self._leave()
        return self.stats

    def _join(self) -> None:
        """Subscribe to the input topic (the fence starts next)."""
        raise NotImplementedError

    def _turn(self, stop_when_idle: float | None) -> bool:
        """One turn of the loop; True when the input has been idle ``stop_when_idle`` seconds."""
        raise NotImplementedError

    def _leave(self) -> None:
        """Leave the group and close the consumer (after the stop, whatever ended the loop)."""
        self.consumer.close()

    # -- shared steps ----------------------------------------------------------------------------
    def _take(self, msgs: list) -> int:
        """Hand ``msgs`` (after any held back, once their retry is due) to intake; while the schema
        registry is out they are held back instead. Returns how many were offered."""
        good = self.held.take(msgs)
        if not good:
            return 0
        self.stats.arrived()
        try:
            self.chain.intake.add(good)
        except TransientError as exc:  # the schema registry is out: intake took none of them
            self.held.hold(good, exc)
            return len(good)
        self.held.taken()
        return len(good)

    def _collect(self, timeout: float = 0.0) -> None:
        """Account for finished batches and hand each to the ledger (:meth:`_finished`)."""
        done = False
        for batch, written in self.chain.pipeline.completed(timeout):
            self.stats.account(batch, written)
            self._finished(batch, written)
            done = True
            if self.on_progress:
                self.on_progress(self.stats)
        if done:
            self._collected()

    def _finished(self, batch: Batch, written: Written) -> None:
        """``batch`` left the pipeline, with what the sink ``written`` of it: its input goes to the ledger."""
        self.ledger.finished(batch, written)

    def _collected(self) -> None:
        """One or more batches were collected by this call (a share member sends their acknowledgements)."""
        return None

    def _wait_inflight(self, seconds: float) -> bool:
        """Collect finished batches until none is in flight or ``seconds`` pass; True when none is.
        Stops early after a stall (the fence is closed: nothing in flight can be written now)."""
        pipeline, fence, deadline = self.chain.pipeline, self.chain.fence, time.monotonic() + seconds
        while pipeline.inflight and not pipeline.aborted and time.monotonic() < deadline:
            if fence.suspect:
                break
            self._collect(timeout=0.1)
        return pipeline.inflight == 0

    def _stop(self, grace: float, *, flush: bool = False, commit: int = 0) -> None:
        """The one stop order, whatever ended the loop. With ``flush`` (a graceful stop) the input is
        held (:meth:`_hold_input`) and the open batch closes; the batches in flight are finished within
        ``grace`` seconds, and what is left after that is dropped (never committed); then what finished
        is committed, in up to ``commit`` attempts (0: nothing more commits)."""
        chain = self.chain
        if flush:
            self._hold_input()
            chain.intake.flush()
        finished = self._wait_inflight(grace) if grace else chain.pipeline.inflight == 0
        if finished and commit:
            chain.pipeline.close()
        else:
            if chain.pipeline.inflight:
                log.warning("%d batches unfinished after %.0fs grace: %s", chain.pipeline.inflight, grace,
                            self.UNFINISHED)
            if not chain.pipeline.abort(wait=ABORT_WAIT_S):
                log.warning("a stage is still inside a step after %.0fs", ABORT_WAIT_S)
        if commit and self.ledger.flush(sync=True, attempts=commit) and flush:
            self._stopped()

    def _hold_input(self) -> None:
        """A graceful stop: consume no more (a consumer group pauses its partitions)."""
        return None

    def _stopped(self) -> None:
        """A graceful stop committed everything (a consumer group says what it committed)."""
        return None
