"""int8 on CPUs without torch: a worker that starts in about a second instead of five.

Importing torch, transformers and sentence-transformers takes 3.7 s of a worker's ~5 s start on this
project's CPU host (``docs/benchmarks.md``), though at int8 the forward pass is OpenVINO's and the rest
is a tokenizer and a mean. So where a model is plain enough, and its int8 export is already in the
cache and has passed its check against float32 (``worker.embedding.int8``), :func:`lite_model` builds
the same :class:`~worker.embedding.sentence.SentenceTransformerEmbedder` from parts that need none of
them:

- the tokenizer's Rust library (``tokenizers``), wrapped as the calls :class:`Tokens` makes
  (:class:`RustTokenizer`: the same ids, truncation and offsets as transformers' fast tokenizer);
- the cached OpenVINO model (``int8.OpenVinoTransformer``);
- pooling, truncation and normalisation in numpy, in float32 (:class:`NumpyPasses`), on the same
  forward passes.

Plain enough: modules Transformer, Pooling (mean or CLS) and optionally Normalize; no prompt (the
model's or a setting's); no learned sparse model; a CPU (``EMBEDSTREAM_DEVICE=cpu``, or ``auto`` on a
host without an NVIDIA device); ``int8`` chosen (or ``auto`` choosing it) with OpenVINO. Anything
else, and the first start of a model (it exports and checks), takes the full load; nothing changes
but the time it takes. The vectors are the full load's: ``tests/unit/test_lite.py`` compares both.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from schemas.errors import ConfigError
from schemas.sparse import SparseMode
from worker.embedding import int8
from worker.embedding.base import resolve_model_path
from worker.embedding.forward import ForwardPasses, pass_sizes
from worker.embedding.tokens import Tokens

log = logging.getLogger(__name__)

#: The sentence-transformers modules this path runs, in order (Normalize optional: vectors are
#: normalised either way).
PLAIN_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                 "sentence_transformers.models.Normalize")


class RustTokenizer:
    """The calls :class:`~worker.embedding.tokens.Tokens` makes of a transformers fast tokenizer,
    answered by the ``tokenizers`` library from the model's ``tokenizer.json``."""

    def __init__(self, folder: Path, input_names: list[str]) -> None:
        from tokenizers import Tokenizer

        #: What the model takes (the int8 export's inputs): ``token_type_ids`` among them for BERT.
        self.model_input_names = input_names
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = _json(folder / "tokenizer_config.json") or {}
        special = _json(folder / "special_tokens_map.json") or {}
        pad = config.get("pad_token") or special.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id = self._tokenizer.token_to_id(pad) if pad else None
        self.padding_side = config.get("padding_side", "right")
        self.all_special_ids = sorted(i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special)

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        processor = self._tokenizer.post_processor
        return processor.num_special_tokens_to_add(pair) if processor is not None else 0

    def __call__(self, texts, add_special_tokens: bool = True, truncation: bool = False,
                 max_length: int | None = None, **_ignored: Any) -> dict[str, Any]:
        """``{"input_ids": ...}`` for ``texts`` (a list) or one text, unpadded, truncated to
        ``max_length`` with ``truncation``: what the fast tokenizer's call returns for them."""
        backend = self._tokenizer
        backend.no_padding()
        if truncation and max_length:
            backend.enable_truncation(max_length)
        else:
            backend.no_truncation()
        if isinstance(texts, str):
            return {"input_ids": backend.encode(texts, add_special_tokens=add_special_tokens).ids}
        return {"input_ids": [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]}


class NumpyPasses(ForwardPasses):
    """:class:`ForwardPasses` with an int8 transformer and numpy pooling: no torch anywhere. ``pooling``
    is ``"mean"`` or ``"cls"``, as sentence-transformers' Pooling computes them."""

    def __init__(self, transformer: int8.OpenVinoTransformer, pooling: str, tokens: Tokens, dim: int,
                 truncate_dim: int | None) -> None:
        super().__init__(None, [transformer], tokens, "cpu", "int8", dim, truncate_dim,
                         pass_sizes("cpu", None, None))
        self.transformer = transformer
        self.pooling = pooling

    def pad(self, ids: list[list[int]]) -> dict:
        return self.tokens.pad(ids)

    def run(self, features: dict) -> np.ndarray:
        hidden = self.transformer.infer(features)
        mask = features["attention_mask"]
        if self.pooling == "cls":
            return hidden[:, 0]
        weights = mask[:, :, None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)

    def normalise(self, pooled: np.ndarray) -> np.ndarray:
        pooled = pooled.astype(np.float32, copy=False)
        if self.truncate_dim:
            pooled = pooled[:, : self.truncate_dim]
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def to_host(self, vectors: np.ndarray) -> np.ndarray:
        return vectors


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _no_gpu() -> bool:
    """No NVIDIA driver on this host (``auto`` then means the CPU, as torch would find): where there
    is one, torch decides."""
    return not Path("/dev/nvidiactl").exists()


def why_not(path: Path, precision: str, device: str, prompts: tuple[str | None, str | None],
            sparse: SparseMode) -> str | None:
    """Why the model at ``path`` must take the full load (None: it need not)."""
    if device not in ("cpu", "auto") or (device == "auto" and not _no_gpu()):
        return "a GPU may be used"
    from worker.embedding.sentence import pick_precision  # (its module imports torch only to load)

    engine, resolved = int8.engine(), pick_precision(precision, "cpu")
    if resolved != "int8" or engine != "openvino":
        return f"precision {precision} (here {resolved}) with int8 engine {engine}: not OpenVINO's int8"
    if sparse.learned:
        return "a learned sparse model runs in torch"
    modules = _json(path / "modules.json") or []
    kinds = tuple(m.get("type") for m in modules)
    if kinds not in (PLAIN_MODULES, PLAIN_MODULES[:2]):
        return f"modules {kinds}"
    model_prompts = (_json(path / "config_sentence_transformers.json") or {}).get("prompts") or {}
    if any(p for p in prompts) or any(model_prompts.values()):
        return "prompts"
    return None


def _pooling(path: Path) -> tuple[str, int] | None:
    """(``mean`` or ``cls``, the output dimension) from the Pooling module's config; None otherwise."""
    modules = _json(path / "modules.json")
    config = _json(path / modules[1]["path"] / "config.json") or {}
    modes = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
    known = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
    mode = known.get(modes[0]) if len(modes) == 1 else None
    if mode is None or config.get("include_prompt") is False or "word_embedding_dimension" not in config:
        return None
    return mode, int(config["word_embedding_dimension"])


def lite_model(model: str | None, precision: str = "auto", device: str = "auto", *,
               document_prompt: str | None = None, query_prompt: str | None = None,
               truncate_dim: int | None = None, sparse: SparseMode | str = "off"):
    """The model as the full load would make it at int8 on the CPU, without torch (the module doc);
    None where this start must take the full load (logged at debug, with why)."""
    from worker.embedding.sentence import SentenceTransformerEmbedder, TextSide

    model_id, where = resolve_model_path(model)
    path, mode = Path(where), SparseMode.of(sparse) if isinstance(sparse, str) else sparse
    reason = why_not(path, precision, device, (document_prompt, query_prompt), mode)
    folder = int8.transformer_folder(path)
    export = int8.cache_root() / int8.model_key(path, "openvino")
    checked = (_json(export / "export.json") or {}).get("check")
    pooling = _pooling(path) if reason is None else None
    max_length = (_json(folder / "sentence_bert_config.json") or {}).get("max_seq_length")
    if reason is None:
        reason = ("no pooling of mean or CLS" if pooling is None else "no export checked against float32 yet"
                  if not (checked and checked.get("passes") and (export / int8.FILES["openvino"]).exists())
                  else "no max_seq_length" if not max_length
                  else "no tokenizer.json" if not (folder / "tokenizer.json").exists() else None)
    if reason is not None or pooling is None:
        log.debug("model %s: the full load (%s)", model_id, reason)
        return None
    dim = pooling[1]
    if truncate_dim is not None and not 1 <= truncate_dim <= dim:
        raise ConfigError(f"EMBEDSTREAM_TRUNCATE_DIM={truncate_dim}, but model {model_id!r} makes {dim}-dim "
                          "vectors: use a value from 1 to that (a Matryoshka model keeps its leading dimensions)")
    names = (_json(export / "export.json") or {})["inputs"]
    assert checked is not None and max_length  # (the reasons above)
    emb: Any = SentenceTransformerEmbedder.__new__(SentenceTransformerEmbedder)  # its attributes set here
    emb._torch, emb.sentence_transformer, emb.learned_sparse = None, None, None
    emb.model_id, emb.model_path, emb.device, emb.precision = model_id, where, "cpu", "int8"
    emb.max_seq_length, emb.truncate_dim, emb.dim = int(max_length), truncate_dim, truncate_dim or dim
    emb.document_prompt = emb.query_prompt = ""
    emb.tokens = Tokens(RustTokenizer(folder, names), emb.max_seq_length, keep_whole=True)
    emb.special_tokens, emb.prompt_tokens = emb.tokens.special_tokens, 0
    emb.text_side, emb._document_extra = TextSide(emb.tokens, ""), {}
    emb.int8_transformer = int8.OpenVinoTransformer(export / int8.FILES["openvino"], names)
    emb.weights_bytes = (export / int8.FILES["openvino"]).with_suffix(".bin").stat().st_size  # what a set counts
    emb.forward = NumpyPasses(emb.int8_transformer, pooling[0], emb.tokens, emb.dim, truncate_dim)
    emb.sparse = mode
    emb.int8_quality = int8.Quality(checked["mean"], checked["min"], checked["texts"])
    log.info("model %s loaded without torch: dim=%d precision=int8 device=cpu sparse=%s (its int8 export checked "
             "against float32 when it was made: cosine mean %.4f, min %.4f; %s)", model_id, emb.dim, mode,
             checked["mean"], checked["min"],
             "its compiled copy loaded" if emb.int8_transformer.from_cache else "compiled at this start")
    return emb
