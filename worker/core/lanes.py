"""Two lanes on one host: the live lane first, a backfill in what the live lane leaves.

A worker may serve two members: its live group, and a backfill (a migration's group reading the input
topic again, from its start, into the new model's collection). Every stage of both chains passes its
steps through one :class:`ModelGate` (``live_stage`` and ``backfill_stage``, given to
``worker.assembly.chain.build_chain``):

- a live group goes to the model as soon as the model is free; the live lane's other stages never wait;
- a backfill step (a batch into the model, a group through its prepare or sink stage) starts only in a
  *turn*: when the model is free *and* no live batch is on its way to it: none queued at the gate, none
  in the live lane's prepare or embed stage (``live_busy``). A backfill batch holds the model while it
  runs; a backfill group in prepare or sink holds nothing, so a live batch that arrives meanwhile goes
  to the model at once.

So the backfill's forward passes never run beside the live lane's, and its tokenizing and writes start
only while no live batch wants the model; the live lane's writes (its sink) go on beside them. A live
batch waits for one backfill batch at most: the gate sizes the backfill's model batches to hold the
model about ``backfill_hold_s`` at the pace it measures. How many batches the backfill holds in flight
is bounded where its member is built (``worker.assembly.lanes``): the gate orders the host's time, it
does not count batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from worker.core.pipeline import Step
from worker.core.records import Batch

#: How often a waiting backfill step looks again at the live chain's stages (they are counted by
#: other threads, outside the gate's lock).
LOOK_AGAIN_S = 0.005
#: The stage whose step is the model's forward passes (``worker.assembly.chain``).
MODEL_STAGE = "embed"
#: A lane's way through the gate: its stage's name and step → the step the stage runs.
LaneGate = Callable[[str, Step], Step]


class ModelGate:
    """The host's time between a live lane and a backfill lane (the module doc). ``live_busy()``:
    whether the live chain has batches on their way to the model (in its prepare or embed stage; any
    truthy value; read from the backfill's stage threads)."""

    def __init__(self, live_busy: Callable[[], object], clock: Callable[[], float] = time.monotonic,
                 backfill_hold_s: float = 0.1, resize: Callable[[int], None] = lambda tokens: None) -> None:
        self.live_busy = live_busy
        self._clock = clock
        #: How long one backfill batch should hold the model; ``resize(tokens)`` is told the backfill
        #: batch's token budget that holds it about that long, at the model's pace measured so far.
        self.backfill_hold_s = backfill_hold_s
        self.resize = resize
        self._tokens_per_s: float | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._live_queued = 0
        #: Seconds the backfill lane waited at the gate, and the batches it took through the model: how
        #: much the live lane held it back.
        self.backfill_waited_s = 0.0
        self.backfill_batches = 0

    @contextmanager
    def live(self) -> Iterator[None]:
        """Hold the model for one live group: as soon as it is free."""
        with self._cond:
            self._live_queued += 1
            try:
                while self._busy:
                    self._cond.wait()
            finally:
                self._live_queued -= 1
            self._busy = True
        try:
            yield
        finally:
            self._free()

    @contextmanager
    def backfill(self, hold: bool = True) -> Iterator[None]:
        """A turn of the backfill (one step of one stage): once the model is free and no live batch is
        on its way to it. With ``hold``, the model is held meanwhile (a live group waits for this one
        step); without, the step runs beside whatever live batch comes next."""
        start = self._clock()
        with self._cond:
            while self._busy or self._live_queued or self.live_busy():
                self._cond.wait(LOOK_AGAIN_S)
            self._busy = hold
            # Under the lock: the backfill's three stage threads may take their turns at once.
            self.backfill_waited_s += self._clock() - start
        try:
            yield
        finally:
            if hold:
                self._free()

    def live_stage(self, stage: str, step: Step) -> Step:
        """The live lane's ``stage`` step through the gate (a :data:`LaneGate`): its model calls hold the
        model (:meth:`live_step`); its other stages run as they are."""
        return self.live_step(step) if stage == MODEL_STAGE else step

    def backfill_stage(self, stage: str, step: Step) -> Step:
        """The backfill lane's ``stage`` step through the gate (a :data:`LaneGate`): its model calls a
        batch a turn, holding the model (:meth:`backfill_step`); its other stages a group a turn,
        holding nothing (the group is as small as the backfill's batches in flight:
        ``worker.assembly.lanes``)."""
        if stage == MODEL_STAGE:
            return self.backfill_step(step)

        def run(group: list[Batch], handed: list[Any]) -> list[Any]:
            with self.backfill(hold=False):
                return step(group, handed)
        return run

    def live_step(self, step: Step) -> Step:
        """``step`` (the live lane's embed stage's) run holding the model for its whole group."""
        def run(group: list[Batch], handed: list[Any]) -> list[Any]:
            with self.live():
                return step(group, handed)
        return run

    def backfill_step(self, step: Step) -> Step:
        """``step`` (the backfill lane's) run one batch at a time, taking the model anew for each: a live
        group waits for one backfill batch at most, however many the backfill's group holds. A retry
        (the stage's, of the whole group) embeds again the batches already done: work, not harm."""
        def run(group: list[Batch], handed: list[Any]) -> list[Any]:
            out: list[Any] = []
            for batch, value in zip(group, handed):
                with self.backfill():
                    self.backfill_batches += 1
                    start = self._clock()
                    out.extend(step([batch], [value]))
                    self._paced(batch.tokens, self._clock() - start)
            return out
        return run

    def _paced(self, tokens: int, seconds: float) -> None:
        """One backfill batch of ``tokens`` held the model ``seconds``: the pace, smoothed, and the
        budget that holds it ``backfill_hold_s`` handed to ``resize``."""
        if tokens <= 0 or seconds <= 0:
            return
        pace = tokens / seconds
        self._tokens_per_s = pace if self._tokens_per_s is None else 0.7 * self._tokens_per_s + 0.3 * pace
        self.resize(int(self._tokens_per_s * self.backfill_hold_s))

    def _free(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()
