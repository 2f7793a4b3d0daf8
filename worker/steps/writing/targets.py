"""Where a model's documents go, and how its collection is made to hold them.

A :class:`ModelTarget` per model: its collection, the id and dim its records carry, its cache and its
sparse mode. :func:`write_collection` applies one model's planned operations (a :class:`Plan`, made
by ``worker.steps.writing.planning``) to its collection in an order a crash at any point can redo;
:func:`chunk_rows` makes the rows, one per chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from connectors.milvus import MilvusStore
from connectors.milvus.schema import EXCERPT_CHARS, ChunkRows, chunk_id
from connectors.redis_cache import RedisCache
from schemas import sparse as sparse_modes
from schemas.sparse import SparseMode
from worker.core.records import Chunk, Delete, Item, Source

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


def erase_cached(plan: Plan) -> None:
    """Remove from the model's cache the texts of the documents ``plan`` deletes: every chunk its rows
    hold (read from Milvus) and the group's own earlier versions (``plan.erased``). A cache that
    fails the call keeps them until their TTL (``EMBEDSTREAM_CACHE_TTL_SECONDS``), which a warning
    says; ``embedstream erase`` reports what is left."""
    cache = plan.target.cache
    if cache is None:
        return
    # only documents whose rows the versions read found: an id never written has nothing cached
    held = plan.target.store.content_hashes([chunk_id(doc, k) for doc in plan.deletes
                                              for k in range(plan.counts.get(doc, 0))])
    hashes = held | plan.erased
    if hashes and not cache.delete_many(hashes):
        log.warning("cache: %d entries of %d deleted documents could not be removed; they expire within "
                    "EMBEDSTREAM_CACHE_TTL_SECONDS", len(hashes), len(plan.deletes))


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


@dataclass
class Plan:
    """One model's share of a group: the final operations for its collection and what it holds."""

    target: ModelTarget
    upserts: dict[str, Item]
    deletes: dict[str, Delete]
    counts: dict[str, int]
    stored: dict = field(default_factory=dict)
    #: The content hashes of this group's earlier versions of the documents it deletes (dropped by
    #: the last operation): removed from the cache with the stored rows' (``write_collection``), and
    #: never filled (``SinkStep``).
    erased: set[str] = field(default_factory=set)
    #: In a share group, the version it claimed of each document (``worker.steps.writing.ordering``),
    #: and the documents of which another member claims a newer version (they supersede this one's).
    claimed: dict = field(default_factory=dict)
    newer_claimed: set[str] = field(default_factory=set)

    @property
    def documents(self) -> list[str]:
        """The ids of the documents it writes (upserted or deleted)."""
        return [*self.upserts, *self.deletes]

    def entry(self, doc: str) -> Item | Delete:
        """The entry whose operation it writes for ``doc``."""
        return self.upserts[doc] if doc in self.upserts else self.deletes[doc]

    def only(self, docs: list[str]) -> Plan:
        """The same writes for ``docs`` alone (a half of the plan, to find the rows Milvus refuses);
        the versions read are left behind: the writes do not read them."""
        keep = set(docs)
        return Plan(self.target, {d: e for d, e in self.upserts.items() if d in keep},
                    {d: e for d, e in self.deletes.items() if d in keep},
                    {d: c for d, c in self.counts.items() if d in keep},
                    erased=self.erased if keep & set(self.deletes) else set())


def write_collection(plan: Plan, source: Callable[[Source], str], now: int) -> None:
    """Make a collection hold exactly the chunks of each document's final operation (``source``
    names where a record came from: ``VersionGuard.source``).

    ``counts`` (how many chunks each document's rows say it has, read with the versions) names the
    rows to remove: a deleted document's, and the chunks past the end of one that shrank. The
    order keeps a crash at any point redoable by the replay: deletes are recorded first; a
    document's chunk 0, which carries the count that names its other rows, goes last (deleted
    after its other chunks, rewritten after its stale chunks are gone).

    A deleted document's texts leave the model's cache before its rows go (:func:`erase_cached`),
    so a redo after a crash still finds their hashes in the rows."""
    store, upserts, deletes, counts = plan.target.store, plan.upserts, plan.deletes, plan.counts
    if deletes:
        store.record_deletes(list(deletes), ([source(d.source) for d in deletes.values()],
                                             [d.source.offset for d in deletes.values()]), now)
        erase_cached(plan)
    stale = [chunk_id(doc, k) for doc, it in upserts.items() for k in range(len(it.chunks), counts.get(doc, 0))]
    stale += [chunk_id(doc, k) for doc in deletes for k in range(1, counts.get(doc, 1))]
    store.delete(stale)
    store.delete([chunk_id(doc, 0) for doc in deletes])
    if upserts:
        store.upsert_chunks(chunk_rows(list(upserts.values()), source,
                                        plan.target.sparse), plan.target.model_id, now)
