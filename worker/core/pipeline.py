"""Stages on threads of their own, joined by queues: batches go in with ``submit`` and come out of
``completed`` in the order they went in.

    submit ──▶ [stage 1] ──▶ [stage 2] ──▶ … ──▶ completed()

Each stage hands each batch on with a value: what its step decided about that batch (the prepare
stage: what the model still has to make; the embed stage: the vectors it made; the sink: what it
wrote). ``completed`` hands out each batch with the last stage's value. Values ride per batch, not
per group, because every stage forms its groups anew.

Which stages there are, and in what order, is decided in one place: ``worker.assembly.chain.build_chain``.
This module knows no stage by name.

Stages are FIFO and single-threaded, so batches complete in submission order and per-partition
offsets only move forward. While one batch is in a stage the next one is in the stage before it,
so the model never waits on I/O.

A stage takes every batch already waiting in its queue as one *group* (dynamic batching): under a
backlog the model sorts and cuts a larger set of texts by length (less padding) and Milvus gets
fewer, larger upserts, while at low load a group is a single batch and latency is unchanged. The
number of batches in flight (the polling thread's limit) bounds a group. Batches still leave a
stage one by one, in order. A stage that meets a :class:`TransientError` retries the same group
with capped exponential backoff and jitter (its own clock: one stage's outage does not change
another's backoff) until it succeeds or the pipeline is aborted; any other exception is a bug and
is re-raised on the polling thread by ``completed()``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from schemas.errors import TransientError
from worker.core.records import Batch
from worker.process import metrics

log = logging.getLogger(__name__)

#: A stage's work. It is handed a group of batches (in submission order) and, for each, the value the
#: stage before handed on with it (None into the first stage); it returns one value per batch, in the
#: same order, to hand on with it (the last stage's to ``completed``). What a step decides about a
#: batch is the value it returns, never a field of the batch that a later stage reads.
Step = Callable[[list[Batch], list[Any]], list[Any]]
#: A batch and the value handed on with it.
Handed = tuple[Batch, Any]


class Aborted(Exception):
    """The pipeline was aborted while a stage was retrying."""


class Stage:
    """One step of the chain with its own thread, queue, counters and retry state.

    ``backlog`` (batches waiting for or inside this stage) is read from any thread; ``groups`` and
    ``retries`` are written by the stage's thread only."""

    def __init__(self, name: str, step: Step) -> None:
        self.name = name
        self.step = step
        self.backlog = 0
        self.groups = 0
        self.retries = 0
        #: When the current run of transient failures began (None: not retrying).
        self.retrying_since: float | None = None
        self._inbox: queue.Queue[Handed | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, handed: Handed | None) -> None:
        """Hand a batch and its value to this stage (``None``: no more batches)."""
        if handed is not None:
            with self._lock:
                self.backlog += 1
        self._inbox.put(handed)

    def start(self, forward: Callable[[Handed | None], None], abort: threading.Event, backoff_max: float,
              on_bug: Callable[[BaseException], None]) -> None:
        self._thread = threading.Thread(target=self._run, args=(forward, abort, backoff_max, on_bug),
                                        name=self.name, daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The stage thread's id in the kernel (None: not started)."""
        return self._thread.native_id if self._thread is not None else None

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; True when it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _next_group(self) -> tuple[list[Handed], bool]:
        """Block for one batch, then take those already waiting: ``(group, the end was reached)``."""
        group: list[Handed] = []
        item = self._inbox.get()
        while item is not None:
            group.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return group, False
        return group, True

    def _run(self, forward: Callable[[Handed | None], None], abort: threading.Event, backoff_max: float,
             on_bug: Callable[[BaseException], None]) -> None:
        while True:
            group, end = self._next_group()
            try:
                if group:
                    batches = [batch for batch, _ in group]
                    values = self._process(batches, [value for _, value in group], abort, backoff_max)
                    with self._lock:
                        self.backlog -= len(group)
                    for handed in zip(batches, values):
                        forward(handed)
            except Aborted:
                return
            except BaseException as exc:  # a bug: hand it to the polling thread, which crashes
                on_bug(exc)
                return
            if end:
                forward(None)
                return

    def _process(self, group: list[Batch], handed: list[Any], abort: threading.Event,
                 backoff_max: float) -> list[Any]:
        """``step(group, handed)``, retrying :class:`TransientError` with capped exponential backoff +
        jitter (each try is handed the same values); the values to hand on, one per batch."""
        delay = 0.1
        while True:
            if abort.is_set():
                raise Aborted()
            try:
                values = self.step(group, handed)
                if len(values) != len(group):
                    raise ValueError(f"{self.name}: {len(values)} values for a group of {len(group)} batches")
                self.groups += 1
                if self.retrying_since is not None:
                    log.info("%s: recovered after %.1fs", self.name, time.monotonic() - self.retrying_since)
                    self.retrying_since = None
                return values
            except TransientError as exc:
                self.retries += 1
                metrics.RETRIES.labels(exc.system).inc()
                if self.retrying_since is None:
                    self.retrying_since = time.monotonic()
                log.warning("%s: %s; retrying in %.1fs (nothing committed meanwhile)", self.name, exc, delay)
                if abort.wait(delay * random.uniform(0.5, 1.0)):
                    raise Aborted() from None
                delay = min(delay * 2, backoff_max)


class Pipeline:
    """``submit`` batches, collect them (each with the last stage's value) from ``completed``;
    ``inflight`` counts those in between.

    ``submit``, ``completed``, ``abort`` and ``close`` are called from one thread (the polling
    thread); the stages run on their own."""

    def __init__(self, stages: list[Stage], backoff_max: float = 10.0,
                 release: Callable[[], None] | None = None) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = stages
        #: Called once by ``close`` after every stage has stopped (closes what the steps hold).
        self.release = release
        self.failure: BaseException | None = None
        self._abort = threading.Event()
        self._done: queue.Queue[Handed | None] = queue.Queue()
        self._inflight = 0
        for stage, after in zip(stages, [*stages[1:], None]):
            stage.start(after.put if after is not None else self._done.put, self._abort, backoff_max,
                        self._on_bug)

    def _on_bug(self, exc: BaseException) -> None:
        self.failure = exc
        self._done.put(None)  # wake a waiting ``completed``

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    @property
    def inflight(self) -> int:
        return self._inflight

    def submit(self, batch: Batch) -> None:
        self._inflight += 1
        metrics.INFLIGHT_BATCHES.set(self._inflight)
        metrics.BATCH_SIZE.observe(len(batch))
        metrics.BATCH_TOKENS.observe(batch.tokens)
        self.stages[0].put((batch, None))

    def completed(self, timeout: float = 0.0) -> list[Handed]:
        """Batches finished since the last call, each with the last stage's value (waits up to
        ``timeout`` for the first one).

        Re-raises a stage's unexpected exception."""
        out: list[Handed] = []
        try:
            item = self._done.get(timeout=timeout) if timeout > 0 else self._done.get_nowait()
            while True:
                if item is not None:
                    out.append(item)
                item = self._done.get_nowait()
        except queue.Empty:
            pass
        self._inflight -= len(out)
        metrics.INFLIGHT_BATCHES.set(self._inflight)
        if self.failure is not None:
            raise self.failure
        return out

    def abort(self, wait: float = 0.0) -> bool:
        """Stop the stages as soon as they can; unfinished batches are dropped (never committed).

        Waits up to ``wait`` seconds for the stage threads to end; True when they have. A thread
        inside a step (the model's forward pass) ends when that call returns: a process that exits
        while one still runs native code can die in the C++ runtime instead of exiting cleanly."""
        self._abort.set()
        for stage in self.stages:  # wake a stage that waits for input, too
            stage.put(None)
        deadline = time.monotonic() + wait
        return all([stage.join(max(0.0, deadline - time.monotonic())) for stage in self.stages])

    def close(self, timeout: float = 10.0) -> None:
        """Finish what was submitted, then stop the stage threads."""
        self.stages[0].put(None)
        stopped = all([stage.join(timeout) for stage in self.stages])
        if self.release is not None and stopped:
            release, self.release = self.release, None
            release()
