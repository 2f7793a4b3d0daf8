"""Cache lookup and embedding of a group of batches, chunk by chunk.

The unit is the chunk (``worker.steps.chunk``; a document that fits the model is one chunk with the
document's own text and hash). Identical texts in a group are looked up and embedded once. Lookups
go first to a small in-process memo of the vectors this worker computed lately (it covers repeats
whose first copy is still in flight, before its batch has filled Redis), then to Redis with one
pipelined MGET per group; only the misses reach the model, all in one call (which sorts them by
length). The vectors of the misses are handed on (in each batch's ``fresh``) so the sink step writes
them back to Redis.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from connectors.redis_cache import RedisCache
from worker import metrics
from worker.embedding.base import Embedder
from worker.records import Batch


class EmbedStep:
    """``process(group)`` fills ``chunk.vector`` and ``chunk.cached`` for every chunk of every item.
    Blocks on the model.

    Raises only what the model raises (a bug: crash); the cache never raises."""

    def __init__(self, embedder: Embedder, cache: RedisCache | None, memo_size: int = 20_000, model: str = "") -> None:
        self.embedder = embedder
        self.cache = cache
        #: The items this step embeds: those of this model (``Item.model``).
        self.model = model
        # ~1.5 KB a 384-dim vector: 20,000 entries ≈ 30 MB. Only used with a cache configured:
        # without Redis the operator asked for no caching.
        self.memo_size = memo_size if cache is not None else 0
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()

    def process(self, group: list[Batch]) -> None:
        for batch in group:
            batch.fresh[self.model] = {}
        chunks = [ch for batch in group for it in batch.items if it.model == self.model for ch in it.chunks]
        if not chunks:
            return
        first_text: dict[str, str] = {}
        for ch in chunks:
            first_text.setdefault(ch.hash, ch.text)
        hashes = list(first_text)
        vectors: dict[str, np.ndarray] = {}
        hit: set[str] = set()
        for h in hashes:
            vec = self._memo.get(h)
            if vec is not None:
                self._memo.move_to_end(h)
                vectors[h] = vec
                hit.add(h)
        if self.cache is not None:
            asked = [h for h in hashes if h not in vectors]
            errors_before = self.cache.errors
            for h, vec in zip(asked, self.cache.get_many(asked)):
                if vec is not None:
                    vectors[h] = vec
                    hit.add(h)
            if self.cache.errors != errors_before:
                metrics.CACHE_REQUESTS.labels("error").inc(len(asked))
                metrics.CACHE_REQUESTS.labels("hit").inc(len(hashes) - len(asked))
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
                if self.memo_size:
                    self._memo[h] = vec
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        for batch in group:
            fresh = batch.fresh[self.model]
            for it in batch.items:
                if it.model != self.model:
                    continue
                for ch in it.chunks:
                    ch.vector = vectors[ch.hash]
                    ch.cached = ch.hash in hit
                    if not ch.cached:
                        fresh[ch.hash] = ch.vector
