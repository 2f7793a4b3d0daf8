"""The yardstick the tests and the bench compare the worker's vectors with: sentence-transformers'
own ``encode`` on the very model the worker loaded."""

from __future__ import annotations

import numpy as np

from worker.embedding.sentence import SentenceTransformerEmbedder


def encode_reference(embedder: SentenceTransformerEmbedder, texts: list[str]) -> np.ndarray:
    """``SentenceTransformer.encode`` of ``texts`` (normalised, float32), one row per text."""
    vectors = embedder.sentence_transformer.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(vectors, dtype=np.float32)
