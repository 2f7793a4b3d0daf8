"""The model behind a small interface: tokenize → run → normalise, plus token lengths and warmup."""

from worker.embedding.base import Embedder, resolve_model_path
from worker.embedding.fake import FakeEmbedder

__all__ = ["Embedder", "FakeEmbedder", "resolve_model_path"]
