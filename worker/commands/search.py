"""Search through the alias readers query (``worker.assembly.naming.alias_of``), with the worker's
own model and precision (queries embedded with the model's query prompt, documents were with its
document prompt).

Modes (:data:`MODES`): ``dense`` (the model's vectors, COSINE), ``sparse`` (the collection's sparse
side: BM25 on the query's words, or a learned sparse model's query vector) and ``hybrid`` (both,
fused by reciprocal rank, or by weighted scores with ``weights``). The default is hybrid where the
collection has a sparse side, else dense."""

from __future__ import annotations

from schemas.errors import ConfigError
from schemas.redact import without_userinfo
from schemas.sparse import SparseKind
from worker.core.records import normalise_text
from worker.embedding.base import Embedder
from worker.embedding.sparse import Sparse
from worker.settings import Settings

MODES = ("dense", "sparse", "hybrid")
#: Hybrid search fuses each side's best ``HYBRID_WINDOW × top-k`` rows. A deeper window lets a weak
#: side's middling rows add up past the other's good ones: on the bench's natural-language queries
#: (2,000 functions, 300 queries, where BM25 alone finds 0.59 and dense 0.81), RRF over each side's
#: best 20 rows found 0.83 for a top 10, over 40 rows 0.77 and over 100 rows 0.73; identifier queries
#: lost nothing (0.997 at 20).
HYBRID_WINDOW = 2
#: Chunk rows asked of Milvus per document shown: a long document's chunks crowd the nearest rows.
ROWS_PER_DOCUMENT = 4


def best_chunk_per_document(rows: list[dict], top_k: int) -> list[dict]:
    """Rank documents by their best chunk: the first row of each ``doc_id`` among ``rows`` (nearest
    first), as ``{id: the document id, score, chunk, chunks, span, excerpt, metadata, model, also}``.
    Documents whose best chunk has the same content (its ``content_hash``: the same text under other
    ids) fold into the first one's row, their ids in ``also``: the ``top_k`` are different texts."""
    hits: list[dict] = []
    seen: set[str] = set()
    by_content: dict[str, dict] = {}
    for r in rows:
        doc = r.get("doc_id") or r["id"]
        if doc in seen:
            continue
        seen.add(doc)
        same = by_content.get(r.get("content_hash") or "")
        if same is not None:
            same["also"].append(doc)
            continue
        hit = {"id": doc, "score": r["score"], "chunk": r.get("chunk_index", 0), "chunks": r.get("chunk_count", 1),
               "span": [r.get("span_start", 0), r.get("span_end", -1)], "excerpt": r.get("excerpt", ""),
               "metadata": r.get("metadata") or {}, "model": r.get("model"), "also": []}
        hits.append(hit)
        if r.get("content_hash"):
            by_content[r["content_hash"]] = hit
    return hits[:top_k]


def best_documents(store, query, mode: str, top_k: int, weights: tuple[float, float] | None = None,
                   kind: str | None = None) -> list[dict]:
    """The ``top_k`` best documents for ``query`` (``connectors.milvus.reads.Query``) in ``mode``, from
    a ``MilvusReader``: ``ROWS_PER_DOCUMENT`` chunk rows asked per document, each side of a hybrid
    search contributing its best ``HYBRID_WINDOW × top_k`` rows."""
    rows = store.search_by(query, mode, top_k * ROWS_PER_DOCUMENT, weights, kind, window=HYBRID_WINDOW * top_k)
    return best_chunk_per_document(rows, top_k)


def search_documents(settings: Settings, queries: list[str], top_k: int = 5, embedder: Embedder | None = None,
                     mode: str | None = None, weights: tuple[float, float] | None = None) -> list[list[dict]]:
    """The ``top_k`` best documents per query in ``mode`` (:data:`MODES`; None: hybrid where the
    collection has a sparse side, else dense), each ranked by its best chunk and showing which span
    matched (``best_chunk_per_document``). Raises ConfigError on a missing collection, a dim
    mismatch, or a mode the collection cannot serve."""
    if settings.milvus_uri is None:
        raise ConfigError("EMBEDSTREAM_MILVUS_URI (or --milvus-uri) is not set")
    if mode is not None and mode not in MODES:
        raise ConfigError(f"--mode {mode!r}: use one of {', '.join(MODES)}")
    from connectors.milvus import MilvusReader
    from connectors.milvus.reads import Query
    from worker.assembly.naming import alias_of
    from worker.assembly.runner import load_embedder, open_milvus

    collection = alias_of(settings, "")
    if embedder is None and settings.models is not None:
        # A model set: EMBEDSTREAM_MODEL (--model) names the model to ask, else the default one.
        from worker.embedding.models import default_model, parse_models

        specs = parse_models(settings.models)
        name = settings.model if settings.model in specs else default_model(specs)
        embedder, collection = load_embedder(settings, specs[name]), alias_of(settings, name)
    embedder = embedder or load_embedder(settings)
    store = open_milvus(settings, MilvusReader, collection)
    try:
        if not store.exists():
            where = without_userinfo(settings.milvus_uri or "")
            raise ConfigError(f"no collection {collection!r} in Milvus at {where}: "
                              "run the worker first, or fix EMBEDSTREAM_MILVUS_ALIAS / EMBEDSTREAM_MILVUS_COLLECTION")
        info = store.describe()  # one call for the dimension and the sparse side
        if store.dim(info) != embedder.dim:
            raise ConfigError(f"collection {collection!r} holds {store.dim(info)}-dim vectors, the "
                              f"model makes {embedder.dim}: use the model the collection was built with")
        kind = store.sparse_kind(info)
        mode = mode or ("dense" if kind is SparseKind.OFF else "hybrid")
        texts = [normalise_text(q) for q in queries]
        sparse: list[Sparse | None] = [None] * len(texts)
        if kind is SparseKind.LEARNED and mode != "dense":
            if not embedder.sparse.learned:
                raise ConfigError(f"collection {collection!r} holds learned sparse vectors: set EMBEDSTREAM_SPARSE "
                                  "(--sparse) to the sparse model it was built with, or search with --mode dense")
            dense, learned = embedder.embed_sparse(texts, query=True)
            sparse = list(learned)
        else:
            dense = embedder.embed_query(texts)
        return [best_documents(store, Query(d, t, s), mode, top_k, weights, kind)
                for d, t, s in zip(dense, texts, sparse)]
    finally:
        store.close()
