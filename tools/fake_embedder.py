"""A deterministic stand-in model, for tests that are not about the model and the bench's instant
model (what Kafka, Redis and Milvus cost without one). Not part of the worker."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from schemas.sparse import SparseMode
from worker.embedding.base import Embedder


class FakeEmbedder(Embedder):
    """Vectors derived from a hash of the text: same text, same vector; distinct texts differ.

    ``delay_per_text`` (seconds) simulates a slow model; ``delay_per_batch`` a slow forward pass.
    """

    def __init__(self, dim: int = 8, model_id: str = "fake-model", delay_per_text: float = 0.0,
                 delay_per_batch: float = 0.0, sparse: str = "off") -> None:
        self.model_id = model_id
        #: ``off``, ``bm25``, or any other name: a learned sparse side whose vectors derive from the
        #: text's digest too (4 dimensions of 64).
        self.sparse = SparseMode.of(sparse)
        self.dim = dim
        self.precision = "fp32"
        self.device = "cpu"
        self.max_seq_length = 256
        self.delay_per_text = delay_per_text
        self.delay_per_batch = delay_per_batch
        self.texts_embedded = 0
        self.calls = 0
        self._scale = np.random.default_rng(20261125).uniform(0.5, 1.5, dim).astype(np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        self.texts_embedded += len(texts)
        if self.delay_per_text or self.delay_per_batch:
            time.sleep(self.delay_per_batch + self.delay_per_text * len(texts))
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        # Vectors from the texts' SHA-256 digests, built for the whole batch at once: the bench's
        # io run uses this as "a model that returns instantly", so it must cost next to nothing.
        digests = np.frombuffer(b"".join(hashlib.sha256(t.encode("utf-8")).digest() for t in texts), np.uint8)
        reps = -(-self.dim // 32)
        out = np.tile(digests.reshape(len(texts), 32), (1, reps))[:, : self.dim].astype(np.float32) - 127.5
        # Each component scaled by a fixed factor of its own: floats as varied as a real model's,
        # which compress as little (the digest repeated along the vector compressed 11x under lz4,
        # a real vector not at all, so an instant-model run priced compression at a tenth of it).
        out *= self._scale
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def embed_sparse(self, texts: list[str], query: bool = False) -> tuple[np.ndarray, list]:
        if not self.sparse.learned:
            return super().embed_sparse(texts, query)
        out = []
        for t in texts:
            digest = hashlib.sha256(t.encode("utf-8")).digest()
            idx = np.unique(np.frombuffer(digest[:4], np.uint8) % 64).astype(np.int32)
            out.append((idx, (idx + 1).astype(np.float32) / 64))
        return self.embed(texts), out
