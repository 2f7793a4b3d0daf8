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

An outage (``TransientError``) is never split: it goes up, and the whole group is retried.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from schemas.errors import Refused
from worker.core.records import Batch, DeadLetter, Delete, Item

K = TypeVar("K", bound=Hashable)

#: The dead-letter reason of a record Milvus refused for good.
MILVUS_REJECTED = "milvus_rejected"


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


def dead_letter(group: list[Batch], refused: dict[int, str], system: str,
                told: Callable[[str, str], None]) -> int:
    """Turn each entry of ``group`` whose ``id()`` is in ``refused`` into its dead letter
    (``milvus_rejected``; the message says what ``system`` answered), in its batch, in place; ``told``
    hears of each (the DLQ breaker counts them). Returns how many were turned."""
    turned = 0
    for batch in group:
        for i, e in enumerate(batch.entries):
            answer = refused.get(id(e))
            if answer is None or not isinstance(e, (Item, Delete)):
                continue
            if isinstance(e, Item) and e.original is not None:
                key, value, headers = e.original
            else:  # a tombstone: its key names it, its value is null
                key, value, headers = e.id.encode(), None, getattr(e, "headers", None)
            message = f"{system} refused it for good: {answer}"
            batch.entries[i] = DeadLetter(e.source, key, value, headers, MILVUS_REJECTED, message)
            told(MILVUS_REJECTED, message)
            turned += 1
    return turned
