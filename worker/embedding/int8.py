"""INT8 on CPUs: the model's transformer run by onnxruntime with int8 weights.

The transformer (the model's first module) is exported once to ONNX with torch's exporter and its
weights quantized to int8 by onnxruntime (dynamic quantization: int8 weights per output channel,
activations quantized on the fly, so no calibration set is needed; 7-bit weights on CPUs without
VNNI, :func:`reduce_range`). Both files are kept under
``$XDG_CACHE_HOME/embedstream/int8`` (``~/.cache`` by default), keyed by a hash of the model's
files, so a later start loads them in about a second; nothing is downloaded. Pooling and any layers
after it (a projection, a normalisation) run in torch, in float32, as for the other precisions.

Every export is checked against the same model in float32 on a fixed set of sentences before it is
used (:func:`check_quality`): an int8 model that drifts past the gate fails the start instead of
writing poorer vectors. ``onnxruntime`` and ``onnx`` are an optional dependency
(``pip install 'embedstream[int8]'``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.errors import ConfigError
from worker.embedding import cpu
from worker.settings import cache_home

log = logging.getLogger(__name__)

#: Bump when the export or the quantization changes: older cached files are then not reused.
EXPORT_VERSION = 1
#: The gate of issue 14 (cosine to float32).
MIN_MEAN_COSINE = 0.99
MIN_COSINE = 0.97

#: What an export is checked on: sentences of several lengths and kinds (prose, code, a list, a
#: question), each embedded by the int8 and the float32 model.
CHECK_TEXTS = [
    "Return the number of items in a container.",
    "The worker consumes documents from Kafka, embeds them in batches and upserts the vectors into Milvus.",
    "How do I rotate the credentials of a service account without downtime?",
    "def add(a, b):\n    return a + b",
    "Compress data with the zlib algorithm and write the result to a file object opened in binary mode.",
    "Paris is the capital and most populous city of France.",
    "Open the file, read it line by line, strip trailing whitespace, and count the lines that are not empty.",
    "Error: connection refused while contacting the schema registry at http://localhost:8081.",
    "apples, oranges, pears, plums, cherries, grapes",
    "A transaction either commits every write it holds or none of them.",
    "The quick brown fox jumps over the lazy dog.",
    "Gradient descent updates each parameter against the direction of the loss gradient, scaled by a "
    "learning rate, until the loss stops decreasing or a budget of steps is spent.",
    "Send an e-mail message over SMTP.",
    "Kubernetes scales the deployment to zero replicas when the consumer lag stays at zero.",
    "ok",
    "Tokenize a string into words, keeping punctuation as separate tokens, and lower-case every word.",
]


def available() -> bool:
    """Whether onnxruntime (and onnx, for quantizing) can be imported here."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def cache_root() -> Path:
    return cache_home() / "embedstream" / "int8"


def model_key(path: str | Path) -> str:
    """A hash of the model directory's files (names, sizes and contents of the small ones, and the
    first and last MiB of large ones), of the export version and of the weights' bit width
    (:func:`reduce_range`): a changed model, or a disk shared with another kind of CPU, gets a new
    export."""
    digest = hashlib.sha256(f"v{EXPORT_VERSION}{'-7bit' if reduce_range() else ''}".encode())
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        size = f.stat().st_size
        digest.update(f"{f.relative_to(path)}:{size}".encode())
        with open(f, "rb") as fh:
            if size <= 2 << 20:
                digest.update(fh.read())
            else:
                digest.update(fh.read(1 << 20))
                fh.seek(-(1 << 20), os.SEEK_END)
                digest.update(fh.read())
    return digest.hexdigest()[:24]


def reduce_range() -> bool:
    """Quantize weights to 7 bits on CPUs without VNNI. There onnxruntime multiplies u8 activations
    by s8 weights with instructions whose 16-bit sums can saturate: measured on an AVX2-only EPYC
    (MiniLM, 600 corpus texts), full-range weights kept a min cosine to fp32 of 0.967 (below the
    gate), 7-bit ones 0.981; speed within the noise of one run each (85-107 vs 92 docs/s; fp32 66-70)."""
    return not cpu.has_vnni()


@dataclass
class Quality:
    """Cosine of int8 to float32 vectors over ``texts`` texts."""

    mean: float
    min: float
    texts: int

    @property
    def passes(self) -> bool:
        return self.mean >= MIN_MEAN_COSINE and self.min >= MIN_COSINE


def _input_names(tokenizer) -> list[str]:
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in getattr(tokenizer, "model_input_names", ()):
        names.append("token_type_ids")
    return names


class _DropRecords(logging.Filter):
    """On the root logger, drops the records logged to it directly (onnxruntime.quantization does);
    a logger's filters never see what its children propagate, so every module's records still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def export(transformer, tokenizer, dest: Path) -> Path:
    """Export the Hugging Face model inside sentence-transformers' ``Transformer`` module to
    ``dest/model.onnx`` (batch and sequence axes dynamic), then quantize it to
    ``dest/model-int8.onnx``; returns the latter. Written to a temporary folder first and renamed,
    so a crash never leaves half a model in the cache."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = _input_names(tokenizer)
    model = transformer.auto_model.float().eval()
    sample = tokenizer(["an example sentence", "another"], padding=True, return_tensors="pt")
    args = tuple(sample[n] for n in names)

    class LastHidden(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            return self.inner(**dict(zip(names, inputs)), return_dict=True).last_hidden_state

    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    # The tracer's and the quantizer's advice (TracerWarnings about Python booleans in the attention
    # mask, onnxruntime's "consider pre-processing" on the root logger) says nothing a user can act on.
    quiet = _DropRecords()
    logging.getLogger().addFilter(quiet)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(LastHidden(model), args, str(tmp / "model.onnx"), input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
            quantize_dynamic(str(tmp / "model.onnx"), str(tmp / "model-int8.onnx"), weight_type=QuantType.QInt8,
                             per_channel=True, reduce_range=reduce_range())
    finally:
        logging.getLogger().removeFilter(quiet)
    (tmp / "export.json").write_text(json.dumps({"version": EXPORT_VERSION, "inputs": names,
                                                  "weight_bits": 7 if reduce_range() else 8,
                                                  "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    if dest.exists():  # another worker on the same disk finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(dest)
    return dest / "model-int8.onnx"


class OnnxTransformer:
    """Stands in for sentence-transformers' ``Transformer`` module in the embedder's module list:
    takes the padded features, returns them with ``token_embeddings`` (float32, torch)."""

    def __init__(self, path: Path, input_names: list[str]) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_names = input_names

    def __call__(self, features: dict) -> dict:
        import torch

        feed = {n: features[n].numpy() for n in self.input_names}
        out = self.session.run(["last_hidden_state"], feed)[0]
        features["token_embeddings"] = torch.from_numpy(out)
        return features


def load(st, model_path: str | Path) -> OnnxTransformer:
    """The int8 transformer of the sentence-transformers model ``st`` (loaded from ``model_path``):
    from the cache, else exported now (tens of seconds, logged). Raises ConfigError when onnxruntime
    is missing or the model's first module is not a Hugging Face transformer."""
    if not available():
        raise ConfigError("EMBEDSTREAM_PRECISION=int8 needs onnxruntime and onnx: pip install 'embedstream[int8]', "
                          "or use auto, fp32 or bf16")
    transformer = st[0]
    if not hasattr(transformer, "auto_model"):
        raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: the model's first module ({type(transformer).__name__}) is "
                          "not a Hugging Face transformer that can be exported; use auto, fp32 or bf16")
    dest = cache_root() / model_key(model_path)
    path = dest / "model-int8.onnx"
    if not path.exists():
        log.info("exporting the model to ONNX and quantizing it to int8 (once; kept in %s)", dest)
        t0 = time.perf_counter()
        try:
            path = export(transformer, st.tokenizer, dest)
        except OSError as exc:
            raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: cannot write the exported model under {dest} ({exc}): "
                              "set XDG_CACHE_HOME to a writable folder") from None
        log.info("int8 export done in %.1fs", time.perf_counter() - t0)
    names = json.loads((dest / "export.json").read_text())["inputs"]
    return OnnxTransformer(path, names)


def check_quality(int8_vectors: np.ndarray, fp32_vectors: np.ndarray) -> Quality:
    cos = (int8_vectors * fp32_vectors).sum(1) / (
        np.linalg.norm(int8_vectors, axis=1) * np.linalg.norm(fp32_vectors, axis=1))
    return Quality(float(cos.mean()), float(cos.min()), len(cos))
