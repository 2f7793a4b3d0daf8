"""The delivery interface, and the attempt at a group it hands the sink (the order: ``worker.core.delivery``)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from confluent_kafka import Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from worker.core.records import Batch, Entry, TopicPartitionKey, Written


@dataclass
class Planned:
    """A group's writes as the sink planned them: the entries to produce (owned partitions, not
    superseded), each collection's final operations, the time stamped on the rows, and per batch of
    the group the partitions it leaves unwritten (``Written.fenced``)."""

    group: list[Batch]
    entries: list[Entry]
    plans: list
    now: int
    fenced: list[frozenset[TopicPartitionKey]]

    def written(self, committed: dict[TopicPartitionKey, int]) -> list[Written]:
        """What the sink hands back with each batch of the group, ``committed`` with it."""
        return [Written(fenced, committed) for fenced in self.fenced]


def written_offsets(group: list[Batch], fenced: Sequence[frozenset[TopicPartitionKey]] | None = None
                    ) -> dict[TopicPartitionKey, int]:
    """The next offset per partition of the group's written entries: those of each batch's ``fenced``
    partitions (None: none) left out."""
    offsets: dict[TopicPartitionKey, int] = {}
    for i, batch in enumerate(group):
        for tp, o in Written(fenced[i] if fenced is not None else frozenset()).offsets(batch).items():
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
        with attempt.holding(): committed = attempt.commit(the group's offsets, if still owned)
        each batch is handed on with what was committed (Written.committed), to the ledger
        on any failure: raise attempt.abort(exc)

    The attempt never calls the sink: it is handed what it needs."""

    #: What an earlier attempt planned and produced (its records still in an open transaction);
    #: None: plan the group anew.
    carried: Planned | None = None
    #: Nothing is left to do: an earlier attempt's commit went through after all.
    finished: bool = False
    #: What that earlier commit committed (``finished`` only).
    committed: dict[TopicPartitionKey, int] | None = None
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
    def commit(self, offsets: list[TopicPartition]) -> dict[TopicPartitionKey, int]:
        """The group is written: commit ``offsets`` with it, or leave them to the polling thread's
        ledger. Returns what it committed (next offset per partition; empty when it left them)."""

    def abort(self, exc: BaseException) -> BaseException:
        """The attempt failed with ``exc``: undo what must be undone; returns what to raise."""
        return exc


class Delivery(abc.ABC):
    """How a group's records and its input offsets become durable together: the sink thread's half
    (the polling thread's is the ledger, ``worker.core.ledger``, chosen with it at assembly)."""

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
