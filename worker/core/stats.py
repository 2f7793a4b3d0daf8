"""What the worker did: run counters for progress displays and the summary, and the per-record
metrics, both fed from each finished batch by ``RunStats.account``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from worker.core.records import Batch, DeadLetter, Delete, Item, Written
from worker.process import metrics


@dataclass
class RunStats:
    """Counters of one run of the loop."""

    embedded: int = 0
    deleted: int = 0
    dead_lettered: int = 0
    #: Records written nowhere because Milvus already held a newer version of their id.
    superseded: int = 0
    #: Records left to the partition's new owner (this member lost the partition meanwhile).
    fenced: int = 0
    #: Documents whose every chunk came from a cache.
    cached: int = 0
    #: Chunks written (a document that fits the model is one), and documents of more than one.
    chunks: int = 0
    chunked: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    #: When the first record arrived and when the last batch finished (monotonic), for rates.
    first_record_at: float | None = None
    last_done_at: float | None = None
    dlq_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.embedded + self.deleted + self.dead_lettered + self.superseded

    @property
    def long_chunks(self) -> int:
        """Chunks of the documents that were more than one (``chunked`` of them)."""
        return self.chunks - (self.embedded - self.chunked)

    @property
    def busy_seconds(self) -> float:
        """First record consumed → last batch finished (excludes group join and idle time)."""
        if self.first_record_at is None or self.last_done_at is None:
            return 0.0
        return self.last_done_at - self.first_record_at

    @property
    def docs_per_second(self) -> float:
        return self.done / self.busy_seconds if self.busy_seconds > 0 else 0.0

    def arrived(self) -> None:
        """Records were consumed (the first call starts the busy clock)."""
        if self.first_record_at is None:
            self.first_record_at = time.monotonic()

    def account(self, batch: Batch, written: Written) -> None:
        """Count a finished batch (with what the sink ``written`` of it), and feed the outcome, DLQ and
        end-to-end metrics."""
        now_ms = time.time() * 1000
        self.batches += 1
        self.last_done_at = time.monotonic()
        items = deletes = superseded = fenced = 0
        stamps = []
        for e in batch.entries:
            if written.fenced and e.source.tp in written.fenced:
                fenced += 1
            elif getattr(e, "superseded", False):
                superseded += 1
            elif isinstance(e, Item):
                items += 1
                n = len(e.chunks)
                self.chunks += n
                if n == 1:
                    self.cached += e.chunks[0].cached
                else:
                    self.chunked += 1
                    self.cached += all(ch.cached for ch in e.chunks)
                if e.source.timestamp_ms:
                    stamps.append(e.source.timestamp_ms)
            elif isinstance(e, Delete):
                deletes += 1
            elif isinstance(e, DeadLetter):
                self.dlq_reasons[e.reason] = self.dlq_reasons.get(e.reason, 0) + 1
                metrics.DLQ_MESSAGES.labels(e.reason).inc()
        if stamps:
            metrics.END_TO_END_SECONDS.observe_many(np.maximum(0.0, (now_ms - np.array(stamps, np.float64)) / 1000))
        dead = len(batch) - items - deletes - superseded - fenced
        self.embedded += items
        self.deleted += deletes
        self.dead_lettered += dead
        self.superseded += superseded
        self.fenced += fenced
        metrics.MESSAGES.labels("embedded").inc(items)
        metrics.MESSAGES.labels("deleted").inc(deletes)
        metrics.MESSAGES.labels("dead_lettered").inc(dead)
        metrics.MESSAGES.labels("superseded").inc(superseded)
        metrics.FENCED_RECORDS.inc(fenced)
