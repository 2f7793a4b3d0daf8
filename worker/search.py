"""Semantic search over the collection, with the worker's own model and precision."""

from __future__ import annotations

from schemas.errors import ConfigError
from worker.embedding.base import Embedder
from worker.records import normalise_text
from worker.settings import Settings


def search_documents(settings: Settings, queries: list[str], top_k: int = 5,
                     embedder: Embedder | None = None) -> list[list[dict]]:
    """Top-``top_k`` hits (``id``, ``score``, ``metadata``) per query. Raises ConfigError on a
    missing collection or a dim mismatch."""
    if settings.milvus_uri is None:
        raise ConfigError("EMBEDSTREAM_MILVUS_URI (or --milvus-uri) is not set")
    from worker.runner import load_embedder, open_store

    embedder = embedder or load_embedder(settings)
    store = open_store(settings)
    try:
        if not store.exists():
            raise ConfigError(f"no collection {settings.milvus_collection!r} in Milvus at {settings.milvus_uri}: "
                              "run the worker first, or fix EMBEDSTREAM_MILVUS_COLLECTION")
        if store.dim() != embedder.dim:
            raise ConfigError(f"collection {settings.milvus_collection!r} holds {store.dim()}-dim vectors, the "
                              f"model makes {embedder.dim}: use the model the collection was built with")
        vectors = embedder.embed([normalise_text(q) for q in queries])
        return [store.search(v, top_k) for v in vectors]
    finally:
        store.close()
