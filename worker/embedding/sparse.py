"""The sparse side of a model (``EMBEDSTREAM_SPARSE``): none, BM25 computed by Milvus, or a learned
sparse model run in the same forward pass as the dense one.

- ``off``: dense vectors only.
- ``bm25``: each Milvus row keeps its chunk's text in a field with an analyzer, and Milvus derives
  the BM25 sparse vector from it (a ``Function``); the worker computes nothing more.
- a sentence-transformers ``SparseEncoder`` (path or name; SPLADE-style, or CSR on top of a dense
  model): :class:`LearnedSparse` runs its modules on the *same padded token ids* as the dense model,
  pass by pass, so a text is tokenized once for both. Its tokenizer must therefore be the dense
  model's (same vocabulary), or start-up stops saying so.

A sparse vector travels as :data:`Sparse`: its dimensions (int32, ascending) and their weights
(float32, all non-zero).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from schemas.errors import ConfigError

OFF = "off"
BM25 = "bm25"
LEARNED = "learned"
#: The most dimensions a learned sparse vector keeps (its largest weights): SPLADE documents have a few
#: hundred; the bound keeps an output record's size known (``worker.steps.writing.fit``).
MAX_ACTIVE_DIMS = 1024
#: A sparse vector: ``(indices, values)``, indices ascending.
Sparse = tuple[np.ndarray, np.ndarray]


def is_learned(mode: str) -> bool:
    """Whether ``mode`` (a model's sparse setting) names a model the worker runs."""
    return mode not in (OFF, BM25)


def kind(mode: str) -> str:
    """The shape of the sparse side in Milvus (``connectors.milvus.schema``): ``off``, ``bm25`` or
    ``learned``."""
    return LEARNED if is_learned(mode) else mode


def space_suffix(mode: str) -> str:
    """What a sparse ``mode`` adds to a model's vector space id (a new collection shape): nothing for
    ``off``, ``+bm25``, or ``+sparse-<12 hex of the model id>``."""
    if mode == OFF:
        return ""
    if mode == BM25:
        return "+bm25"
    return "+sparse-" + hashlib.sha256(mode.encode("utf-8")).hexdigest()[:12]


def resolve_mode(value: str | None) -> str:
    """``EMBEDSTREAM_SPARSE`` (or a model's ``sparse``) → ``off``, ``bm25``, or the sparse model's id
    (a path resolved, a name as given). Raises :class:`ConfigError` for a path with no model."""
    value = (value or OFF).strip()
    if value.lower() in (OFF, BM25, ""):
        return value.lower() or OFF
    looks_like_path = value.startswith(("/", ".", "~")) or Path(value).expanduser().exists()
    if not looks_like_path:
        return value
    path = Path(value).expanduser()
    if not (path / "modules.json").exists():
        raise ConfigError(f"EMBEDSTREAM_SPARSE={value!r}: no sentence-transformers SparseEncoder there (no "
                          "modules.json). Use off, bm25, or the directory of a sparse model.")
    return str(path.resolve()).rstrip("/")


def to_sparse(rows: np.ndarray) -> list[Sparse]:
    """Each row of a dense float array as :data:`Sparse` (its non-zero dimensions)."""
    out: list[Sparse] = []
    for row in rows:
        idx = np.flatnonzero(row).astype(np.int32)
        out.append((idx, row[idx].astype(np.float32)))
    return out


class LearnedSparse:
    """A ``SparseEncoder``'s modules, run on the inputs of the dense model's forward passes.

    ``dim``: the sparse vectors' dimension (a vocabulary's size for SPLADE, the autoencoder's
    width for CSR)."""

    def __init__(self, model_id: str, device: str, dtype, dense_tokenizer) -> None:
        from worker.embedding.imports import sentence_transformers

        self.model_id = model_id
        try:
            encoder = sentence_transformers().SparseEncoder(model_id, device=device,
                                                            model_kwargs={"torch_dtype": dtype})
        except Exception as exc:
            raise ConfigError(f"could not load sparse model {model_id!r}: {exc}. Check EMBEDSTREAM_SPARSE "
                              "(off, bm25, or a sentence-transformers SparseEncoder).") from None
        encoder.eval()
        if encoder.tokenizer.get_vocab() != dense_tokenizer.get_vocab():
            raise ConfigError(f"sparse model {model_id!r} does not share the dense model's tokenizer: the worker "
                              "tokenizes a text once for both. Use a sparse model built on the dense model's "
                              "vocabulary (SPLADE or CSR of the same base), or EMBEDSTREAM_SPARSE=bm25.")
        self.encoder = encoder
        size = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
        self.dim = int(size() or 0)
        self.max_active_dims = min(int(getattr(encoder, "max_active_dims", None) or MAX_ACTIVE_DIMS), MAX_ACTIVE_DIMS)

    def run(self, features: dict):
        """Sparse weights of one forward pass's inputs (a dense tensor of ``dim`` columns, mostly
        zero), on the device."""
        import torch

        with torch.inference_mode():
            for module in self.encoder:
                features = module(features)
        out = features["sentence_embedding"]
        if self.max_active_dims < out.shape[1]:
            top = torch.topk(out, k=self.max_active_dims, dim=1)
            out = torch.zeros_like(out).scatter_(1, top.indices, top.values)
        return out.float()
