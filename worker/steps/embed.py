"""Cache lookup and embedding of one batch.

Identical texts in a batch are looked up and embedded once; the cache is read with one pipelined
MGET per batch; only the misses reach the model. The vectors of the misses are handed on (in
``batch.fresh``) so the sink step writes them back to the cache after the batch is durable.
"""

from __future__ import annotations

import time

import numpy as np

from connectors.redis_cache import RedisCache
from worker import metrics
from worker.embedding.base import Embedder
from worker.records import Batch


class EmbedStep:
    """``process(batch)`` fills ``item.vector`` and ``item.cached`` for every item. Blocks on the model.

    Raises only what the model raises (a bug: crash); the cache never raises."""

    def __init__(self, embedder: Embedder, cache: RedisCache | None) -> None:
        self.embedder = embedder
        self.cache = cache

    def process(self, batch: Batch) -> Batch:
        items = batch.items
        batch.fresh = {}
        if not items:
            return batch
        first_text: dict[str, str] = {}
        for it in items:
            first_text.setdefault(it.hash, it.text)
        hashes = list(first_text)
        vectors: dict[str, np.ndarray] = {}
        hit: set[str] = set()
        if self.cache is not None:
            errors_before = self.cache.errors
            for h, vec in zip(hashes, self.cache.get_many(hashes)):
                if vec is not None:
                    vectors[h] = vec
                    hit.add(h)
            if self.cache.errors != errors_before:
                metrics.CACHE_REQUESTS.labels("error").inc(len(hashes))
            else:
                metrics.CACHE_REQUESTS.labels("hit").inc(len(hit))
                metrics.CACHE_REQUESTS.labels("miss").inc(len(hashes) - len(hit))
        missing = [h for h in hashes if h not in vectors]
        if missing:
            t0 = time.perf_counter()
            embedded = self.embedder.embed([first_text[h] for h in missing])
            metrics.EMBED_SECONDS.observe(time.perf_counter() - t0)
            for h, vec in zip(missing, embedded):
                vectors[h] = vec
                batch.fresh[h] = vec
        for it in items:
            it.vector = vectors[it.hash]
            it.cached = it.hash in hit
        return batch
