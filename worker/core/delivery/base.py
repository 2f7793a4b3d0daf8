"""The delivery interface, and what the sink offers it (the order they follow: ``worker.core.delivery``)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

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


class GroupWriter(Protocol):
    """The steps of writing a group, which the sink offers and a delivery puts in order."""

    def plan(self, group: list[Batch]) -> Planned:
        """Fence, version guard and the final operations; raises ``FenceClosed`` past the lease."""

    def write_milvus(self, planned: Planned) -> Future:
        """Start Milvus' writes on the helper thread; the future's result is their seconds (or raises)."""

    def produce(self, planned: Planned, producer: Producer) -> DeliveryBatch:
        """Hand the group's output and dead-letter records to ``producer`` (not yet confirmed), and
        fill the caches."""

    def owned_offsets(self, group: list[Batch]) -> list[TopicPartition]:
        """The next offsets of the group's written entries; raises ``TransientError`` when one of
        their partitions left this member."""

    def written_offsets(self, group: list[Batch]) -> dict[TopicPartitionKey, int]:
        """The next offset per partition of the group's written entries (fenced ones left out)."""

    def written(self, planned: Planned) -> None:
        """Count what the group wrote."""


class Delivery(abc.ABC):
    """How a group's records and its input offsets become durable together.

    ``write`` runs on the sink thread; ``store``, ``commit``, ``recommit``, ``barrier``,
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
    def write(self, group: list[Batch], writer: GroupWriter) -> None:
        """Make ``group`` durable in the order of ``worker.core.delivery``; raises ``TransientError`` to be
        retried whole."""

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
