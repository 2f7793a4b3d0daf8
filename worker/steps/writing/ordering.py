"""A share group's write order: Milvus ends at each document's newest version, whichever member
writes it and in whatever order the writes land.

In a consumer group one member owns a document's partition, and the version guard (read, then
write: ``worker.steps.writing.versions``) is enough. A share group may hand two versions of one
document to two members at once, and an upsert is last-write-wins: the older version wins when its
member read before the newer was written and wrote after it. So the members claim what they write
(``connectors.milvus.claims``: a row per document and version, which no other version overwrites):

1. **Claim, then read** (planning). A member claims each document's version, reads the versions
   Milvus holds, then the claims on its documents. A live claim on a newer version from the same
   source supersedes its entry as a newer row would: that member writes it (or, dead, its record is
   delivered again).
2. **Write, then settle.** Once its rows are in, the member reads the claims again.
   - An older version still being written (claimed, not written, live) may land after this one: it
     waits until that member has written or its claim has run out.
   - Where an older version was claimed at all, it reads the rows again and writes its own again if
     they hold the older one (or none, an older delete having landed last).
   - It removes the older claims it checked, and its own; where a newer version is claimed, it marks
     its own written instead (the newer member then checks, and removes it).

Of two members writing two versions, whichever reads the claims last sees the other's claim: the
older one then drops its entry, the newer one waits and checks. Waiting goes only from newer to
older versions, so it ends. A claim is *live* for ``expiry_s`` after it was made: the records'
lock and one write's timeout. A member whose records' lock ran out writes nothing more of them
(``worker.core.fence``; ``settle`` asks ``may_write`` before writing again), so an older claim is a
member that died or gave its records back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from connectors.milvus.claims import Claim
from schemas.errors import TransientError
from worker.core.records import Item, Source
from worker.steps.writing.targets import Plan

log = logging.getLogger(__name__)

#: A version as Milvus holds it: ``(source, source_offset)``.
Version = tuple[str | None, int | None]


def claim_expiry(lock_s: float | None, write_timeout_s: float) -> float:
    """How long a claim is live: the records' lock (Apache Kafka's default of 30 s when it is not
    known), one write's timeout, and a second for the clocks of two machines."""
    return (30.0 if lock_s is None else lock_s) + write_timeout_s + 1.0


def _newer_than(held: Version | None, claim: Claim) -> bool:
    """``held`` is a later version of the same source than ``claim``'s."""
    return held is not None and held[0] == claim.source and held[1] is not None and held[1] > claim.offset


def _older_than(held: Version | None, claim: Claim) -> bool:
    """``held`` is an earlier version of the same source than ``claim``'s."""
    return held is not None and held[0] == claim.source and held[1] is not None and held[1] < claim.offset


class ShareOrder:
    """The claims of one share member's sink (the module doc). ``source`` names a record's log and
    partition as the version guard does; ``clock`` is wall-clock seconds (a claim's time is read by
    other members: ``time.time``), ``sleep`` waits between reads of the claims."""

    def __init__(self, source: Callable[[Source], str], expiry_s: float, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.05) -> None:
        self.source = source
        self.expiry_s = expiry_s
        self._clock = clock
        self._sleep = sleep
        self.poll_s = poll_s

    def claim(self, plan: Plan, docs: list[str]) -> None:
        """Claim the version ``plan`` writes of each of ``docs`` (before their versions are read)."""
        at_ms = int(self._clock() * 1000)
        claims = [Claim(d, self.source(plan.entry(d).source), plan.entry(d).source.offset, at_ms) for d in docs]
        plan.target.store.claim(claims)
        plan.claimed.update({c.doc: c for c in claims})

    def judge(self, plan: Plan, docs: list[str]) -> None:
        """After the versions of ``docs`` are read: each of them with a live claim on a newer version
        goes into ``plan.newer_claimed`` (the planner supersedes its entry)."""
        for c in self._others(plan, plan.target.store.claims(docs)):
            if c.offset > plan.claimed[c.doc].offset and self._live(c):
                plan.newer_claimed.add(c.doc)

    def settle(self, plan: Plan, written: set[str], write: Callable[[Plan], None],
               may_write: Callable[[], bool]) -> None:
        """After ``plan``'s rows of ``written`` are in (its other claimed documents were superseded or
        refused: their claims are only removed): wait for older versions still being written, write
        again what they overwrote, and leave the claims as the module doc says. Raises
        :class:`TransientError` when a write is needed again but the records' lock has run out."""
        mine, store = plan.claimed, plan.target.store
        if not mine:
            return
        deadline = self._clock() + self.expiry_s
        while True:
            others = self._others(plan, store.claims(sorted(written))) if written else []
            older = [c for c in others if c.offset < mine[c.doc].offset]
            if self._clock() > deadline or not any(not c.written and self._live(c) for c in older):
                break
            self._sleep(self.poll_s)
        newer = {c.doc for c in others if c.offset > mine[c.doc].offset and self._live(c)}
        checked = sorted({c.doc for c in older} - newer)
        if checked:
            self._write_again(plan, checked, write, may_write)
        kept = [replace(mine[d], written=True) for d in sorted(newer & written)]
        store.claim(kept)
        store.unclaim([c.id for d, c in mine.items() if d not in newer or d not in written]
                      + [c.id for c in older])
        plan.claimed = {}

    def _write_again(self, plan: Plan, docs: list[str], write: Callable[[Plan], None],
                     may_write: Callable[[], bool]) -> None:
        """Write again each of ``docs`` whose rows an older version overwrote (an older delete: its
        rows gone), unless something newer landed since."""
        deleted, rows, counts = plan.target.store.version_parts(docs)
        again = []
        for d in docs:
            mine = plan.claimed[d]
            if _newer_than(deleted.get(d), mine) or _newer_than(rows.get(d), mine):
                continue
            row = rows.get(d)
            if isinstance(plan.entry(d), Item):
                lost = row is None or _older_than(row, mine)
            else:
                lost = _older_than(row, mine)
            if lost:
                again.append(d)
        if not again:
            return
        if not may_write():
            raise TransientError("fence", f"{len(again)} document(s) need writing again after an older version "
                                 "landed, but their records' lock ran out: left to the member they go to next")
        redo = plan.only(again)
        redo.counts = {d: counts[d] for d in again if d in counts}
        write(redo)
        log.info("%d document(s) written again: an older version, written by another member of the share group, "
                 "had landed after this one", len(again))

    def _others(self, plan: Plan, claims: list[Claim]) -> list[Claim]:
        """The claims of other versions from the same source as ``plan``'s own (versions of other
        sources are not comparable: the guard's rule)."""
        mine = plan.claimed
        return [c for c in claims if c.doc in mine and c.id != mine[c.doc].id and c.source == mine[c.doc].source]

    def _live(self, claim: Claim) -> bool:
        return self._clock() * 1000 - claim.at_ms <= self.expiry_s * 1000
