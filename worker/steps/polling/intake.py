"""Intake, on the polling thread: validate → estimate tokens → DLQ breaker → batch.

Every consumed record becomes one entry (``Item``, ``Delete`` or ``DeadLetter``); items get a token
estimate (not a count: tokenizing here cost 0.12 ms a docstring on this thread, paid again by the
model's own tokenizing and for every cache hit); the breaker sees each outcome *before* the entry
joins a batch, so when it trips, that record and everything after it stay uncommitted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from worker.core.records import Batch, DeadLetter, Entry, Item, TopicPartitionKey
from worker.steps.polling.batcher import Batcher
from worker.steps.polling.dlq_limit import DlqLimit
from worker.steps.polling.validate import Validator


class Intake:
    """``add``, ``poll`` and ``flush`` hand each batch that closes to ``next_step`` at once (so a
    breaker that trips mid-chunk loses none of the batches closed before it)."""

    def __init__(self, validator: Validator, estimate_tokens: Callable[[list[str], str], list[int]],
                 dlq_limit: DlqLimit, batcher: Batcher, next_step: Callable[[Batch], None]) -> None:
        self.validator = validator
        self.estimate_tokens = estimate_tokens
        self.dlq_limit = dlq_limit
        self.batcher = batcher
        self.next_step = next_step

    def add(self, messages: list) -> None:
        """Turn good Kafka messages (no error) into entries and batch them. Raises
        ``DlqLimitExceeded`` at the record that trips the breaker (it joins no batch), and
        ``TransientError`` before taking any of them when the schema registry is out. Dead letters
        made after intake (``DlqLimit.record_late``) are counted first: when they trip the breaker,
        none of ``messages`` is taken."""
        self.dlq_limit.count_late()
        self.validator.resolve_schemas(messages)
        entries: list[Entry] = [self.validator.validate(m) for m in messages]
        by_model: dict[str, list[Item]] = {}
        dead = False
        for e in entries:
            if isinstance(e, Item):
                by_model.setdefault(e.model, []).append(e)
            elif isinstance(e, DeadLetter):
                dead = True
        for model, items in by_model.items():  # one call per model (the worker's set: usually one)
            for it, n in zip(items, self.estimate_tokens([it.text for it in items], model)):
                it.tokens = n
        if not dead:  # the common chunk: nothing in it can trip the breaker
            self.dlq_limit.record_processed(len(entries))
            self._emit(self.batcher.add_many(entries))
            return
        for e in entries:
            if isinstance(e, DeadLetter):
                self.dlq_limit.record(e.reason, e.message)
            else:
                self.dlq_limit.record(None)
            self._emit(self.batcher.add(e))

    def poll(self) -> None:
        """Close the open batch if it is past its deadline (after counting late dead letters)."""
        self.dlq_limit.count_late()
        self._emit(self.batcher.poll())

    def flush(self) -> None:
        """Close the open batch whatever its age (shutdown)."""
        self._emit(self.batcher.flush())

    def _emit(self, batches: list[Batch]) -> None:
        for batch in batches:
            self.next_step(batch)

    def drop(self, partitions: Iterable[TopicPartitionKey]) -> int:
        """Forget what is batching for ``partitions`` (revoked or lost); how many entries went."""
        return self.batcher.drop(partitions)

    def __len__(self) -> int:
        return len(self.batcher)
