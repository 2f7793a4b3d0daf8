"""The chain of steps, built in one visible place, each stage on its own thread.

    polling thread ── submit ──▶ [embed stage: cache lookup + model] ──▶ [sink stage: Milvus +
    output/DLQ topics + cache fill] ──▶ completed queue ──▶ polling thread stores and commits offsets

Stages are FIFO and single-threaded, so batches complete in the order they were submitted and
per-partition offsets only move forward. While one batch is in the model the previous one is being
written, so the model never waits on I/O.

A stage takes every batch already waiting in its queue as one *group* (dynamic batching): under a
backlog the model sorts and cuts a larger set of texts by length (less padding) and Milvus gets
fewer, larger upserts, while at low load a group is a single batch and latency is unchanged. The
number of batches in flight (the polling thread's limit) bounds a group. Batches still leave a
stage one by one, in order. A stage that meets a :class:`TransientError` retries the
same group with capped exponential backoff and jitter until it succeeds or the pipeline is
aborted; any other exception is a bug and is re-raised on the polling thread by ``completed()``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable

from connectors.exceptions import TransientError
from worker import metrics
from worker.records import Batch

log = logging.getLogger(__name__)

#: A stage's work: process a group of batches (in submission order) in place.
Step = Callable[[list[Batch]], None]


class Aborted(Exception):
    """The pipeline was aborted while a stage was retrying."""


class _Stage(threading.Thread):
    def __init__(self, name: str, step: Step, inbox: queue.Queue, outbox: queue.Queue, pipeline: Pipeline) -> None:
        super().__init__(name=name, daemon=True)
        self.step = step
        self.inbox = inbox
        self.outbox = outbox
        self.pipeline = pipeline

    def _next_group(self) -> tuple[list[Batch], bool]:
        """Block for one batch, then take those already waiting: ``(group, the end was reached)``."""
        group: list[Batch] = []
        item = self.inbox.get()
        while item is not None:
            group.append(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return group, False
        return group, True

    def run(self) -> None:
        while True:
            group, end = self._next_group()
            try:
                if group:
                    self.pipeline.retrying(self.name, self.step, group)
                    if self.name == "embed":
                        self.pipeline._left_embed(len(group))
                    for batch in group:
                        self.outbox.put(batch)
            except Aborted:
                return
            except BaseException as exc:  # a bug: hand it to the polling thread, which crashes
                self.pipeline.failure = exc
                self.outbox.put(None)
                return
            if end:
                self.outbox.put(None)
                return


class Pipeline:
    """``submit`` batches, collect them from ``completed``; ``inflight`` counts those in between."""

    def __init__(self, embed: Step, sink: Step, backoff_max: float = 10.0,
                 release: Callable[[], None] | None = None) -> None:
        self.backoff_max = backoff_max
        #: Called once by ``close`` after both stages have stopped (closes what the steps hold).
        self.release = release
        self.failure: BaseException | None = None
        self.retrying_since: float | None = None
        self._abort = threading.Event()
        self._to_embed: queue.Queue = queue.Queue()
        self._to_sink: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._inflight = 0
        self._embed_backlog = 0
        self._lock = threading.Lock()
        self._stages = [_Stage("embed", embed, self._to_embed, self._to_sink, self),
                        _Stage("sink", sink, self._to_sink, self._done, self)]
        for stage in self._stages:
            stage.start()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def embed_backlog(self) -> int:
        """Batches waiting for or inside the embed stage (0: the model is free)."""
        return self._embed_backlog

    def _left_embed(self, n: int) -> None:
        with self._lock:
            self._embed_backlog -= n

    def submit(self, batch: Batch) -> None:
        with self._lock:
            self._embed_backlog += 1
        self._inflight += 1
        metrics.INFLIGHT_BATCHES.set(self._inflight)
        metrics.BATCH_SIZE.observe(len(batch))
        metrics.BATCH_TOKENS.observe(batch.tokens)
        self._to_embed.put(batch)

    def completed(self, timeout: float = 0.0) -> list[Batch]:
        """Batches finished since the last call (waits up to ``timeout`` for the first one).

        Re-raises a stage's unexpected exception."""
        out: list[Batch] = []
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

    def retrying(self, name: str, step: Step, group: list[Batch]) -> None:
        """Run ``step(group)``, retrying :class:`TransientError` with capped exponential backoff + jitter."""
        delay = 0.1
        while True:
            if self._abort.is_set():
                raise Aborted()
            try:
                step(group)
                if self.retrying_since is not None:
                    log.info("%s: recovered after %.1fs", name, time.monotonic() - self.retrying_since)
                    self.retrying_since = None
                return
            except TransientError as exc:
                metrics.RETRIES.labels(exc.system).inc()
                if self.retrying_since is None:
                    self.retrying_since = time.monotonic()
                log.warning("%s: %s; retrying in %.1fs (nothing committed meanwhile)", name, exc, delay)
                if self._abort.wait(delay * random.uniform(0.5, 1.0)):
                    raise Aborted() from None
                delay = min(delay * 2, self.backoff_max)

    def abort(self) -> None:
        """Stop the stages as soon as they can; unfinished batches are dropped (never committed)."""
        self._abort.set()
        self._to_embed.put(None)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what was submitted, then stop the stage threads."""
        self._to_embed.put(None)
        for stage in self._stages:
            stage.join(timeout)
        if self.release is not None and not any(stage.is_alive() for stage in self._stages):
            release, self.release = self.release, None
            release()
