"""The delivery interface, and the attempt at a group it hands the sink (the order: ``worker.core.delivery``)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from worker.core.records import Batch, Entry, TopicPartitionKey


@dataclass
class Planned:
    """A group's writes as the sink planned them: the entries to produce (owned partitions, not
    superseded), each collection's final operations, and the time stamped on the rows."""

    group: list[Batch]
    entries: list[Entry]
    plans: list
    now: int


def written_offsets(group: list[Batch]) -> dict[TopicPartitionKey, int]:
    """The next offset per partition of the group's written entries (``fenced`` ones left out)."""
    offsets: dict[TopicPartitionKey, int] = {}
    for batch in group:
        for tp, o in batch.offsets.items():
            if tp not in batch.fenced:
                offsets[tp] = max(offsets.get(tp, 0), o)
    return offsets


class Attempt(abc.ABC):
    """One attempt at making a group durable, as its delivery sees it; the sink drives it, in the
    order of ``worker.core.delivery``::

        attempt = delivery.attempt(group)          # finished: an earlier attempt went through after all
        planned = attempt.carried or plan(group)   # carried: planned and produced by an earlier attempt
        Milvus' writes start on their thread
        producer = attempt.begin()                 # None: the group's records are out already
        attempt.sent(produce(planned, producer))   # waits for the acknowledgements
        Milvus' result                             # a TransientError: attempt.milvus_failed(planned)
        with attempt.holding(): attempt.commit(the group's offsets, if still owned)
        on any failure: raise attempt.abort(exc)

    The attempt never calls the sink: it is handed what it needs."""

    #: What an earlier attempt planned and produced (its records still in an open transaction);
    #: None: plan the group anew.
    carried: Planned | None = None
    #: Nothing is left to do: an earlier attempt's commit went through after all.
    finished: bool = False
    #: The records are durable once acknowledged (at-least-once); else only once committed.
    durable_when_sent: bool = True

    @abc.abstractmethod
    def begin(self) -> Producer | None:
        """The producer to hand the group's records to, once any transaction is begun; None when an
        earlier attempt's records are out already (only Milvus is written again)."""

    @abc.abstractmethod
    def sent(self, records: DeliveryBatch) -> None:
        """Wait until the group's records are acknowledged; raises ``TransientError`` (or
        ``RecordRefused``) when they are not."""

    def milvus_failed(self, planned: Planned) -> None:
        """Milvus failed after the records went out: keep what the retry may reuse."""
        return None

    def holding(self) -> AbstractContextManager:
        """Held while the group's offsets are read and committed (a revoke waits for it)."""
        return nullcontext()

    @abc.abstractmethod
    def commit(self, offsets: list[TopicPartition]) -> None:
        """The group is written: commit ``offsets`` with it (or leave them to the polling thread)."""

    def abort(self, exc: BaseException) -> BaseException:
        """The attempt failed with ``exc``: undo what must be undone; returns what to raise."""
        return exc


class Delivery(abc.ABC):
    """How a group's records and its input offsets become durable together.

    ``attempt`` (and what it hands out) runs on the sink thread; ``store``, ``commit``, ``recommit``, ``barrier``,
    ``new_generation`` and ``forget`` on the polling thread (``worker.core.offsets.OffsetCommitter``
    calls them)."""

    #: Told of offsets the delivery committed itself (exactly-once), from the sink thread: the
    #: committer's line past which a commit means a takeover.
    on_committed: Callable[[Mapping[TopicPartitionKey, int]], None] = staticmethod(lambda _offsets: None)

    @property
    @abc.abstractmethod
    def producer(self) -> Producer:
        """The producer the group's records go out with now."""

    @abc.abstractmethod
    def attempt(self, group: list[Batch]) -> Attempt:
        """An attempt at making ``group`` durable (the sink drives it: :class:`Attempt`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the producer (call once nothing more is written)."""

    @abc.abstractmethod
    def store(self, offsets: list[TopicPartition]) -> None:
        """Offsets of finished batches, for partitions still owned, to commit."""

    @abc.abstractmethod
    def commit(self, sync: bool) -> bool:
        """Commit what is stored; True when nothing is left. Raises ``KafkaException`` or
        ``TransientError`` on a failure (what was stored stays for the next call)."""

    @abc.abstractmethod
    def recommit(self, offsets: list[TopicPartition]) -> None:
        """Commit ``offsets`` (already committed ones) again, synchronously: a proof the group still
        takes this member's commits. Raises ``KafkaException`` or ``TransientError`` on a refusal."""

    def barrier(self) -> None:
        """A revoke has published the smaller ownership: wait for a commit already under way."""
        return None  # nothing under way to wait for unless the delivery commits on the sink thread

    def new_generation(self, consumer: Consumer) -> None:
        """Called on the polling thread at every rebalance callback and every tick: the group's
        generation may have changed (a rebalance that left this member's partitions as they were
        calls no callback, yet moves the generation on)."""
        return None  # only a delivery that commits with the group's metadata needs it

    def forget(self, tps: Iterable[TopicPartitionKey]) -> None:
        """The partitions left this member: what was stored for them is history."""
        return None  # the consumer forgets them itself
