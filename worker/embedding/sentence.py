"""sentence-transformers models, with the precision chosen for the device.

Precision ``auto``: fp16 on CUDA; on a CPU with VNNI where OpenVINO is installed int8
(``worker.embedding.int8``: static int8, about 1.5x bf16 and 2.5x fp32, gated against fp32 at
start-up); else bf16 on a CPU with avx512_bf16 or AMX (about 2.5x fp32 there, with cosine ≥ 0.998 to
fp32); else on CPUs with VNNI int8 by onnxruntime where it is installed (about 2x fp32), else fp32 (fp16 on a CPU is
slower than fp32).

The model has two sides: :class:`TextSide`, the tokenizer, for the prepare thread; and
``worker.embedding.forward.ForwardPasses``, the modules on the device, for the embed thread, which
runs texts in forward passes cut from the length-sorted list within a token budget
(``worker.embedding.passes``), so short texts are not padded to the longest one of the batch, and
casts the pooled output to float32 before it normalises it.

Prompts and truncation follow sentence-transformers' own ``encode_document`` / ``encode_query``: the
document prompt is the model's ``document`` (else ``passage``, else ``corpus``) prompt; the query
prompt its ``query`` prompt (an empty prompt counts as none; the model's default prompt is not
used). A prompt is put before the text, and its length goes to the pooling (a model that pools
without the prompt, ``include_prompt: false``, leaves it out). ``truncate_dim`` keeps the first
dimensions (Matryoshka models), normalised again.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from schemas import sparse as sparse_modes
from schemas.errors import ConfigError
from schemas.sparse import SparseMode
from worker.embedding import cpu, cuda_driver
from worker.embedding.base import Embedder, resolve_model_path, word_spans
from worker.embedding.forward import ForwardPasses, pass_sizes
from worker.embedding.sparse import Embedded, LearnedSparse, Sparse
from worker.embedding.tokens import Tokens

log = logging.getLogger(__name__)

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # int8: float32 in torch, int8 in ONNX


def cpu_has_bf16() -> bool:
    """True when the CPU advertises avx512_bf16 or AMX (``worker.embedding.cpu``)."""
    return cpu.has_bf16()


def pick_device(device: str) -> str:
    """``device``, or for ``auto`` cuda where torch sees a CUDA device, else cpu. Raises ConfigError
    for ``cuda`` without one, naming the driver and CUDA versions where the driver is too old (a
    warning for ``auto``, which then runs on the CPU)."""
    import torch

    if torch.cuda.is_available():
        return "cuda" if device == "auto" else device
    old = cuda_driver.too_old(torch.version.cuda, cuda_driver.driver_version())
    if device == "cuda":
        raise ConfigError(f"EMBEDSTREAM_DEVICE=cuda but {old}" if old else
                          "EMBEDSTREAM_DEVICE=cuda but torch sees no CUDA device: use auto or cpu")
    if device == "auto" and old:
        log.warning("running on the CPU: %s", old)
    return "cpu" if device == "auto" else device


def pick_precision(precision: str, device: str) -> str:
    """The precision ``auto`` resolves to on ``device``; explicit choices are returned unchanged.

    On CUDA fp16. On a CPU with int8 dot-product (VNNI or AMX) instructions where OpenVINO is
    installed, int8: its static int8 ran the worker 1.56x as fast as bf16 end to end here (the full
    bench, S2), within the gate (cosine to fp32 mean 0.997, min 0.99; top-10 overlap 0.94). Else bf16
    where the CPU has bf16 instructions; else int8 with VNNI where onnxruntime is installed (about 2x
    fp32 there; on a CPU with bf16 it measured 0.8-1.5x bf16, so bf16 goes first); else fp32. Without
    VNNI, onnxruntime's int8 needs 7-bit weights to stay within its gate, and then measured 1.3-1.5x
    fp32 with a min cosine to fp32 of 0.974-0.986 (AVX2 EPYC, 400 texts): too close to the gate's
    0.97 for a default; EMBEDSTREAM_PRECISION=int8 still runs it. An int8 export that fails its gate
    at start-up makes ``auto`` run :func:`fallback_precision` instead."""
    if precision != "auto":
        return precision
    if device == "cuda":
        return "fp16"
    from worker.embedding import int8

    int8_engine = int8.engine() if cpu.has_vnni() else None
    if int8_engine == "openvino":
        return "int8"
    if cpu_has_bf16():
        return "bf16"
    return "int8" if int8_engine else "fp32"


def fallback_precision() -> str:
    """What ``auto`` runs on a CPU when the int8 export fails its gate: bf16 where the CPU has it, else fp32."""
    return "bf16" if cpu_has_bf16() else "fp32"


def model_prompts(st, document_prompt: str | None, query_prompt: str | None) -> tuple[str, str]:
    """``(document prompt, query prompt)``: each override when given (``""`` = none), else what
    ``encode_document`` / ``encode_query`` of the model ``st`` would use."""
    prompts = dict(getattr(st, "prompts", None) or {})
    # sentence-transformers 6 adds empty "query" and "document" prompts to every model, so its
    # encode_document picks "document" ("") over a configured "passage" (e5's name): skip empty ones.
    # Like encode_document / encode_query, never the model's default prompt (those method-specific
    # prompts override it, "even an empty prompt").
    if document_prompt is None:
        document_prompt = next((prompts[n] for n in ("document", "passage", "corpus") if prompts.get(n)), "")
    if query_prompt is None:
        query_prompt = prompts.get("query") or ""
    return document_prompt, query_prompt


class TextSide:
    """The prepare thread's side of a sentence-transformers model (``Embedder.preparer``): its
    tokenizer and document prompt, without the weights, so a model set keeps it while a model is
    unloaded and loaded again. Used from the prepare thread only (it owns its ``Tokens``)."""

    def __init__(self, tokens: Tokens, document_prompt: str) -> None:
        self.tokens = tokens
        self.document_prompt = document_prompt

    def prepare(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each document text (the document prompt before it), unpadded; the ids that
        :meth:`offsets_over` kept for whole texts are taken as they are."""
        return self.tokens.with_prompt(texts, self.document_prompt)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Character spans of each text's tokens (no special tokens, nothing truncated), from the
        tokenizer's Rust backend; a slow tokenizer's cut between words."""
        found = self.tokens.token_offsets(texts)
        return [word_spans(t) for t in texts] if found is None else found

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]:
        """As :meth:`Embedder.offsets_over`, tokenizing each text once (``Tokens.offsets_over``: the
        ids of a text that fits whole are kept for :meth:`prepare`)."""
        found = self.tokens.offsets_over(texts, limit)
        if found is None:
            return [o if len(o) > limit else None for o in self.token_offsets(texts)]
        return found


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model on CPU or CUDA at the chosen precision."""

    def __init__(self, model: str | None = None, precision: str = "auto", device: str = "auto",
                 sub_batch_size: int | None = None, sub_batch_tokens: int | None = None, *,
                 document_prompt: str | None = None, query_prompt: str | None = None,
                 truncate_dim: int | None = None, sparse: SparseMode | str = sparse_modes.OFF) -> None:
        import torch

        self._torch = torch
        self.model_id, path = resolve_model_path(model)
        #: Where the model was loaded from (the packaged one's directory when ``model`` is None).
        self.model_path = path
        self.device = pick_device(device)
        self.precision = self._checked_precision(pick_precision(precision, self.device))
        #: The loaded ``SentenceTransformer``, for tools that compare with it (raw encode, reference
        #: vectors, parameter counts). The worker itself runs its modules through ``embed``.
        self.sentence_transformer = self._load(path)
        self.max_seq_length = int(getattr(self.sentence_transformer, "max_seq_length", None) or 512)
        self._read_dimension(truncate_dim)
        self.document_prompt, self.query_prompt = model_prompts(self.sentence_transformer, document_prompt,
                                                                query_prompt)
        #: The tokenizer side (``worker.embedding.tokens``): the prepare thread's (``text_side``), once loaded.
        self.tokens = Tokens(self.sentence_transformer.tokenizer, self.max_seq_length,
                             keep_whole=not self.document_prompt)
        self.special_tokens = self.tokens.special_tokens
        self.prompt_tokens = self.tokens.length(self.document_prompt) if self.document_prompt else 0
        #: The prepare thread's side (``preparer``), and what the pooling needs of the document prompt
        #: (measured now: the embed thread never tokenizes a document).
        self.text_side = TextSide(self.tokens, self.document_prompt)
        self._document_extra = self._prompt_extra(self.document_prompt)
        #: The embed thread's side: the modules on the device, pass by pass (``worker.embedding.forward``).
        self.forward = ForwardPasses(torch, self._modules_but_normalize(), self.tokens, self.device, self.precision,
                                     self.dim, self.truncate_dim, pass_sizes(self.device, sub_batch_size,
                                                                              sub_batch_tokens))
        self.sparse = SparseMode.of(sparse)
        #: The sparse model run beside the dense one (``worker.embedding.sparse``); None without one.
        self.learned_sparse = (LearnedSparse(self.sparse.setting, self.device, self.sentence_transformer.dtype,
                                             self.sentence_transformer.tokenizer, self.forward.modules)
                               if self.sparse.learned else None)
        #: The int8 transformer this embedder runs (None at other precisions), for tools that run the
        #: library's own ``encode`` through it (the bench's raw encode).
        self.int8_transformer = None
        #: At int8, the cosine of this model's int8 vectors to its float32 ones (``int8.check_quality``).
        self.int8_quality: Any = None
        if self.precision == "int8":
            _int8_or_fallback(self, path, fall_back=precision == "auto")
        prompts = "".join(f", {what} prompt {p!r}" for what, p in (("document", self.document_prompt),
                                                                      ("query", self.query_prompt)) if p)
        log.info("model %s loaded: dim=%d precision=%s device=%s sparse=%s%s", self.model_id, self.dim,
                 self.precision, self.device, self.sparse, prompts)

    # -- construction, step by step ------------------------------------------------------------
    def _checked_precision(self, precision: str) -> str:
        """``precision`` if it can run on this device (int8 runs on CPUs only); fp16 on a CPU runs, with a warning."""
        if precision == "fp16" and self.device == "cpu":
            log.warning("fp16 on a CPU is slower than fp32 here; consider EMBEDSTREAM_PRECISION=auto")
        if precision == "int8" and self.device != "cpu":
            raise ConfigError("EMBEDSTREAM_PRECISION=int8 runs on CPUs: on CUDA use fp16 (or auto)")
        return precision

    def _load(self, path: str):
        """The ``SentenceTransformer`` at ``path`` on the device, its weights at the precision (int8:
        float32 here, its transformer swapped later), in eval mode."""
        import transformers

        from worker.embedding.imports import sentence_transformers

        transformers.logging.disable_progress_bar()  # no "Loading weights" bar in the worker's log
        dtype = getattr(self._torch, _DTYPES.get(self.precision, "float32"))
        try:
            st = sentence_transformers().SentenceTransformer(str(path), device=self.device,
                                                             model_kwargs={"torch_dtype": dtype})
        except Exception as exc:
            raise ConfigError(
                f"could not load model {self.model_id!r} from {path!r}: {exc}. Check EMBEDSTREAM_MODEL."
            ) from None
        st.eval()
        return st

    def _read_dimension(self, truncate_dim: int | None) -> None:
        """``dim``: the model's, or ``truncate_dim`` of it (checked against it)."""
        st = self.sentence_transformer
        dim = (getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension)()
        if dim is None:
            raise ConfigError(f"model {self.model_id!r} does not say its embedding dimension: not a sentence-"
                              "transformers embedding model? Check EMBEDSTREAM_MODEL.")
        if truncate_dim is not None and not 1 <= truncate_dim <= int(dim):
            raise ConfigError(f"EMBEDSTREAM_TRUNCATE_DIM={truncate_dim}, but model {self.model_id!r} makes {dim}-dim "
                              "vectors: use a value from 1 to that (a Matryoshka model keeps its leading dimensions)")
        #: Keep the first ``truncate_dim`` dimensions (renormalised); None: all.
        self.truncate_dim = truncate_dim
        self.dim = truncate_dim or int(dim)

    def _modules_but_normalize(self) -> list:
        """The model's modules minus Normalize: we normalise in float32 (see the module doc)."""
        from sentence_transformers.models import Normalize

        return [m for m in self.sentence_transformer if not isinstance(m, Normalize)]

    @property
    def cache_id(self) -> str:
        """As :attr:`Embedder.cache_id`, plus ``+int8`` for int8 vectors: they stay within the gate of
        float32 ones but are kept apart from them in the cache."""
        return super().cache_id + ("+int8" if self.precision == "int8" else "")

    # -- the phases ---------------------------------------------------------------------------
    @property
    def preparer(self) -> TextSide:
        return self.text_side

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added, truncated to the model's max), unpadded."""
        return self.tokens.tokenize(texts)

    def prepare(self, texts: list[str]) -> list[list[int]]:
        return self.text_side.prepare(texts)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        return self.text_side.token_offsets(texts)

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]:
        return self.text_side.offsets_over(texts, limit)

    def _prompt_extra(self, prompt: str) -> dict:
        """What the pooling is told of ``prompt`` (its length, when there is one)."""
        return {"prompt_length": self.tokens.prompt_length(prompt)} if prompt else {}

    def warmup(self) -> None:
        """As :meth:`Embedder.warmup`; at int8 also one forward pass at each of the two largest shapes
        a pass can take (the longest texts the token budget holds, and the most texts at the length
        that fills it). OpenVINO pays on the first pass of each new shape (measured here: +30-50 %
        of that pass; +10-20 % once the largest shapes have run, their buffers then fitting every
        smaller one), so a fresh worker's first few thousand documents ran ~15 % slower without
        it. About 0.3 s at start-up."""
        super().warmup()
        if self.precision == "int8":
            self.forward.warm_shapes()

    # -- the whole ---------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self.document_prompt)[0]

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self.query_prompt)[0]

    def embed_sparse(self, texts: list[str], query: bool = False) -> tuple[np.ndarray, list[Sparse]]:
        if self.learned_sparse is None:
            return super().embed_sparse(texts, query)
        dense, rows = self._embed(texts, self.query_prompt if query else self.document_prompt, self.learned_sparse)
        return dense, rows or []

    def embed_prepared(self, prepared: list) -> Embedded:
        """The vectors of document texts :meth:`prepare` made into ids (and their learned sparse
        vectors with a learned sparse side): forward passes only."""
        return self.forward.embed_ids(prepared, self._document_extra, self.learned_sparse)

    def _embed(self, texts: list[str], prompt: str, learned: LearnedSparse | None = None) -> Embedded:
        """The vectors of ``texts`` (``prompt`` before each), and with ``learned`` each text's sparse
        vector too (``ForwardPasses.embed_ids``). Tokenizes on the calling thread."""
        return self.forward.embed_ids(self.tokens.with_prompt(texts, prompt), self._prompt_extra(prompt), learned)



def _int8_or_fallback(model: SentenceTransformerEmbedder, path: str, fall_back: bool) -> None:
    """Run ``model``'s int8 export (:func:`_swap_in_int8`); where it fails its gate and ``fall_back``
    (the precision was ``auto``), run :func:`fallback_precision` instead, else stop."""
    try:
        _swap_in_int8(model, path)
    except ConfigError as exc:
        if not fall_back:
            raise
        model.precision = model.forward.precision = fallback_precision()
        log.warning("%s: auto runs %s instead", exc, model.precision)
        if model.precision == "bf16":
            model.sentence_transformer.to(model._torch.bfloat16)


def _swap_in_int8(model: SentenceTransformerEmbedder, path: str) -> None:
    """Swap ``model``'s transformer for its int8 export (``worker.embedding.int8``), after checking
    that export against the model in float32; a drift past the gate stops the start."""
    from worker.embedding import int8

    fp32 = model._embed(int8.CHECK_TEXTS, "")[0]
    quantized = int8.load(model.sentence_transformer, path, model.max_seq_length)
    modules = model.forward.modules
    original, modules[0] = modules[0], quantized
    quality = int8.check_quality(model._embed(int8.CHECK_TEXTS, "")[0], fp32)
    model.int8_quality = quality
    if not quality.passes:
        modules[0] = original
        raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: the int8 model drifts from float32 (cosine mean "
                          f"{quality.mean:.4f}, min {quality.min:.4f}; the gate is {int8.MIN_MEAN_COSINE} and "
                          f"{int8.MIN_COSINE}): use bf16 or fp32 for this model")
    model.int8_transformer = modules[0]
    if int8.engine() == "openvino":
        int8.record_check(path, quality)  # a later start may then skip torch (worker.embedding.lite)
    log.info("int8 checked against fp32 on %d texts: cosine mean %.4f, min %.4f", quality.texts, quality.mean,
             quality.min)
