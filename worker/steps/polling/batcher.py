"""Micro-batching: close a batch by count, by token budget, or by the age of its oldest record.

Single-threaded (the polling thread owns it). Entries keep consumption order inside a batch, so
the offsets a batch carries are the next offsets to commit for its partitions. Reordering by
length for the model happens later, inside the embed step, and never changes what is committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from worker.core.records import Batch, Entry, Item, TopicPartitionKey


class Batcher:
    """Accumulates entries; ``add`` and ``poll`` return the batches that closed.

    * count: a batch closes when it holds ``max_size`` entries;
    * tokens: an item that would take the batch over ``max_tokens`` closes the batch first (an
      item alone over the budget still forms a batch of its own);
    * deadline: ``poll(now)`` closes the open batch once its oldest entry has waited ``max_wait`` s;
    * bytes: a batch closes once its texts and dead-lettered values hold ``max_bytes`` (so the memory
      in flight stays below (in-flight batches + 1) × ``max_bytes`` whatever the records' sizes).
    """

    def __init__(self, max_size: int, max_tokens: int, max_wait: float,
                 max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.max_tokens = max_tokens
        self.max_wait = max_wait
        self._clock = clock
        self._open: Batch | None = None

    def add(self, entry: Entry) -> list[Batch]:
        return self.add_many((entry,))

    def add_many(self, entries: Iterable[Entry]) -> list[Batch]:
        """``add`` each of ``entries`` in turn: the batches that closed, in order (one loop for a
        consumed chunk of records, not a call each: the polling thread's path)."""
        closed: list[Batch] = []
        open_, max_size, max_tokens, max_bytes = self._open, self.max_size, self.max_tokens, self.max_bytes
        for entry in entries:
            tokens = entry.tokens if isinstance(entry, Item) else 0
            if open_ is not None and open_.tokens and open_.tokens + tokens > max_tokens:
                closed.append(open_)
                open_ = None
            if open_ is None:
                open_ = Batch(opened_at=self._clock())
            open_.add(entry)
            if len(open_.entries) >= max_size or open_.tokens >= max_tokens or open_.size >= max_bytes:
                closed.append(open_)
                open_ = None
        self._open = open_
        return closed

    def poll(self, now: float | None = None) -> list[Batch]:
        """Close the open batch if its oldest entry is past the deadline."""
        now = self._clock() if now is None else now
        if self._open is not None and now - self._open.opened_at >= self.max_wait:
            batch, self._open = self._open, None
            return [batch]
        return []

    def flush(self) -> list[Batch]:
        """Close the open batch whatever its age (shutdown)."""
        batch, self._open = self._open, None
        return [batch] if batch is not None and len(batch) else []

    def drop(self, partitions: Iterable[TopicPartitionKey]) -> int:
        """Forget the entries of ``partitions`` (revoked or lost); return how many were dropped.

        They were never committed, so their new owner consumes them again."""
        gone = set(partitions)
        if self._open is None or not gone:
            return 0
        old = self._open
        keep = [e for e in old.entries if e.source.tp not in gone]
        self._open = None
        if keep:
            self._open = Batch(opened_at=old.opened_at)
            for e in keep:
                self._open.add(e)
        return len(old.entries) - len(keep)

    def __len__(self) -> int:
        return len(self._open) if self._open is not None else 0
