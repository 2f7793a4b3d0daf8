"""Which operations of a group are still news: the last per id, and none older than Milvus holds.

The *version guard*: every row in Milvus carries the version it holds — the input log and partition
it came from (``source`` = ``<topic id>:<partition>``) and its offset there (``source_offset``).
An operation whose source equals a row's and whose offset is lower is *superseded*: a newer record
of that id from the same partition was already written (by this member earlier, or by the member
that took the partition over while this one was frozen). Superseded operations are written nowhere,
neither to Milvus nor to the output topic, and count as done. Offsets are comparable only within a
partition of one topic; the topic's id (not its name) makes a deleted-and-recreated topic a new
source rather than an old one. A delete leaves no row, so its version is kept in the collection's
companion of deletes (``MilvusStore.versions`` reads both): a replay of an upsert older than the
delete (a crash between the two, a rebalance) neither brings the row back nor shows the old version
on the output topic after the tombstone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from worker.core.records import Delete, Entry, Item, Source

#: ``{id: (source, source_offset)}`` as Milvus holds them (either may be None on an old row).
Stored = Mapping[str, tuple[str | None, int | None]]


def final_operations(entries: Iterable[Entry]) -> tuple[dict[str, Item], dict[str, Delete]]:
    """Per id, the last operation wins: ``(upserts by id, deletes by id)``; ids are never in both."""
    last: dict[str, Item | Delete] = {}
    for e in entries:
        if isinstance(e, (Item, Delete)):
            last[e.id] = e
    upserts = {i: e for i, e in last.items() if isinstance(e, Item)}
    deletes = {i: e for i, e in last.items() if isinstance(e, Delete)}
    return upserts, deletes


class VersionGuard:
    """``source(src)`` names a record's log and partition; ``superseded`` compares with Milvus."""

    def __init__(self, topic_ids: Mapping[str, str]) -> None:
        #: topic name → topic id (a topic without a known id is named by its name)
        self.topic_ids = dict(topic_ids)

    def source(self, src: Source) -> str:
        return f"{self.topic_ids.get(src.topic, src.topic)}:{src.partition}"

    def superseded(self, entry: Item | Delete, stored: Stored) -> bool:
        """A newer record of ``entry.id`` from the same partition is already in Milvus."""
        have = stored.get(entry.id)
        if have is None or have[1] is None:
            return False
        return have[0] == self.source(entry.source) and have[1] > entry.source.offset
