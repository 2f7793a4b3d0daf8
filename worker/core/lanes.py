"""Two lanes on one device: the live lane first, a backfill in what the live lane leaves.

A worker may serve two members: its live group, and a backfill (a migration's group reading the input
topic again, from its start, into the new model's collection). Both chains' embed stages pass through
one :class:`ModelGate` around their forward passes:

- a live group goes to the model as soon as the model is free;
- a backfill batch goes to the model only when the model is free *and* no live batch waits for it:
  none queued at the gate, and none in the live chain's stages before or in the model
  (``live_waiting``); it takes the model for one batch, then asks again.

The backfill takes the model one batch at a time (:meth:`ModelGate.backfill_step`), so a live group waits
at most for the one backfill batch already in the model; and the gate sizes the backfill's batches to
hold it about ``backfill_hold_s`` (the live lane's batch deadline), at the pace it measures. How many
batches the backfill holds in flight is bounded where its member is built (``worker.assembly.lanes``):
the gate orders the model's time, it does not count batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from worker.core.pipeline import Step
from worker.core.records import Batch

#: How often a waiting backfill batch looks again at the live chain's stages (they are counted by
#: other threads, outside the gate's lock).
LOOK_AGAIN_S = 0.005


class ModelGate:
    """The model's time between a live lane and a backfill lane (the module doc). ``live_waiting()``:
    whether live batches are in the live chain's stages before or in the model (any truthy value; read
    from the backfill's embed thread)."""

    def __init__(self, live_waiting: Callable[[], object], clock: Callable[[], float] = time.monotonic,
                 backfill_hold_s: float = 0.1, resize: Callable[[int], None] = lambda tokens: None) -> None:
        self.live_waiting = live_waiting
        self._clock = clock
        #: How long one backfill batch should hold the model; ``resize(tokens)`` is told the backfill
        #: batch's token budget that holds it about that long, at the model's pace measured so far.
        self.backfill_hold_s = backfill_hold_s
        self.resize = resize
        self._tokens_per_s: float | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._live_queued = 0
        #: Seconds the backfill lane waited at the gate, and the batches it took through: how much the
        #: live lane held it back.
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
    def backfill(self) -> Iterator[None]:
        """Hold the model for one backfill batch: once it is free and no live batch waits."""
        start = self._clock()
        with self._cond:
            while self._busy or self._live_queued or self.live_waiting():
                self._cond.wait(LOOK_AGAIN_S)
            self._busy = True
        self.backfill_waited_s += self._clock() - start
        self.backfill_batches += 1
        try:
            yield
        finally:
            self._free()

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
