"""The sparse mode (``EMBEDSTREAM_SPARSE``, or a model's ``sparse``): the one place its values are named.

:class:`SparseMode` is chosen once from the setting (:meth:`SparseMode.of`) and carries what each part
needs: the collection's shape (:attr:`SparseMode.kind`, a :class:`SparseKind`), the sparse model the
embedder runs (:attr:`SparseMode.model`), what it adds to a model's vector space id
(:attr:`SparseMode.space_suffix`), the metric the sparse side is searched with, what each Milvus row
carries beside its dense vector, and how many sparse dimensions an output record can hold.

- ``off``: dense vectors only.
- ``bm25``: each Milvus row keeps its chunk's text, and Milvus derives the BM25 sparse vector from it;
  the worker computes nothing more.
- a sentence-transformers ``SparseEncoder`` (a path or a name): a learned sparse vector per chunk, run
  by the worker in the dense model's forward passes (``worker.embedding.sparse``).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import ConfigError

#: The most dimensions a learned sparse vector keeps (its largest weights): SPLADE documents have a few
#: hundred; the bound keeps an output record's size known (``worker.steps.writing.fit``).
MAX_ACTIVE_DIMS = 1024


class SparseKind(str, enum.Enum):
    """The shape of a collection's sparse side in Milvus."""

    OFF = "off"
    BM25 = "bm25"
    LEARNED = "learned"

    @property
    def metric(self) -> str:
        """The metric the sparse field is indexed and searched with (BM25 for Milvus' own function,
        inner product for a model's weights). Only for a kind with a sparse field."""
        if self is SparseKind.OFF:
            raise ValueError("a collection without a sparse side has no sparse metric")
        return "BM25" if self is SparseKind.BM25 else "IP"


@dataclass(frozen=True)
class SparseMode:
    """One sparse mode. ``model``: the sparse model's id (a resolved path, or a name as given), only
    for :attr:`SparseKind.LEARNED`."""

    kind: SparseKind
    model: str | None = None

    @classmethod
    def of(cls, value: str | SparseMode | None) -> SparseMode:
        """The mode a setting names: ``off`` (or empty), ``bm25`` (either in any case), else a sparse
        model (a path is resolved and must hold a model). Raises :class:`ConfigError` for a path with
        no model."""
        if isinstance(value, SparseMode):
            return value
        value = (value or "").strip()
        if value.lower() in ("", SparseKind.OFF.value):
            return OFF
        if value.lower() == SparseKind.BM25.value:
            return BM25
        looks_like_path = value.startswith(("/", ".", "~")) or Path(value).expanduser().exists()
        if not looks_like_path:
            return cls(SparseKind.LEARNED, value)
        path = Path(value).expanduser()
        if not (path / "modules.json").exists():
            raise ConfigError(f"EMBEDSTREAM_SPARSE={value!r}: no sentence-transformers SparseEncoder there (no "
                              "modules.json). Use off, bm25, or the directory of a sparse model.")
        return cls(SparseKind.LEARNED, str(path.resolve()).rstrip("/"))

    @property
    def learned(self) -> bool:
        """Whether the worker runs a sparse model (each chunk then has a sparse vector of its own)."""
        return self.kind is SparseKind.LEARNED

    @property
    def setting(self) -> str:
        """The setting that names this mode again (``off``, ``bm25`` or the sparse model's id)."""
        return self.model if self.model is not None else self.kind.value

    @property
    def space_suffix(self) -> str:
        """What this mode adds to a model's vector space id (a collection of another shape): nothing
        for ``off``, ``+bm25``, or ``+sparse-<12 hex of the sparse model's id>``."""
        if self.kind is SparseKind.OFF:
            return ""
        if self.kind is SparseKind.BM25:
            return "+bm25"
        return "+sparse-" + hashlib.sha256(self.setting.encode("utf-8")).hexdigest()[:12]

    @property
    def rows_carry_text(self) -> bool:
        """Whether each Milvus row carries its chunk's text (Milvus derives BM25 from it)."""
        return self.kind is SparseKind.BM25

    @property
    def output_dims(self) -> int:
        """The most sparse dimensions an output record of this mode carries."""
        return MAX_ACTIVE_DIMS if self.learned else 0

    def __str__(self) -> str:
        return self.setting


#: No sparse side.
OFF = SparseMode(SparseKind.OFF)
#: BM25, computed by Milvus from each chunk's text.
BM25 = SparseMode(SparseKind.BM25)
