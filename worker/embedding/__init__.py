"""The model behind a small interface (``base.Embedder``): its tokenizer side for the prepare thread,
its forward passes for the embed thread (``forward``), token lengths and warmup; a set of models
loaded within a memory budget (``models``); the learned sparse side (``sparse``; the mode itself is
``schemas.sparse``)."""

from worker.embedding.base import Embedder, resolve_model_path

__all__ = ["Embedder", "resolve_model_path"]
