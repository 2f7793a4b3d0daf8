"""Refusals: the records an outside system will never take, found by halves and dead-lettered.

A Milvus write (or read) of a group fails whole when one row of it is refused: a value over a field's
limit, a vector Milvus will not store. Retrying the group would be refused the same way for ever, and
every record behind it would wait. :func:`isolate` runs the same call on each half of the group's
documents, and on halves of the refused halves, until each refused document is alone (a group of
``n`` documents with ``k`` refused ones takes about ``2·k·log2(n)`` calls); every call that went
through wrote its documents (the writes are idempotent upserts, so a document written by a half and
again by the retry of the group ends the same). :func:`dead_letter` then turns the refused documents'
entries into dead letters (``milvus_rejected``, with the system's message) in their batches, so that
the group's next attempt writes the rest and dead-letters these.

The output topic's producer is met the same way (:class:`Refusals`): a broker refuses a produce
request's records together, so a record refused beside others is produced again alone, and one refused
alone is its input record's dead letter.

An outage (``TransientError``) is never split: it goes up, and the whole group is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from connectors.kafka import OutputRefused
from schemas.errors import Refused, TransientError
from worker.core.records import Batch, DeadLetter, Delete, Entry, Item

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

#: The dead-letter reason of a record Milvus refused for good.
MILVUS_REJECTED = "milvus_rejected"
#: The dead-letter reason of a record whose output record the output topic refused for good (its form or
#: the topic's policy; one over the topic's size limit is found before anything is written:
#: ``output_too_large``). Its Milvus rows were written: the message says so.
OUTPUT_REJECTED = "output_rejected"


def isolate(keys: Sequence[K], run: Callable[[list[K]], None]) -> dict[K, str]:
    """Run ``run(keys)``; where it raises :class:`Refused`, run each half again, down to single keys.
    Returns each key refused alone, with the refusal's message; ``run`` went through for every other
    key. ``TransientError`` (and anything else) propagates."""
    keys = list(keys)
    if not keys:
        return {}
    try:
        run(keys)
        return {}
    except Refused as exc:
        if len(keys) == 1:
            return {keys[0]: exc.message}
    middle = len(keys) // 2
    return {**isolate(keys[:middle], run), **isolate(keys[middle:], run)}


def dead_letter(group: list[Batch], refused: dict[int, str], reason: str, system: str,
                told: Callable[[str, str], None], note: str = "") -> int:
    """Turn each entry of ``group`` whose ``id()`` is in ``refused`` into its dead letter (``reason``;
    the message says what ``system`` answered, then ``note``), in its batch, in place; ``told`` hears of
    each (the DLQ breaker counts them). Returns how many were turned."""
    turned = 0
    for batch in group:
        for i, e in enumerate(batch.entries):
            answer = refused.get(id(e))
            if answer is None or not isinstance(e, (Item, Delete)):
                continue
            if isinstance(e, Item) and e.original is not None:
                key, value, headers = e.original
            else:  # a tombstone: its key names it, its value is null
                key, value, headers = e.id.encode(), None, e.headers
            message = f"{system} refused it for good: {answer}{note}"
            batch.entries[i] = DeadLetter(e.source, key, value, headers, reason, message)
            told(reason, message)
            turned += 1
    return turned


#: How a dead letter's message names the output topic's producer as the system that refused.
OUTPUT_TOPIC = "the output topic"


class Refusals:
    """What the sink does with the records Milvus or the output topic refuse for good: each of its
    methods turns them into dead letters in their batches and returns the error that makes the stage
    write the group again, whole. At least once, that retry produces the group's records again (a
    duplicate of each on the output topic) with these in the DLQ; under exactly-once the attempt's
    transaction is aborted, so a reader of committed records sees neither twice. A document Milvus
    refused may have an output record from the attempt that found it (at least once); one the output
    topic refused has its Milvus rows, which its dead letter says. ``told`` hears of each dead letter."""

    def __init__(self, told: Callable[[str, str], None]) -> None:
        self.told = told
        #: Entries (by ``id()``) whose output records the topic refused beside others: produced alone
        #: until judged.
        self._suspects: set[int] = set()

    def alone(self, entry: Entry) -> bool:
        """Whether ``entry``'s records go out in a produce request of their own."""
        return id(entry) in self._suspects

    def milvus(self, group: list[Batch], refused: dict[int, str]) -> TransientError:
        """Milvus refused these entries' documents (by ``id()``, with its answer) and took the rest."""
        return self._dead(group, refused, MILVUS_REJECTED, "Milvus", "")

    def output(self, group: list[Batch], refusal: OutputRefused) -> TransientError:
        """The output topic refused some records for good: those refused beside others are produced
        again alone first; one refused alone is its document's dead letter (``output_too_large`` or
        ``output_rejected``)."""
        found = {**refusal.too_large, **refusal.refused}
        if not set(found) <= self._suspects:
            self._suspects |= set(found)
            _undelivered(group)
            log.warning("the output topic refused %d record(s) for good (first: %s): producing each alone to "
                        "find those it refuses", len(found), next(iter(found.values())))
            return TransientError("output", f"{len(found)} record(s) refused: producing them alone")
        self._suspects -= set(found)
        note = " (its Milvus rows were written; replay this record once the topic takes it)"
        self._dead(group, refusal.too_large, "output_too_large", OUTPUT_TOPIC, note)
        return self._dead(group, refusal.refused, OUTPUT_REJECTED, OUTPUT_TOPIC, note)

    def _dead(self, group: list[Batch], refused: dict[int, str], reason: str, system: str,
              note: str) -> TransientError:
        n = dead_letter(group, refused, reason, system, self.told, note)
        _undelivered(group)
        if refused:
            log.warning("%s refused %d record(s) for good (first: %s): dead-lettering them (%s) and writing the "
                        "rest of the group", system, n, next(iter(refused.values())), reason)
        return TransientError(reason.split("_")[0], f"the record(s) {system} refused for good were dead-lettered: "
                                                    "writing the group again without them")


def _undelivered(group: list[Batch]) -> None:
    """The group's records go out again at its retry (its dead letters among them)."""
    for batch in group:
        batch.delivered = False
