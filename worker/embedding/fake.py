"""A deterministic stand-in model for tests that are not about the model."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from worker.embedding.base import Embedder


class FakeEmbedder(Embedder):
    """Vectors derived from a hash of the text: same text, same vector; distinct texts differ.

    ``delay_per_text`` (seconds) simulates a slow model; ``delay_per_batch`` a slow forward pass.
    """

    def __init__(self, dim: int = 8, model_id: str = "fake-model", delay_per_text: float = 0.0,
                 delay_per_batch: float = 0.0) -> None:
        self.model_id = model_id
        self.dim = dim
        self.precision = "fp32"
        self.device = "cpu"
        self.max_seq_length = 256
        self.delay_per_text = delay_per_text
        self.delay_per_batch = delay_per_batch
        self.texts_embedded = 0
        self.calls = 0

    def token_lengths(self, texts: list[str]) -> list[int]:
        return [min(self.max_seq_length, 2 + len(t.split())) for t in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        self.texts_embedded += len(texts)
        if self.delay_per_text or self.delay_per_batch:
            time.sleep(self.delay_per_batch + self.delay_per_text * len(texts))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
            out[i] = np.random.default_rng(seed).standard_normal(self.dim)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out
