"""The model behind a small interface: tokenize → run → normalise, plus token lengths and warmup."""

from worker.embedding.base import Embedder, resolve_model_path

__all__ = ["Embedder", "resolve_model_path"]
