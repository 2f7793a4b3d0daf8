"""Cache lookup and embedding of a group of batches, chunk by chunk, in two halves on two threads.

The unit is the chunk (``worker.steps.model.chunk``; a document that fits the model is one chunk with the
document's own text and hash). :meth:`EmbedStep.prepare` (the prepare stage, after the chunk step)
looks each distinct text up and makes the misses ready for the model (token ids:
``Embedder.prepare``); :meth:`EmbedStep.embed` (the embed stage) runs the model on them. So while the
model runs one group's forward passes, the next group is tokenized and looked up in Redis.

Identical texts are looked up and embedded once. Lookups go first to a small in-process memo of the
vectors this worker computed lately (it covers repeats whose first copy is still in flight, before
its batch has filled Redis), then to Redis with one pipelined MGET per group; the embed half asks
the memo once more (a repeat whose first copy was embedded after its lookup). Only the misses reach
the model, all in one call (which sorts them by length). What a batch still needs is handed from one
half to the other beside the batch (``Pending``, one value per batch, since the embed stage may
group batches otherwise than the prepare stage did), and the vectors of the misses are handed on to
the sink the same way (``Fresh``), which writes them back to Redis.

The cache never makes a run slower (:class:`LookupPolicy`): on a GPU a Redis round trip can cost
more than the forward pass it saves (measured from outside on one H100: 1,290-1,580 docs/s with the
cache against 1,820-1,840 without). The step keeps running averages of what a lookup costs a text,
what the model costs a text and how often Redis hits; while a lookup costs more than
``WORTH_ASKING`` of the model's time *and* the hits save less than the lookups cost, it skips Redis
(the memo and the write-back stay), asking again one group in ``PROBE_EVERY`` to see whether that
still holds. A lookup that failed (Redis down or frozen) is an outage, not a cost: it is not
measured, so Redis is asked again as before once it is back. On a CPU a lookup costs ~1 % of the
model's time: Redis is always asked there.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

from connectors.redis_cache import RedisCache
from worker.core.records import Share
from worker.embedding.base import Embedder
from worker.embedding.sparse import Sparse
from worker.process import metrics

#: What the step keeps of a text: its vector, or with a learned sparse side ``(vector, sparse vector)``.
Value = np.ndarray | tuple[np.ndarray, Sparse]
#: While Redis is skipped, one group in so many is still looked up, to measure it again.
PROBE_EVERY = 16
#: Weight of the newest group in the running averages.
EWMA_WEIGHT = 0.2
#: A lookup that costs less than this share of the model's time a text is always made: cheap enough
#: whatever the hit ratio (and a stream's first repeats are then found at once).
WORTH_ASKING = 0.05


class LookupPolicy:
    """Whether a group's Redis lookup pays: expected seconds saved (hit ratio × the model's seconds
    a text) against the lookup's seconds a text, each a running average over the groups seen; a
    lookup under ``WORTH_ASKING`` of the model's time always pays. Looks up until both costs are
    known; a skipped group is looked up one time in ``probe_every``."""

    def __init__(self, probe_every: int = PROBE_EVERY, weight: float = EWMA_WEIGHT) -> None:
        self.probe_every = probe_every
        self.weight = weight
        self.lookup_s: float | None = None  # seconds a text asked of Redis
        self.model_s: float | None = None  # seconds a text embedded by the model
        self.hit_ratio: float | None = None  # of the texts asked of Redis
        self.skipped = 0

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)

    def lookup(self) -> bool:
        """Whether to ask Redis for this group."""
        if (self.lookup_s is None or self.model_s is None or self.hit_ratio is None
                or self.lookup_s <= WORTH_ASKING * self.model_s
                or self.hit_ratio * self.model_s >= self.lookup_s):
            self.skipped = 0
            return True
        self.skipped += 1
        if self.skipped >= self.probe_every:
            self.skipped = 0
            return True
        return False

    def looked_up(self, texts: int, hits: int, seconds: float) -> None:
        if texts:
            self.lookup_s = self._mix(self.lookup_s, seconds / texts)
            self.hit_ratio = self._mix(self.hit_ratio, hits / texts)

    def embedded(self, texts: int, seconds: float) -> None:
        if texts:
            self.model_s = self._mix(self.model_s, seconds / texts)


class EmbedStep:
    """``embed(share, prepare(share))`` fills ``chunk.vector`` and ``chunk.cached`` for every chunk
    of every item of the model's share; the two halves run on two threads, each handed one value
    per batch of its group. ``embed`` blocks on the model.

    Raises only what the model raises (a bug: crash; a model that cannot be loaded for memory:
    TransientError, and the embed stage tries the group again with the same ``pending``); the cache
    never raises."""

    def __init__(self, embedder: Embedder, cache: RedisCache | None, memo_size: int = 20_000, model: str = "") -> None:
        self.embedder = embedder
        #: The model has a learned sparse side: each text's value (embedded, memoised, cached) is its
        #: dense vector and its sparse one, from the same forward pass.
        self.learned = embedder.sparse.learned
        self.cache = cache
        #: The items this step embeds: those of this model (``Item.model``).
        self.model = model
        # ~1.5 KB a 384-dim vector: 20,000 entries ≈ 30 MB. Only used with a cache configured:
        # without Redis the operator asked for no caching.
        self.memo_size = memo_size if cache is not None else 0
        self._memo: OrderedDict[str, Value] = OrderedDict()
        self._memo_lock = threading.Lock()  # read by the prepare thread, filled by the embed thread
        #: Whether a group's Redis lookup is worth its cost (the module doc).
        self.policy = LookupPolicy()

    def prepare(self, share: Share) -> list[dict[str, object]]:
        """Look up the share's distinct texts (memo, then Redis when it pays) and give the chunks found
        their vectors. Returns, for each batch of the share's group, what the model must make of the
        rest of its chunks (``Embedder.prepare``, by chunk hash): the embed stage's input. Prepare thread."""
        needs: list[dict[str, object]] = [{} for _ in share.group]
        chunks = [ch for _, _, it in share.places for ch in it.chunks]
        if not chunks:
            return needs
        first_text: dict[str, str] = {}
        for ch in chunks:
            first_text.setdefault(ch.hash, ch.text)
        hashes = list(first_text)
        vectors = self._from_memo(hashes)
        hit = set(vectors)
        if self.cache is not None:
            self._look_up(hashes, vectors, hit)
        missing = [h for h in hashes if h not in vectors]
        ready = dict(zip(missing, self.embedder.prepare([first_text[h] for h in missing]))) if missing else {}
        for index, _, it in share.places:
            for ch in it.chunks:
                if ch.hash in vectors:
                    self._give(ch, vectors[ch.hash], cached=True)
                else:
                    needs[index][ch.hash] = ready[ch.hash]
        return needs

    def embed(self, share: Share, pending: list[dict[str, object]]) -> list[dict[str, Value]]:
        """Embed what ``pending`` holds for the share's batches (``prepare``'s result: once each
        distinct text; the memo first) and hand the vectors to their chunks. Returns, for each batch of
        the group, the vectors made for it by chunk hash (not from a cache: the sink fills the cache
        with them). Embed thread. ``pending`` is only read: a retry of the group is handed it again."""
        fresh: list[dict[str, Value]] = [{} for _ in share.group]
        wanted: dict[str, object] = {}
        for need in pending:
            wanted.update(need)
        if not wanted:
            return fresh
        vectors = self._from_memo(list(wanted))
        hit = set(vectors)
        missing = [h for h in wanted if h not in vectors]
        if missing:
            t0 = time.perf_counter()
            dense, learned = self.embedder.embed_prepared([wanted[h] for h in missing])
            # with a learned sparse side a text's value is (vector, sparse vector): what the cache keeps
            embedded = list(zip(dense, learned)) if learned is not None else list(dense)
            seconds = time.perf_counter() - t0
            metrics.EMBED_SECONDS.observe(seconds)
            self.policy.embedded(len(missing), seconds)
            vectors.update(zip(missing, embedded))
            self._remember(missing, vectors)
        for index, _, it in share.places:
            for ch in it.chunks:
                if ch.vector is None and ch.hash in vectors:
                    value = vectors[ch.hash]
                    self._give(ch, value, cached=ch.hash in hit)
                    if not ch.cached:
                        fresh[index][ch.hash] = value
        return fresh

    def _from_memo(self, hashes: list[str]) -> dict[str, Value]:
        found: dict[str, Value] = {}
        if not self.memo_size:
            return found
        with self._memo_lock:
            for h in hashes:
                vec = self._memo.get(h)
                if vec is not None:
                    self._memo.move_to_end(h)
                    found[h] = vec
        return found

    def _remember(self, hashes: list[str], vectors: dict[str, Value]) -> None:
        if not self.memo_size:
            return
        with self._memo_lock:
            for h in hashes:
                self._memo[h] = vectors[h]
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)

    @staticmethod
    def _give(ch, value: Value, cached: bool) -> None:
        """A chunk's vector (and sparse vector), and whether it came from a cache."""
        if isinstance(value, tuple):  # a learned sparse side: (vector, sparse vector)
            ch.vector, ch.sparse = value
        else:
            ch.vector = value
        ch.cached = cached

    def _look_up(self, hashes: list[str], vectors: dict[str, Value], hit: set[str]) -> None:
        """Ask Redis for the hashes the memo did not hold, when the policy says it pays."""
        assert self.cache is not None
        asked = [h for h in hashes if h not in vectors]
        if not asked:
            return
        if not self.policy.lookup():
            metrics.CACHE_REQUESTS.labels("skipped").inc(len(asked))
            return
        errors_before = self.cache.errors
        t0 = time.perf_counter()
        found = 0
        for h, vec in zip(asked, self.cache.get_many(asked)):
            if vec is not None:
                vectors[h] = vec
                hit.add(h)
                found += 1
        if self.cache.errors != errors_before:
            # An outage, not a cost: RedisCache bounds it (a timeout, then misses at once while it is
            # down), and its timeouts must not keep Redis skipped once it is back.
            metrics.CACHE_REQUESTS.labels("error").inc(len(asked))
            metrics.CACHE_REQUESTS.labels("hit").inc(len(hashes) - len(asked))
        else:
            self.policy.looked_up(len(asked), found, time.perf_counter() - t0)
            metrics.CACHE_REQUESTS.labels("hit").inc(len(hit))
            metrics.CACHE_REQUESTS.labels("miss").inc(len(hashes) - len(hit))
