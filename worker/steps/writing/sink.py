"""Write a group of finished batches: Milvus, the output and dead-letter topics, and the cache.

A document is written as its chunks (``worker.steps.model.chunk``): a Milvus row and an output record per
chunk, and its chunks of an older version that the new one no longer has are deleted. A group is
written with one Milvus upsert and one delete per collection (the last operation per id across the
group wins). The cache is filled while Milvus writes, best-effort; it never fails a batch.

A group is written one way, whichever the delivery (``worker.core.delivery`` tells that order once:
the fence, the version guard, Milvus and the topics, the offsets); the delivery chosen at assembly
hands each group an attempt that says what its mode does at each step (a transaction begun and
committed, or records that are durable once acknowledged). Nothing older is written over something
newer: ``worker.core.fence`` and ``worker.steps.writing.versions`` say why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import Producer, TopicPartition

from connectors.kafka import DeliveryBatch
from connectors.milvus import MilvusStore
from connectors.milvus.schema import EXCERPT_CHARS, ChunkRows, chunk_id
from connectors.redis_cache import RedisCache
from schemas import sparse as sparse_modes
from schemas.errors import TransientError
from schemas.sparse import SparseMode
from worker.core.delivery import Delivery, Planned, written_offsets
from worker.core.fence import Fence
from worker.core.records import Batch, Chunk, DeadLetter, Delete, Entry, Item, Source, headers_size
from worker.process import metrics
from worker.steps.writing.fit import TopicLimits, dead_letter_record, output_room, record_size
from worker.steps.writing.output import OutputFormat
from worker.steps.writing.versions import VersionGuard, final_operations

log = logging.getLogger(__name__)


@dataclass
class ModelTarget:
    """Where a model's documents go: its collection, the model id and dim its records carry, its cache."""

    store: MilvusStore
    model_id: str
    dim: int
    cache: RedisCache | None = None
    #: The model's sparse mode: what a row carries beside its dense vector (the chunk's text for BM25,
    #: its sparse vector for a learned model) and how large an output record's sparse side can be.
    sparse: SparseMode = sparse_modes.OFF
    #: The headers of an output record, by whether it came from a cache (built once: the producer
    #: copies them at each ``produce``).
    headers: dict[bool, list[tuple[str, bytes]]] = field(init=False)

    def __post_init__(self) -> None:
        self.headers = {cached: [("embedstream.model", self.header), ("embedstream.cached", b"true" if cached
                                                                        else b"false")] for cached in (True, False)}

    @property
    def header(self) -> bytes:
        return self.model_id.encode()


@dataclass
class Plan:
    """One model's share of a group: the final operations for its collection and what it holds."""

    target: ModelTarget
    upserts: dict[str, Item]
    deletes: dict[str, Delete]
    counts: dict[str, int]
    stored: dict = field(default_factory=dict)


def chunk_rows(items: list[Item], source: Callable[[Source], str], sparse: SparseMode = sparse_modes.OFF) -> ChunkRows:
    """The Milvus rows of ``items``: one per chunk; ``source`` names where a record came from;
    ``sparse``: the model's sparse mode (what else each row carries)."""
    chunks = [(it, ch) for it in items for ch in it.chunks]
    vectors = [ch.vector for _, ch in chunks if ch.vector is not None]
    if len(vectors) != len(chunks):
        raise RuntimeError("a chunk reached the sink without a vector")  # a bug of the embed step
    return ChunkRows(
        doc_ids=[it.id for it, _ in chunks], chunk_index=[ch.index for _, ch in chunks],
        chunk_count=[len(it.chunks) for it, _ in chunks], span_start=[ch.start for _, ch in chunks],
        span_end=[ch.end for _, ch in chunks], excerpts=[ch.text[:EXCERPT_CHARS] for _, ch in chunks],
        vectors=np.array(vectors), hashes=[ch.hash for _, ch in chunks],
        metadata=[it.metadata for it, _ in chunks], sources=[source(it.source) for it, _ in chunks],
        offsets=[it.source.offset for it, _ in chunks],
        texts=[ch.text for _, ch in chunks] if sparse.rows_carry_text else None,
        sparse=_sparse_of(chunks) if sparse.learned else None)


def _sparse_of(chunks: list[tuple[Item, Chunk]]) -> list[tuple[np.ndarray, np.ndarray]]:
    out = [ch.sparse for _, ch in chunks if ch.sparse is not None]
    if len(out) != len(chunks):
        raise RuntimeError("a chunk reached the sink without its sparse vector")  # a bug of the embed step
    return out


class SinkStep:
    """``process(group)`` makes the batches durable; raises :class:`TransientError` to be retried.

    ``targets`` holds each model's collection and cache by model name (``Item.model``; one entry
    named "" without a model set). An item goes to its model's collection; a tombstone deletes its
    id from every collection (a document may be embedded by several models, each collection holding
    the newest record of the id that asked for its model)."""

    def __init__(self, targets: dict[str, ModelTarget], delivery: Delivery, *, fence: Fence,
                 guard: VersionGuard, output_topic: str, dlq_topic: str, delivery_timeout_s: float,
                 limits: TopicLimits | None = None, output: OutputFormat | None = None,
                 dead_lettered: Callable[[str, str], None] = lambda reason, message: None,
                 dead_letters: bool = True) -> None:
        self.targets = targets
        #: Whether dead letters are written to the DLQ topic (a migration's backfill re-reads records
        #: the live worker dead-lettered already: it skips them, writing them nowhere).
        self.dead_letters = dead_letters
        #: Told of each dead letter made here (``DlqLimit.record_late``: the breaker counts it).
        self.dead_lettered = dead_lettered
        #: A tombstone's ``embedstream.model`` header: the model when there is one, else every one.
        self._delete_header = b",".join(t.header for t in targets.values())
        #: How the group becomes durable (``worker.core.delivery``): at-least-once or exactly-once.
        self.delivery = delivery
        self.fence = fence
        #: How output values are encoded (EMBEDSTREAM_OUTPUT_FORMAT).
        self.output = output or OutputFormat()
        self.guard = guard
        self.output_topic = output_topic
        self.dlq_topic = dlq_topic
        self.delivery_timeout_s = delivery_timeout_s
        #: The largest record each topic takes: dead letters are cut to fit, output records over it are
        #: dead-lettered (``worker.steps.writing.fit``).
        self.limits = limits or TopicLimits()
        #: Per model, the bytes of id and metadata below which its output records always fit
        #: (``worker.steps.writing.fit.output_room``): only a document past it is measured.
        self.output_rooms = {name: output_room(t.dim, self.limits.output, t.sparse.output_dims)
                             for name, t in targets.items()}
        #: Per model, the headers of an output record by whether it came from a cache: the model's and
        #: the format's (a document's forwarded input headers follow them).
        self._headers = {name: {cached: [*hs, *self.output.headers] for cached, hs in t.headers.items()}
                         for name, t in targets.items()}
        self._milvus = ThreadPoolExecutor(1, thread_name_prefix="milvus-write")

    def close(self) -> None:
        """Release the Milvus writer thread and the producer (call once the step is no longer used)."""
        self._milvus.shutdown(wait=True)
        self.delivery.close()

    def process(self, group: list[Batch]) -> None:
        """Make ``group`` durable, in the order of ``worker.core.delivery``, through the attempt its
        delivery hands out; raises :class:`TransientError` to be retried."""
        attempt = self.delivery.attempt(group)
        if attempt.finished:
            return
        planned = attempt.carried or self.plan(group)
        write = self._milvus.submit(self._write_milvus, planned.plans, planned.now)
        t0 = time.perf_counter()
        try:
            producer = attempt.begin()
            if producer is not None:
                attempt.sent(self.produce(planned, producer))
                if attempt.durable_when_sent:
                    metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
            try:
                metrics.SINK_SECONDS.labels("milvus").observe(write.result())  # raises Milvus' error
            except TransientError:
                attempt.milvus_failed(planned)
                raise
            with attempt.holding():
                attempt.commit(self.owned_offsets(group))
            if not attempt.durable_when_sent:
                metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
        except BaseException as exc:
            wait([write])  # never leave a write running behind a retry: one writer at a time
            failure = attempt.abort(exc)
            if failure is exc:
                raise
            raise failure from None
        for plan in planned.plans:
            metrics.MODEL_DOCUMENTS.labels(plan.target.model_id).inc(len(plan.upserts))

    def plan(self, group: list[Batch]) -> Planned:
        """Fence, oversized documents, version guard and each collection's final operations."""
        now = int(time.time() * 1000)
        self._dead_letter_oversized(group, now)
        entries, plans = self._news(group)
        self.fence.check()  # the Strong reads above may have taken a while
        return Planned(group, entries, plans, now)

    def _write_milvus(self, plans: list[Plan], now: int) -> float:
        """Each model's collection, in turn (``_write_collection``); returns the seconds."""
        t0 = time.perf_counter()
        for plan in plans:
            self._write_collection(plan, now)
        return time.perf_counter() - t0

    def _write_collection(self, plan: Plan, now: int) -> None:
        """Make a collection hold exactly the chunks of each document's final operation.

        ``counts`` (how many chunks each document's rows say it has, read with the versions) names the
        rows to remove: a deleted document's, and the chunks past the end of one that shrank. The
        order keeps a crash at any point redoable by the replay: deletes are recorded first; a
        document's chunk 0, which carries the count that names its other rows, goes last (deleted
        after its other chunks, rewritten after its stale chunks are gone)."""
        store, upserts, deletes, counts = plan.target.store, plan.upserts, plan.deletes, plan.counts
        if deletes:
            store.record_deletes(list(deletes), ([self.guard.source(d.source) for d in deletes.values()],
                                                 [d.source.offset for d in deletes.values()]), now)
        stale = [chunk_id(doc, k) for doc, it in upserts.items() for k in range(len(it.chunks), counts.get(doc, 0))]
        stale += [chunk_id(doc, k) for doc in deletes for k in range(1, counts.get(doc, 1))]
        store.delete(stale)
        store.delete([chunk_id(doc, 0) for doc in deletes])
        if upserts:
            store.upsert_chunks(chunk_rows(list(upserts.values()), self.guard.source,
                                            plan.target.sparse), plan.target.model_id, now)

    def produce(self, planned: Planned, producer: Producer) -> DeliveryBatch:
        """Hand every output and dead-letter record of the group to ``producer`` (not yet confirmed),
        then fill the caches; the lease is checked before each document. A document's chunks go out
        in order, under its id."""
        now = planned.now
        self.output.ready()  # before any record: an outage of the registry then repeats none
        delivery = DeliveryBatch(producer, self.delivery_timeout_s)
        for e in planned.entries:
            self.fence.check()
            if isinstance(e, Item):
                key, target, by_cached = e.id.encode(), self.targets[e.model], self._headers[e.model]
                values = self.output.values(e, target.model_id, target.dim, now)
                for ch, encoded in zip(e.chunks, values):
                    hs = by_cached[ch.cached]
                    delivery.produce(self.output_topic, key, encoded, [*hs, *e.headers] if e.headers else hs)
            elif isinstance(e, Delete):
                delivery.produce(self.output_topic, e.id.encode(), None,
                                 [("embedstream.model", self._delete_header), *(e.headers or ())])
            elif self.dead_letters:
                dlq_key, value, headers = dead_letter_record(e, self.limits.dlq)
                delivery.produce(self.dlq_topic, dlq_key, value, headers, what=f"the dead letter ({e.reason}) of "
                                 f"{e.source.topic} partition {e.source.partition} offset {e.source.offset}")
        self._fill_caches(planned.group)
        return delivery

    def _dead_letter_oversized(self, group: list[Batch], now: int) -> None:
        """Turn each item whose output record would be over the output topic's limit into a dead
        letter (``output_too_large``), before anything of the group is written. Only a document whose
        id and metadata are past ``output_room`` can be that large: only those are encoded here (the
        validator kept their original record: ``keep_original``)."""
        for batch in group:
            for i, e in enumerate(batch.entries):
                if not isinstance(e, Item) or e.original is None:
                    continue
                target = self.targets[e.model]
                size = (len(e.id.encode()) + sum(len(k.encode()) + len(v.encode()) for k, v in e.metadata.items())
                        + headers_size(e.headers))
                if size <= self.output_rooms[e.model]:
                    continue
                self.output.ready()
                key, headers = e.id.encode(), [*self._headers[e.model][False], *(e.headers or ())]
                largest = max(record_size(key, v, headers)
                              for v in self.output.values(e, target.model_id, target.dim, now))
                if largest > self.limits.output:
                    dead = batch.entries[i] = DeadLetter(
                        e.source, *e.original, "output_too_large",
                        f"its output record would be {largest:,} bytes (id, metadata and forwarded headers of "
                        f"{size:,} bytes), over the output topic's limit of {self.limits.output:,}")
                    self.dead_lettered(dead.reason, dead.message)

    def _fill_caches(self, group: list[Batch]) -> None:
        """Each model's fresh vectors into its cache. A vector depends only on the text and the model,
        so the cache may be filled before the batches are durable: it is, while Milvus writes."""
        for name, target in self.targets.items():
            fresh = {h: v for batch in group for h, v in batch.fresh.get(name, {}).items()}
            if target.cache is not None and fresh:
                target.cache.set_many(fresh)

    def _news(self, group: list[Batch]) -> tuple[list[Entry], list[Plan]]:
        """The entries to write (owned partitions, not superseded) and, per model's collection, the
        final operations and the chunk counts it holds for their documents. Marks each batch's
        ``fenced`` partitions and each superseded entry (a tombstone: superseded in every collection)."""
        mine: list[Entry] = []
        for batch in group:
            batch.fenced = self.fence.stale(batch)
            mine += [e for e in batch.entries if e.source.tp not in batch.fenced] if batch.fenced else batch.entries
        plans: dict[str, Plan] = {}
        for name, target in self.targets.items():
            ops = [e for e in mine if isinstance(e, Delete) or (isinstance(e, Item) and e.model == name)]
            if not ops:
                continue
            upserts, deletes = final_operations(ops)
            stored, counts = target.store.versions([*upserts, *deletes])
            plans[name] = Plan(target, upserts, deletes, counts, dict(stored))
        # A record that looks superseded may come from a topic re-created since its id was read: ask
        # the broker once, and judge the group again under the new id (worker.steps.writing.versions).
        if self._mark_superseded(mine, plans) and self.guard.refresh():
            self._mark_superseded(mine, plans)
        for e in mine:
            if isinstance(e, (Item, Delete)) and e.superseded:
                held = [p.stored[e.id][1] for p in plans.values() if e.id in p.stored]
                self.guard.tell(e.source, max((o for o in held if o is not None), default=None))
        for p in plans.values():
            p.upserts = {i: e for i, e in p.upserts.items() if not e.superseded}
            p.deletes = {i: e for i, e in p.deletes.items() if not self.guard.superseded(e, p.stored)}
        return [e for e in mine if not getattr(e, "superseded", False)], list(plans.values())

    def _mark_superseded(self, mine: list[Entry], plans: dict[str, Plan]) -> bool:
        """Set each item's and tombstone's ``superseded`` (a tombstone: in every collection); True if any is."""
        found = False
        for e in mine:
            if isinstance(e, Item):
                e.superseded = self.guard.superseded(e, plans[e.model].stored)
            elif isinstance(e, Delete):
                e.superseded = all(self.guard.superseded(e, p.stored) for p in plans.values())
            found = found or getattr(e, "superseded", False)
        return found

    def owned_offsets(self, group: list[Batch]) -> list[TopicPartition]:
        """The group's ``written_offsets`` to commit; raises :class:`TransientError` when one of their
        partitions left this member during the transaction, or left and came back (the redo leaves
        its records to its new owner, or to this member's new reading of them)."""
        offsets = written_offsets(group)
        gone = sorted({p for batch in group for _, p in self.fence.stale(batch) - batch.fenced})
        if gone:
            raise TransientError("fence", f"partitions {gone} were revoked or lost during the transaction: "
                                 "redoing the group without them")
        return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
