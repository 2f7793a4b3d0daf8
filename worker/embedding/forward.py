"""The embed thread's side of a sentence-transformers model: its modules on the device, run over
forward passes cut from the length-sorted texts (``worker.embedding.passes``).

Whatever the precision, the pooled output is cast to float32 *before* it is normalised: normalising
in bf16 leaves norms off by up to ~0.4 %. ``truncate_dim`` keeps the first dimensions (Matryoshka
models), normalised again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.embedding.passes import PASS_TOKENS, split_by_budget, split_by_cost
from worker.embedding.sparse import Embedded, LearnedSparse, Sparse, rows_of
from worker.embedding.tokens import Tokens


def pass_sizes(device: str, sub_batch_size: int | None, sub_batch_tokens: int | None) -> tuple[int, int]:
    """The most texts and padded tokens of one forward pass, where not given.

    Measured on a 2-core CPU (bf16): 4,096 padded tokens per forward pass beat 8,192 by ~25 % on
    stdlib docstrings; up to 128 texts a pass (not 32) is ~20 % faster on one-sentence texts, where
    the per-pass overhead weighs. A GPU wants far larger passes: on an H100 (fp16, one run each),
    262,144 tokens a pass embedded 1.9x the docstrings/s of 65,536 (5,500 vs 2,900). The worker's
    batches (EMBEDSTREAM_MAX_BATCH_TOKENS) bound the passes too."""
    gpu = device == "cuda"
    return sub_batch_size or (256 if gpu else 128), sub_batch_tokens or (262_144 if gpu else 4096)


def largest_shapes(max_seq_length: int, sub_batch_size: int, sub_batch_tokens: int) -> list[tuple[int, int]]:
    """``(texts, tokens each)`` of the two largest forward passes :meth:`ForwardPasses.passes`
    makes: the longest texts the model takes, as many as the token budget holds; and the most texts
    a pass takes, as long as the budget lets them be."""
    longest = max_seq_length
    return [(max(1, min(sub_batch_size, sub_batch_tokens // longest)), longest),
            (sub_batch_size, max(2, min(longest, sub_batch_tokens // sub_batch_size)))]


class ForwardPasses:
    """A model's modules (Normalize left out: vectors are normalised here, in float32) run on padded
    token ids, pass by pass. ``modules[0]`` may be swapped for an int8 transformer
    (``worker.embedding.int8``); ``precision`` says which cost table cuts the passes on a CPU. Used
    from the embed thread (and at start-up)."""

    def __init__(self, torch: Any, modules: list, tokens: Tokens, device: str, precision: str, dim: int,
                 truncate_dim: int | None, sizes: tuple[int, int]) -> None:
        self._torch = torch
        self.modules = modules
        self.tokens = tokens
        self.device = device
        self.precision = precision
        self.dim = dim
        self.truncate_dim = truncate_dim
        self.sub_batch_size, self.sub_batch_tokens = sizes

    def pad(self, ids: list[list[int]]) -> dict:
        """The model inputs of one forward pass (``Tokens.pad``), on the device. On CUDA each array
        is copied from pinned host memory without waiting (PyTorch's pinned-block cache keeps the
        block until its copy is done), so the CPU goes on padding the next pass meanwhile."""
        arrays = self.tokens.pad(ids)
        if self.device == "cuda":
            return {k: self._torch.from_numpy(v).pin_memory().to(self.device, non_blocking=True)
                    for k, v in arrays.items()}
        return {k: self._torch.from_numpy(v).to(self.device) for k, v in arrays.items()}

    def run(self, features: dict):
        """Forward pass → pooled embeddings (a tensor in the model's dtype)."""
        with self._torch.inference_mode():
            for module in self.modules:
                features = module(features)
            return features["sentence_embedding"]

    def run_keeping(self, features: dict, after: int) -> tuple:
        """:meth:`run`, also handing back a copy of the features after the first ``after`` modules
        (the pass's inputs when 0): what a sparse model sharing those modules goes on from."""
        kept = dict(features)
        with self._torch.inference_mode():
            for i, module in enumerate(self.modules):
                features = module(features)
                if i + 1 == after:
                    kept = dict(features)
        return features["sentence_embedding"], kept

    def normalise(self, pooled):
        """Cast to float32, keep ``truncate_dim`` dimensions, then L2-normalise (in that order: see the
        module doc); stays on the device."""
        pooled = pooled.float()
        if self.truncate_dim:
            pooled = pooled[:, : self.truncate_dim]
        return self._torch.nn.functional.normalize(pooled, p=2, dim=1)

    def to_host(self, vectors) -> np.ndarray:
        """A pass's vectors as a numpy array on the host (waits for the device)."""
        return vectors.cpu().numpy()

    def passes(self, lengths: list[int]) -> list[list[int]]:
        """The forward passes of texts of ``lengths`` tokens (``worker.embedding.passes``): on a CPU the
        cut of least cost at this precision, on CUDA the greedy one."""
        if self.device == "cuda":
            return split_by_budget(lengths, self.sub_batch_size, self.sub_batch_tokens)
        return split_by_cost(lengths, self.sub_batch_size, self.sub_batch_tokens, PASS_TOKENS[self.precision])

    def warm_shapes(self) -> None:
        """One forward pass at each of the two :func:`largest_shapes` (what the ids are does not
        matter, only the shape)."""
        for count, length in largest_shapes(self.tokens.max_seq_length, self.sub_batch_size, self.sub_batch_tokens):
            self.run(self.pad([[self.tokens.pad_id] * length] * count))

    def embed_ids(self, ids: list[list[int]], extra: dict, learned: LearnedSparse | None = None) -> Embedded:
        """The dense vectors of texts tokenized to ``ids`` (``extra``: what the pooling is told of
        their prompt), and with ``learned`` (the model's sparse side) each text's sparse vector, from
        the same padded ids pass by pass (the modules both models share run once:
        ``LearnedSparse.shared``); None in its place without."""
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        if not ids:
            return out, ([] if learned is not None else None)
        # Each forward pass pads its own length-sorted slice. Results are copied off the device only
        # at the end: on a GPU the passes queue up and the CPU pads the next slice while the GPU
        # computes this one (a copy per pass would wait for each). A sparse vector comes off as its
        # largest weights only, not a row of the vocabulary's size.
        done: list[tuple[list[int], Any, tuple | None]] = []
        for group in self.passes([len(seq) for seq in ids]):
            features = {**self.pad([ids[i] for i in group]), **extra}
            if learned is None:
                done.append((group, self.normalise(self.run(features)), None))
                continue
            pooled, kept = self.run_keeping(features, learned.shared)
            done.append((group, self.normalise(pooled), learned.run(kept)))
        by_text: dict[int, Sparse] = {}
        for group, vectors, weights in done:
            out[group] = self.to_host(vectors)
            if weights is not None:
                by_text.update(zip(group, rows_of(*(t.cpu().numpy() for t in weights))))
        return out, ([by_text[i] for i in range(len(ids))] if learned is not None else None)
