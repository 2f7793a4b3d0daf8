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

Sources of two kinds meet in old collections: rows written while the worker named every source by
its topic *name* (``documents:3``: a broker without topic ids, or a worker from before topic ids
were read) and records named by the topic's *id*. Two sources compare only when they are equal, so
a name-source row never supersedes an id-source record, nor the other way round: the first record of
an id from a topic known by its id is always written, whatever its offset, and from then on its row
carries the id-source that later replays compare with. A broker that gives no topic ids leaves the
guard on names: a deleted-and-recreated topic then starts again at offset 0 under the same source,
and its records count as older than the rows the old topic left (the worker says so at start-up).

The ids are read at start-up, and again whenever a group holds a record that looks superseded
(``refresh``): a topic deleted and re-created while the worker runs keeps its assignment (the
consumer only finds its offset out of range and starts again at 0), so a stale id shows first as
records older than what Milvus holds. The sink then asks the broker once, and judges the group again
with the new id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from worker.core.records import Delete, Entry, Item, Source

log = logging.getLogger(__name__)

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
    """``source(src)`` names a record's log and partition; ``superseded`` compares with Milvus.

    ``lookup`` (optional) reads the topic ids again (``connectors.kafka.topic_ids``): ``refresh``
    calls it. ``tell`` is the warning for a record judged superseded, at most once a ``warn_every``
    seconds per partition (``embedstream_messages_total{outcome="superseded"}`` counts them all): a
    replay after a crash or a rebalance makes a few; many, or steadily, mean the partition's offsets
    went back (a re-created topic on a broker without topic ids)."""

    def __init__(self, topic_ids: Mapping[str, str], lookup: Callable[[], Mapping[str, str]] | None = None,
                 warn_every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        #: topic name → topic id (a topic without a known id is named by its name)
        self.topic_ids = dict(topic_ids)
        self._lookup = lookup
        self._warn_every = warn_every
        self._clock = clock
        #: per source: (when last warned, records superseded since then)
        self._told: dict[str, tuple[float, int]] = {}

    def refresh(self) -> bool:
        """Read the topic ids again; True when one changed (a topic deleted and re-created: its
        records are a new source from now on). Ids the look-up does not find are kept."""
        if self._lookup is None:
            return False
        found = dict(self._lookup())
        changed = {t: tid for t, tid in found.items() if self.topic_ids.get(t) != tid}
        for topic, tid in changed.items():
            log.warning("topic %r has a new id (%s, was %s): it was deleted and re-created; its records are a new "
                        "source for the version guard and overwrite what the old topic wrote",
                        topic, tid, self.topic_ids.get(topic))
        self.topic_ids = {**self.topic_ids, **found}
        return bool(changed)

    def source(self, src: Source) -> str:
        return f"{self.topic_ids.get(src.topic, src.topic)}:{src.partition}"

    def superseded(self, entry: Item | Delete, stored: Stored) -> bool:
        """A newer record of ``entry.id`` from the same partition is already in Milvus."""
        have = stored.get(entry.id)
        if have is None or have[1] is None:
            return False
        return have[0] == self.source(entry.source) and have[1] > entry.source.offset

    def tell(self, src: Source, stored_offset: int | None) -> None:
        """The rate-limited warning for a record of ``src`` judged superseded (Milvus holds ``stored_offset``)."""
        source = self.source(src)
        now = self._clock()
        last, count = self._told.get(source, (None, 0))
        count += 1
        if last is not None and now - last < self._warn_every:
            self._told[source] = (last, count)
            return
        self._told[source] = (now, 0)
        log.warning("partition %s[%d]: %d record(s) skipped as older than what Milvus holds (the last at offset "
                    "%d, Milvus holds offset %s of the same source). A replay after a crash or a rebalance makes "
                    "a few; if the topic was re-created and the broker gives no topic ids, these are updates "
                    "that were not written", src.topic, src.partition, count, src.offset, stored_offset)
