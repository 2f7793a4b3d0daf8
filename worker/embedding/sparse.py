"""A learned sparse model run beside the dense one (the mode ``schemas.sparse.SparseMode`` names it).

A sentence-transformers ``SparseEncoder`` (path or name; SPLADE-style, or CSR on top of a dense
model): :class:`LearnedSparse` runs its modules on the *same padded token ids* as the dense model,
pass by pass, so a text is tokenized once for both. Its tokenizer must therefore be the dense
model's (same vocabulary), or start-up stops saying so. (BM25 needs nothing here: Milvus computes it.)

A sparse vector travels as :data:`Sparse`: its dimensions (int32, ascending) and their weights
(float32, all non-zero).
"""

from __future__ import annotations

import numpy as np

from schemas.errors import ConfigError
from schemas.sparse import MAX_ACTIVE_DIMS

#: A sparse vector: ``(indices, values)``, indices ascending.
Sparse = tuple[np.ndarray, np.ndarray]
#: What a model's passes give texts: their dense vectors, and their learned sparse vectors where the
#: model has a learned sparse side (else None).
Embedded = tuple[np.ndarray, "list[Sparse] | None"]


class LearnedSparse:
    """A ``SparseEncoder``'s modules, run on the inputs of the dense model's forward passes.

    Where its first modules *are* the dense model's (the same kind, configuration and weights: CSR
    built on the dense model shares its transformer and pooling), the dense pass's output after them
    is taken as it is (:attr:`shared`), and only the rest runs: one transformer pass for both vectors.
    A vector's dimensions are a vocabulary's for SPLADE, the autoencoder's width for CSR."""

    def __init__(self, model_id: str, device: str, dtype, dense_tokenizer, dense_modules: list | None = None) -> None:
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
        self.max_active_dims = min(int(getattr(encoder, "max_active_dims", None) or MAX_ACTIVE_DIMS), MAX_ACTIVE_DIMS)
        #: How many leading modules the dense model runs for this one (0: none; its modules all run).
        self.shared = shared_prefix(list(encoder), dense_modules or [])
        if self.shared == len(encoder):
            raise ConfigError(f"sparse model {model_id!r} is the dense model itself: use a SparseEncoder")

    def run(self, features: dict) -> tuple:
        """The largest weights of one forward pass's texts, on the device: ``(indices, values)``, each
        ``texts × min(dim, max_active_dims)`` (zeros where a text has fewer non-zero weights).
        ``features``: the pass's inputs, or with :attr:`shared` the dense pass's features after its
        shared modules (a copy: the modules add to it)."""
        import torch

        with torch.inference_mode():
            for module in list(self.encoder)[self.shared:]:
                features = module(features)
            out = features["sentence_embedding"]
            top = torch.topk(out, k=min(self.max_active_dims, out.shape[1]), dim=1)
        return top.indices, top.values.float()


def shared_prefix(sparse_modules: list, dense_modules: list) -> int:
    """How many leading modules of ``sparse_modules`` are ``dense_modules``' own: the same class, the
    same configuration and equal weights (CSR's transformer and pooling, built on the dense model)."""
    import torch

    n = 0
    for mine, theirs in zip(sparse_modules, dense_modules):
        if type(mine) is not type(theirs):
            break
        config = getattr(mine, "get_config_dict", dict)
        if config() != getattr(theirs, "get_config_dict", dict)():
            break
        a, b = mine.state_dict(), theirs.state_dict()
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            break
        n += 1
    return n


def rows_of(indices: np.ndarray, values: np.ndarray) -> list[Sparse]:
    """:data:`Sparse` vectors from :meth:`LearnedSparse.run`'s arrays (on the host): each row's
    non-zero weights, dimensions ascending."""
    out: list[Sparse] = []
    for idx, val in zip(indices, values):
        keep = val != 0
        idx, val = idx[keep].astype(np.int32), val[keep].astype(np.float32)
        order = np.argsort(idx, kind="stable")
        out.append((idx[order], val[order]))
    return out
