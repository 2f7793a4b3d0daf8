"""sentence-transformers models, with the precision chosen for the device.

Precision ``auto``: fp16 on CUDA; on a CPU with VNNI where OpenVINO is installed int8
(``worker.embedding.int8``: static int8, about 1.5x bf16 and 2.5x fp32, gated against fp32 at
start-up); else bf16 on a CPU with avx512_bf16 or AMX (about 2.5x fp32 there, with cosine ≥ 0.998 to
fp32); else on CPUs with VNNI int8 by onnxruntime where it is installed (about 2x fp32), else fp32 (fp16 on a CPU is
slower than fp32). Whatever the precision, the pooled output is cast to float32 *before* it is normalised:
normalising in bf16 leaves norms off by up to ~0.4 %.

Texts are run in forward passes cut from the length-sorted list within a token budget
(``worker.embedding.passes``), so short texts are not padded to the longest one of the batch.

Prompts and truncation follow sentence-transformers' own ``encode_document`` / ``encode_query``: the
document prompt is the model's ``document`` (else ``passage``, else ``corpus``) prompt; the query
prompt its ``query`` prompt (an empty prompt counts as none; the model's default prompt is not
used). A prompt is put before the text, and its length goes to the pooling (a model that pools
without the prompt, ``include_prompt: false``, leaves it out). ``truncate_dim`` keeps the first
dimensions (Matryoshka models), normalised again.
"""

from __future__ import annotations

import logging

import numpy as np

from schemas.errors import ConfigError
from worker import metrics
from worker.embedding import cpu
from worker.embedding.base import Embedder, resolve_model_path
from worker.embedding.passes import PASS_TOKENS, split_by_budget, split_by_cost

log = logging.getLogger(__name__)

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # int8: float32 in torch, int8 in ONNX


def cpu_has_bf16() -> bool:
    """True when the CPU advertises avx512_bf16 or AMX (``worker.embedding.cpu``)."""
    return cpu.has_bf16()


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("EMBEDSTREAM_DEVICE=cuda but torch sees no CUDA device: use auto or cpu")
    return device


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


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model on CPU or CUDA at the chosen precision."""

    def __init__(self, model: str | None = None, precision: str = "auto", device: str = "auto",
                 sub_batch_size: int | None = None, sub_batch_tokens: int | None = None, *,
                 document_prompt: str | None = None, query_prompt: str | None = None,
                 truncate_dim: int | None = None) -> None:
        import torch
        import transformers

        from worker.embedding.imports import sentence_transformers

        SentenceTransformer = sentence_transformers().SentenceTransformer

        transformers.logging.disable_progress_bar()  # no "Loading weights" bar in the worker's log

        self.model_id, path = resolve_model_path(model)
        #: Where the model was loaded from (the packaged one's directory when ``model`` is None).
        self.model_path = path
        self.device = pick_device(device)
        self.precision = pick_precision(precision, self.device)
        if self.precision == "fp16" and self.device == "cpu":
            log.warning("fp16 on a CPU is slower than fp32 here; consider EMBEDSTREAM_PRECISION=auto")
        if self.precision == "int8" and self.device != "cpu":
            raise ConfigError("EMBEDSTREAM_PRECISION=int8 runs on CPUs: on CUDA use fp16 (or auto)")
        try:
            self.sentence_transformer = SentenceTransformer(
                str(path), device=self.device,
                model_kwargs={"torch_dtype": getattr(torch, _DTYPES.get(self.precision, "float32"))}
            )
        except Exception as exc:
            raise ConfigError(
                f"could not load model {self.model_id!r} from {path!r}: {exc}. Check EMBEDSTREAM_MODEL."
            ) from None
        #: The loaded ``SentenceTransformer``, for tools that compare with it (raw encode, reference
        #: vectors, parameter counts). The worker itself runs its modules through ``embed``.
        self.sentence_transformer.eval()
        self._torch = torch
        self._tokenizer = self.sentence_transformer.tokenizer
        self._pad_id = int(self._tokenizer.pad_token_id or 0)
        self._pad_left = getattr(self._tokenizer, "padding_side", "right") == "left"
        self._token_types = "token_type_ids" in getattr(self._tokenizer, "model_input_names", ())
        self.max_seq_length = int(getattr(self.sentence_transformer, "max_seq_length", None) or 512)
        self.special_tokens = int(self._tokenizer.num_special_tokens_to_add(pair=False))
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
        self.document_prompt, self.query_prompt = model_prompts(st, document_prompt, query_prompt)
        self.prompt_tokens = len(self._tokenizer(self.document_prompt, add_special_tokens=False)["input_ids"]) \
            if self.document_prompt else 0
        self._prompt_lengths: dict[str, int] = {}
        #: Token ids of whole texts that ``offsets_over`` tokenized last (``_ids`` reuses them).
        self._known_ids: dict[str, list[int]] = {}
        from sentence_transformers.models import Normalize

        # Run the modules ourselves, minus Normalize: we normalise in float32 (see module doc).
        self._modules = [m for m in self.sentence_transformer if not isinstance(m, Normalize)]
        # Measured on a 2-core CPU (bf16): 4,096 padded tokens per forward pass beat 8,192 by ~25 % on
        # stdlib docstrings; up to 128 texts a pass (not 32) is ~20 % faster on one-sentence texts,
        # where the per-pass overhead weighs. A GPU wants far larger passes: on an H100 (fp16, one
        # run each), 262,144 tokens a pass embedded 1.9x the docstrings/s of 65,536 (5,500 vs 2,900).
        # The worker's batches (EMBEDSTREAM_MAX_BATCH_TOKENS) bound the passes too.
        gpu = self.device == "cuda"
        self.sub_batch_size = sub_batch_size or (256 if gpu else 128)
        self.sub_batch_tokens = sub_batch_tokens or (262_144 if gpu else 4096)
        self.int8_transformer = None
        self._real_tokens = metrics.MODEL_TOKENS.labels("real")
        self._padded_tokens = metrics.MODEL_TOKENS.labels("padded")
        if self.precision == "int8":
            try:
                self._use_int8(path)
            except ConfigError as exc:
                if precision != "auto":
                    raise
                self.precision = fallback_precision()
                log.warning("%s: auto runs %s instead", exc, self.precision)
                if self.precision == "bf16":
                    self.sentence_transformer.to(torch.bfloat16)
        log.info("model %s loaded: dim=%d precision=%s device=%s%s", self.model_id, self.dim, self.precision,
                 self.device, "".join(f", {what} prompt {p!r}" for what, p in (("document", self.document_prompt),
                                                                             ("query", self.query_prompt)) if p))

    def _use_int8(self, path: str) -> None:
        """Swap the transformer for its int8 export (``worker.embedding.int8``), after checking
        that export against this model in float32; a drift past the gate stops the start."""
        from worker.embedding import int8

        fp32 = self._embed(int8.CHECK_TEXTS, "")
        quantized = int8.load(self.sentence_transformer, path, self.max_seq_length)
        original, self._modules[0] = self._modules[0], quantized
        quality = int8.check_quality(self._embed(int8.CHECK_TEXTS, ""), fp32)
        #: Cosine of this model's int8 vectors to its float32 ones on ``int8.CHECK_TEXTS``.
        self.int8_quality = quality
        if not quality.passes:
            self._modules[0] = original
            raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: the int8 model drifts from float32 (cosine mean "
                              f"{quality.mean:.4f}, min {quality.min:.4f}; the gate is {int8.MIN_MEAN_COSINE} and "
                              f"{int8.MIN_COSINE}): use bf16 or fp32 for this model")
        #: The int8 transformer this embedder runs (None at other precisions), for tools that run the
        #: library's own ``encode`` through it (the bench's raw encode).
        self.int8_transformer = self._modules[0]
        log.info("int8 checked against fp32 on %d texts: cosine mean %.4f, min %.4f", quality.texts, quality.mean,
                 quality.min)

    @property
    def cache_id(self) -> str:
        """As :attr:`Embedder.cache_id`, plus ``+int8`` for int8 vectors: they stay within the gate of
        float32 ones but are kept apart from them in the cache."""
        return super().cache_id + ("+int8" if self.precision == "int8" else "")

    # -- the phases ---------------------------------------------------------------------------
    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added, truncated to the model's max), unpadded."""
        return self._tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.max_seq_length,
                               return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def _encodings(self, texts: list[str]) -> list | None:
        """The Rust backend's encodings of ``texts`` (no special tokens, nothing truncated); None for
        a slow tokenizer, which has no offsets. The backend's truncation and padding settings are
        shared state that each ``tokenize`` call sets again, so they are cleared here, on the same
        (embed) thread."""
        backend = getattr(self._tokenizer, "_tokenizer", None)
        if backend is None:
            return None
        backend.no_truncation()
        backend.no_padding()
        return backend.encode_batch(texts, add_special_tokens=False)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Character spans of each text's tokens (no special tokens, nothing truncated), from the
        tokenizer's Rust backend; a slow tokenizer's cut between words."""
        encodings = self._encodings(texts)
        if encodings is None:
            return super().token_offsets(texts)
        return [list(enc.offsets) for enc in encodings]

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]:
        """As :meth:`Embedder.offsets_over`, tokenizing each text once. The ids of a text that fits
        the model whole are kept for ``embed`` (until the next call here), so the chunk step's long
        texts that stay one chunk are not tokenized a second time: the same ids the model's own
        tokenizing would give (the text is whole, nothing is truncated), so the same vectors. Not
        with a document prompt: the model then tokenizes prompt and text together."""
        encodings = self._encodings(texts)
        if encodings is None:
            return super().offsets_over(texts, limit)
        backend = self._tokenizer._tokenizer
        out: list[list[tuple[int, int]] | None] = []
        known: dict[str, list[int]] = {}
        for text, enc in zip(texts, encodings):
            if len(enc.ids) > limit:
                out.append(list(enc.offsets))
                continue
            out.append(None)
            if not self.document_prompt:
                ids = backend.post_process(enc).ids  # the special tokens added, as tokenize() adds them
                if len(ids) <= self.max_seq_length:
                    known[text] = ids
        self._known_ids = known
        return out

    def prompt_length(self, prompt: str) -> int:
        """The prompt's tokens as the pooling counts them: with the leading special token, without a
        trailing one (what sentence-transformers hands a pooling that leaves the prompt out)."""
        if prompt not in self._prompt_lengths:
            ids = self._tokenizer([prompt], add_special_tokens=True)["input_ids"][0]
            trailing = ids and ids[-1] in set(self._tokenizer.all_special_ids)
            self._prompt_lengths[prompt] = len(ids) - (1 if trailing else 0)
        return self._prompt_lengths[prompt]

    def pad(self, ids: list[list[int]]) -> dict:
        """The model inputs of one forward pass: ``ids`` padded to the longest, with the attention
        mask (what the tokenizer's own padding makes, without tokenizing again)."""
        longest = max(len(seq) for seq in ids)
        input_ids = np.full((len(ids), longest), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, seq in enumerate(ids):
            cols = slice(longest - len(seq), longest) if self._pad_left else slice(0, len(seq))
            input_ids[row, cols] = seq
            mask[row, cols] = 1
        self._real_tokens.inc(int(mask.sum()))
        self._padded_tokens.inc(mask.size)
        torch = self._torch
        features = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self._token_types:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return {k: v.to(self.device) for k, v in features.items()}

    def run(self, features: dict):
        """Forward pass → pooled embeddings (a tensor in the model's dtype)."""
        with self._torch.inference_mode():
            for module in self._modules:
                features = module(features)
            return features["sentence_embedding"]

    def normalise(self, pooled):
        """Cast to float32, keep ``truncate_dim`` dimensions, then L2-normalise (in that order: see the
        module doc); stays on the device."""
        pooled = pooled.float()
        if self.truncate_dim:
            pooled = pooled[:, : self.truncate_dim]
        return self._torch.nn.functional.normalize(pooled, p=2, dim=1)

    def warmup(self) -> None:
        """As :meth:`Embedder.warmup`; at int8 also one forward pass at each of the two largest shapes
        a pass can take (the longest texts the token budget holds, and the most texts at the length
        that fills it). OpenVINO pays on the first pass of each new shape (measured here: +30-50 %
        of that pass; +10-20 % once the largest shapes have run, their buffers then fitting every
        smaller one), so a fresh worker's first few thousand documents ran ~15 % slower without
        it. About 0.3 s at start-up."""
        super().warmup()
        if self.precision != "int8":
            return
        for count, length in self.largest_shapes():  # what the ids are does not matter, only the shape
            self.run(self.pad([[self._pad_id] * length] * count))

    def largest_shapes(self) -> list[tuple[int, int]]:
        """``(texts, tokens each)`` of the two largest forward passes :meth:`passes` makes:
        the longest texts the model takes, as many as the token budget holds; and the most texts a
        pass takes, as long as the budget lets them be."""
        longest = self.max_seq_length
        return [(max(1, min(self.sub_batch_size, self.sub_batch_tokens // longest)), longest),
                (self.sub_batch_size, max(2, min(longest, self.sub_batch_tokens // self.sub_batch_size)))]

    def passes(self, lengths: list[int]) -> list[list[int]]:
        """The forward passes of texts of ``lengths`` tokens (``worker.embedding.passes``): on a CPU the
        cut of least cost at this precision, on CUDA the greedy one."""
        if self.device == "cuda":
            return split_by_budget(lengths, self.sub_batch_size, self.sub_batch_tokens)
        return split_by_cost(lengths, self.sub_batch_size, self.sub_batch_tokens, PASS_TOKENS[self.precision])

    # -- the whole ---------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self.document_prompt)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self.query_prompt)

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """``tokenize(texts)``, taking the ids :meth:`offsets_over` kept where it has them."""
        known = self._known_ids
        if not known:
            return self.tokenize(texts)
        found = [known.get(t) for t in texts]
        todo = [i for i, seq in enumerate(found) if seq is None]
        fresh = dict(zip(todo, self.tokenize([texts[i] for i in todo]))) if todo else {}
        return [seq if seq is not None else fresh[i] for i, seq in enumerate(found)]

    def _embed(self, texts: list[str], prompt: str) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # Tokenized once; each forward pass pads its own length-sorted slice. Results are copied off
        # the device only at the end: on a GPU the passes queue up and the CPU pads the next slice
        # while the GPU computes this one (a copy per pass would wait for each).
        ids = self.tokenize([prompt + t for t in texts]) if prompt else self._ids(texts)
        extra = {"prompt_length": self.prompt_length(prompt)} if prompt else {}
        done = [(group, self.normalise(self.run({**self.pad([ids[i] for i in group]), **extra})))
                for group in self.passes([len(seq) for seq in ids])]
        for group, vectors in done:
            out[group] = vectors.cpu().numpy()
        return out
