"""What a group writes, decided before anything is written: the sink's plan.

The fence says which partitions are still this member's; documents whose output record would be over
the output topic's limit become dead letters; the version guard drops what something newer already
superseded (``worker.steps.writing.versions``; in a share group, with the claims of
``worker.steps.writing.ordering``); and each model's collection gets the final operation
per document of the group, with the chunk counts it holds for them (what a shrunk or deleted
document leaves to delete). The result is a :class:`~worker.core.delivery.Planned` value, which a
retry of the same group carries over when its topics were already written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from worker.core.delivery import Planned
from worker.core.fence import Fence
from worker.core.records import Batch, DeadLetter, Delete, Entry, Item, TopicPartitionKey, headers_size
from worker.steps.writing.fit import TopicLimits, output_room, record_size
from worker.steps.writing.ordering import ShareOrder
from worker.steps.writing.output import OutputFormat
from worker.steps.writing.refusals import MILVUS_REJECTED, dead_letter, isolate
from worker.steps.writing.targets import ModelTarget, Plan
from worker.steps.writing.versions import VersionGuard, final_operations

#: An output record's headers by whether its vectors came from a cache, per model name.
Headers = dict[str, dict[bool, list[tuple[str, bytes]]]]


class Planner:
    """``plan(group)``: the group's :class:`Planned` writes, with each batch's ``fenced`` partitions.
    Sink thread. Marks each superseded entry; turns an oversized document into a dead letter in its
    batch, in place (``dead_lettered`` is told of each). ``order``: a share member's claims on the
    versions it writes (``worker.steps.writing.ordering``; None in a consumer group)."""

    def __init__(self, targets: dict[str, ModelTarget], fence: Fence, guard: VersionGuard, output: OutputFormat,
                 limits: TopicLimits, headers: Headers, dead_lettered: Callable[[str, str], None],
                 order: ShareOrder | None = None) -> None:
        self.targets = targets
        self.order = order
        self.fence = fence
        self.guard = guard
        self.output = output
        self.limits = limits
        self.headers = headers
        self.dead_lettered = dead_lettered
        #: Per model, the bytes of id and metadata below which its output records always fit
        #: (``worker.steps.writing.fit.output_room``): only a document past it is measured.
        self.output_rooms = {name: output_room(t.dim, limits.output, t.sparse.output_dims)
                             for name, t in targets.items()}

    def plan(self, group: list[Batch]) -> Planned:
        """Fence, oversized documents, version guard and each collection's final operations."""
        now = int(time.time() * 1000)
        self._dead_letter_oversized(group, now)
        fenced, entries, plans = self._news(group)
        # The reads above may have taken a while: a partition lost meanwhile may have a newer version
        # written by its new owner that they did not see, and the version guard would let the older one
        # through. Ownership (and the lease) are asked again; a change plans the group again.
        while any(self.fence.stale(batch) - left for batch, left in zip(group, fenced)):
            fenced, entries, plans = self._news(group)
        return Planned(group, entries, plans, now, fenced)

    def _dead_letter_oversized(self, group: list[Batch], now: int) -> None:
        """Turn each item whose output record would be over the output topic's limit into a dead
        letter (``output_too_large``), before anything of the group is written. Only a document whose
        id and metadata are past ``output_room`` can be that large: only those are encoded here (the
        validator marked them ``large``)."""
        for batch in group:
            for i, e in enumerate(batch.entries):
                if not isinstance(e, Item) or not e.large or e.original is None:
                    continue
                target = self.targets[e.model]
                size = (len(e.id.encode()) + sum(len(k.encode()) + len(v.encode()) for k, v in e.metadata.items())
                        + headers_size(e.headers))
                if size <= self.output_rooms[e.model]:
                    continue
                self.output.ready()
                key, headers = e.id.encode(), [*self.headers[e.model][False], *(e.headers or ())]
                largest = max(record_size(key, v, headers)
                              for v in self.output.values(e, target.model_id, target.dim, now))
                if largest > self.limits.output:
                    dead = batch.entries[i] = DeadLetter(
                        e.source, *e.original, "output_too_large",
                        f"its output record would be {largest:,} bytes (id, metadata and forwarded headers of "
                        f"{size:,} bytes), over the output topic's limit of {self.limits.output:,}")
                    self.dead_lettered(dead.reason, dead.message)

    def _news(self, group: list[Batch]) -> tuple[list[frozenset[TopicPartitionKey]], list[Entry], list[Plan]]:
        """Each batch's fenced partitions (no longer this member's: left unwritten), the entries to write
        (owned partitions, not superseded) and, per model's collection, the final operations and the
        chunk counts it holds for their documents. Marks each superseded entry (a tombstone:
        superseded in every collection)."""
        mine: list[Entry] = []
        fenced = [frozenset(self.fence.stale(batch)) for batch in group]
        for batch, left in zip(group, fenced):
            mine += [e for e in batch.entries if e.source.tp not in left] if left else batch.entries
        plans: dict[str, Plan] = {}
        for name, target in self.targets.items():
            ops = [e for e in mine if isinstance(e, Delete) or (isinstance(e, Item) and e.model == name)]
            if not ops:
                continue
            upserts, deletes = final_operations(ops)
            # an earlier version in this group of a document it deletes: its texts leave the cache too
            erased = {ch.hash for e in ops if isinstance(e, Item) and e.id in deletes for ch in e.chunks}
            plan = plans[name] = Plan(target, upserts, deletes, {}, erased=erased)
            refused = isolate(plan.documents, partial(self._read_versions, plan))
            if refused:  # Milvus will never read these: dead letters; the group is planned again without them
                dead_letter(group, {id(plan.entry(d)): m for d, m in refused.items()}, MILVUS_REJECTED, "Milvus",
                            self.dead_lettered)
                return self._news(group)
        # A record that looks superseded may come from a topic re-created since its id was read: ask
        # the broker once, and judge the group again under the new id (worker.steps.writing.versions).
        if self._mark_superseded(mine, plans) and self.guard.refresh():
            self._mark_superseded(mine, plans)
        for e in mine:  # (a newer version being written by another share member is not worth a warning)
            if isinstance(e, (Item, Delete)) and e.superseded and not any(e.id in p.newer_claimed
                                                                          for p in plans.values()):
                held = [p.stored[e.id][1] for p in plans.values() if e.id in p.stored]
                self.guard.tell(e.source, max((o for o in held if o is not None), default=None))
        for p in plans.values():
            p.upserts = {i: e for i, e in p.upserts.items() if not e.superseded}
            p.deletes = {i: e for i, e in p.deletes.items() if not self._superseded_in(e, p)}
        return fenced, [e for e in mine if not getattr(e, "superseded", False)], list(plans.values())

    def _read_versions(self, plan: Plan, docs: list[str]) -> None:
        """Read into ``plan`` the versions and chunk counts its collection holds for ``docs``; in a
        share group, claim their versions first and count live claims on newer ones as held."""
        if self.order is not None:
            self.order.claim(plan, docs)
        stored, counts = plan.target.store.versions(docs)
        plan.stored.update(stored)
        plan.counts.update(counts)
        if self.order is not None:
            self.order.judge(plan, docs)

    def _mark_superseded(self, mine: list[Entry], plans: dict[str, Plan]) -> bool:
        """Set each item's and tombstone's ``superseded`` (a tombstone: in every collection), by what
        Milvus holds or by a share member's live claim on a newer version; True if any is superseded
        by what Milvus holds (a claim is never a re-created topic's sign)."""
        found = False
        for e in mine:
            if isinstance(e, Item):
                by_rows = self.guard.superseded(e, plans[e.model].stored)
                e.superseded = by_rows or self._superseded_in(e, plans[e.model])
            elif isinstance(e, Delete):
                by_rows = all(self.guard.superseded(e, p.stored) for p in plans.values())
                e.superseded = all(self._superseded_in(e, p) for p in plans.values())
            else:
                continue
            found = found or by_rows
        return found

    def _superseded_in(self, e: Item | Delete, plan: Plan) -> bool:
        """``e`` is superseded in ``plan``'s collection: by what it holds, or by a claim on a newer version."""
        return e.id in plan.newer_claimed or self.guard.superseded(e, plan.stored)
