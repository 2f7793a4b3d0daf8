"""Two lanes on one model: the live lane first, a backfill in what the live lane leaves.

A worker may serve two members on the same models: its live group, and a backfill (a migration's
group reading the input topic again, from its start, into the new model's collection). Both chains'
embed stages pass through one :class:`ModelGate` around each group's forward passes:

- a live group goes to the model as soon as the model is free;
- a backfill group goes to the model only when the model is free *and* no live batch waits for it:
  none queued at the gate, and none in the live chain's stages before or in the model
  (``live_waiting``); it takes the model for one group, then asks again.

So a live batch waits at most for the one backfill group already in the model. What share of the
worker's in-flight batches the backfill may hold is bounded where its member is built (its own
``max_inflight``), not here: the gate orders the model's time, it does not count batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from worker.core.records import Batch

#: How often a waiting backfill group looks again at the live chain's stages (they are counted by
#: other threads, outside the gate's lock).
LOOK_AGAIN_S = 0.005


class ModelGate:
    """The model's time between a live lane and a backfill lane (the module doc). ``live_waiting()``:
    how many live batches are in the live chain's stages before and in the model (read from the
    backfill's embed thread)."""

    def __init__(self, live_waiting: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.live_waiting = live_waiting
        self._clock = clock
        self._cond = threading.Condition()
        self._busy = False
        self._live_queued = 0
        #: Seconds the backfill lane waited at the gate, and the groups it took through: how much the
        #: live lane held it back.
        self.backfill_waited_s = 0.0
        self.backfill_groups = 0

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
        """Hold the model for one backfill group: once it is free and no live batch waits."""
        start = self._clock()
        with self._cond:
            while self._busy or self._live_queued or self.live_waiting():
                self._cond.wait(LOOK_AGAIN_S)
            self._busy = True
        self.backfill_waited_s += self._clock() - start
        self.backfill_groups += 1
        try:
            yield
        finally:
            self._free()

    def _free(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()


def gated(step: Callable[[list[Batch], list[Any]], list[Any]],
          hold: Callable[[], Any]) -> Callable[[list[Batch], list[Any]], list[Any]]:
    """``step`` (an embed stage's) run while holding the model through ``hold`` (``gate.live`` or
    ``gate.backfill``): one group's forward passes at a time across the two lanes."""
    def run(group: list[Batch], handed: list[Any]) -> list[Any]:
        with hold():
            return step(group, handed)
    return run
