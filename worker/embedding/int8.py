"""INT8 on CPUs: the model's transformer run with int8 weights by OpenVINO or onnxruntime.

The transformer (the model's first module) is exported once to ONNX with torch's exporter, then
quantized by one of two engines (:func:`engine`):

- **OpenVINO** (``openvino`` and ``nncf`` installed; preferred): static quantization by NNCF, with
  activation ranges calibrated once on :func:`calibration_texts` (docstrings of the local standard
  library; nothing downloaded). Measured here 1.6-1.9x torch bf16 on docstrings. A text's vector does
  not depend on the other texts of its forward pass, since the activation ranges are fixed.
- **onnxruntime** (``onnxruntime`` only): dynamic quantization (int8 weights per output channel,
  activations quantized on the fly with a range per tensor, so a text's companions move its vector a
  little; 7-bit weights on CPUs without VNNI, :func:`reduce_range`).

The files are kept under ``$XDG_CACHE_HOME/embedstream/int8`` (``~/.cache`` by default), keyed by a
hash of the transformer's files and the engine (:func:`model_key`), so a later start loads them in
about a second. Pooling and
any layers after it (a projection, a normalisation) run in torch, in float32, as for the other
precisions.

Every export is checked against the same model in float32 on a fixed set of sentences before it is
used (:func:`check_quality`): an int8 model that drifts past the gate fails the start instead of
writing poorer vectors. The engines are an optional dependency (``pip install 'embedstream[int8]'``).
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
from worker.embedding.base import digest_files
from worker.settings import cache_home

log = logging.getLogger(__name__)

#: Bump when the export or the quantization changes: older cached files are then not reused.
EXPORT_VERSION = 1
#: The quality gate of int8 (cosine to float32).
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


def _importable(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def engine() -> str | None:
    """The int8 engine installed here: ``"openvino"`` (openvino, nncf and onnx), else
    ``"onnxruntime"`` (onnxruntime and onnx), else None."""
    if _importable("openvino", "nncf", "onnx"):
        return "openvino"
    if _importable("onnxruntime", "onnx"):
        return "onnxruntime"
    return None


def available() -> bool:
    """Whether an int8 engine (:func:`engine`) is installed."""
    return engine() is not None


def cache_root() -> Path:
    return cache_home() / "embedstream" / "int8"


#: Files of a sentence-transformers model folder that belong to the pipeline, not to its first
#: (transformer) module: the module list, prompts, the model card, its training data. None of them
#: changes the exported transformer, so a model that only adds or edits later modules (a projection,
#: a pooling option, prompts) shares its base's export.
PIPELINE_FILES = frozenset({"modules.json", "config_sentence_transformers.json", "README.md", "data_config.json"})


def _modules(root: Path) -> tuple[Path, set[Path]]:
    """The transformer's folder (``modules.json``'s first entry; ``root`` when there is no list) and
    the other modules' folders, resolved."""
    listing = root / "modules.json"
    if not listing.is_file():
        return root, set()
    modules = json.loads(listing.read_text())
    folder = root / (modules[0].get("path") or "") if modules else root
    return folder, {(root / m["path"]).resolve() for m in modules[1:] if m.get("path")}


def transformer_folder(path: str | Path) -> Path:
    """The folder of the model at ``path`` that holds its transformer (the first module)."""
    return _modules(Path(path))[0]


def transformer_files(path: str | Path) -> list[Path]:
    """The files of the model at ``path`` that its transformer (the first module, the one exported)
    is made of, sorted: its folder (:func:`transformer_folder`), with every file under it but those
    of the other modules' folders and :data:`PIPELINE_FILES`."""
    root = Path(path)
    folder, others = _modules(root)
    files = []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        real = f.resolve()
        if any(o == real or o in real.parents for o in others):
            continue
        if f.parent == root and f.name in PIPELINE_FILES:
            continue
        files.append(f)
    return files


def model_key(path: str | Path, engine_name: str = "onnxruntime") -> str:
    """A hash of the transformer's files (:func:`transformer_files`: names, sizes and contents of the
    small ones, the first and last MiB of large ones), of the export version, of the engine and, for
    onnxruntime, of the weights' bit width (:func:`reduce_range`): a changed transformer, another
    engine, or a disk shared with another kind of CPU, gets a new export; a model that differs only
    after its transformer (pooling, a projection, prompts) shares it."""
    tag = f"-{engine_name}" if engine_name != "onnxruntime" else ("-7bit" if reduce_range() else "")
    digest = hashlib.sha256(f"v{EXPORT_VERSION}{tag}".encode())
    digest_files(transformer_files(path), Path(path), digest)
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


#: Standard-library modules whose docstrings calibrate OpenVINO's activation ranges: prose of several
#: kinds (networking, files, text, concurrency, dates, errors), present wherever Python is.
CALIBRATION_MODULES = ("argparse", "asyncio/streams", "calendar", "collections/__init__", "csv", "datetime",
                       "email/message", "ftplib", "gzip", "http/client", "json/__init__", "logging/__init__",
                       "mailbox", "pathlib", "shutil", "smtplib", "subprocess", "tarfile", "tempfile", "textwrap",
                       "threading", "unittest/case", "urllib/parse", "uuid", "zipfile/__init__", "zipfile")
#: How many texts calibrate (in passes of ``CALIBRATION_BATCH``): 300 took ~20 s with MiniLM here.
CALIBRATION_TEXTS = 300
CALIBRATION_BATCH = 8


def calibration_texts(n: int = CALIBRATION_TEXTS) -> list[str]:
    """The texts OpenVINO's int8 activation ranges are calibrated on, up to ``n``, in a stable order:
    docstrings (at least 20 characters) of :data:`CALIBRATION_MODULES` and, a fifth of them, their
    first words."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    for name in CALIBRATION_MODULES:
        path = root / f"{name}.py"
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a trimmed standard library: calibrate on what there is
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 20 and doc not in out:
                    out.append(doc)
    # A text of a word or two runs through other ranges than prose (without such texts "ok" fell to a
    # cosine of 0.93 to fp32; with them 0.97-0.98): a fifth of the set is the first one to three words of docstrings.
    docs = out[:n - n // 5]
    short = [" ".join(d.split()[:1 + i % 3]).rstrip(".,:;") for i, d in enumerate(docs[:n // 5])]
    return docs + short[:n // 5]


def _export_onnx(transformer, tokenizer, names: list[str], path: Path) -> None:
    """The Hugging Face model inside sentence-transformers' ``Transformer`` module, in float32, to
    ONNX at ``path`` (inputs ``names``, output ``last_hidden_state``; batch and sequence axes dynamic)."""
    import torch

    model = transformer.auto_model.float().eval()
    sample = tokenizer(["an example sentence", "another"], padding=True, return_tensors="pt")
    args = tuple(sample[n] for n in names)

    class LastHidden(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            return self.inner(**dict(zip(names, inputs)), return_dict=True).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(model), args, str(path), input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)


def _quantize_openvino(onnx_path: Path, tokenizer, names: list[str], max_length: int, dest: Path) -> None:
    """NNCF's post-training quantization of the ONNX model (transformer preset: int8 matmuls, with
    the layers it knows to keep in float left alone), calibrated on :func:`calibration_texts`;
    saved as OpenVINO IR at ``dest`` (``.xml`` and ``.bin``)."""
    import nncf
    import openvino as ov

    nncf.set_log_level(logging.WARNING)
    texts = calibration_texts()
    batches = []
    for i in range(0, len(texts), CALIBRATION_BATCH):
        enc = tokenizer(texts[i:i + CALIBRATION_BATCH], padding=True, truncation=True, max_length=max_length,
                        return_tensors="np")
        batches.append({n: enc[n].astype(np.int64) for n in names})
    model = ov.Core().read_model(str(onnx_path))
    quantized = nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(batches))
    ov.save_model(quantized, str(dest))


#: The quantized model's file, by engine.
FILES = {"openvino": "model-int8.xml", "onnxruntime": "model-int8.onnx"}


def export(transformer, tokenizer, dest: Path, engine_name: str = "onnxruntime", max_length: int = 512) -> Path:
    """Export the transformer to ``dest/model.onnx``, then quantize it with ``engine_name``
    (:data:`FILES` names the result); returns the quantized model's path. Written to a temporary
    folder first and renamed, so a crash never leaves half a model in the cache."""
    names = _input_names(tokenizer)
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    # The tracer's and the quantizers' advice (TracerWarnings about Python booleans in the attention
    # mask, onnxruntime's "consider pre-processing" on the root logger) says nothing a user can act on.
    quiet = _DropRecords()
    logging.getLogger().addFilter(quiet)
    try:
        _export_onnx(transformer, tokenizer, names, tmp / "model.onnx")
        if engine_name == "openvino":
            _quantize_openvino(tmp / "model.onnx", tokenizer, names, max_length, tmp / FILES["openvino"])
        else:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(tmp / "model.onnx"), str(tmp / FILES["onnxruntime"]), weight_type=QuantType.QInt8,
                             per_channel=True, reduce_range=reduce_range())
    finally:
        logging.getLogger().removeFilter(quiet)
    (tmp / "export.json").write_text(json.dumps({
        "version": EXPORT_VERSION, "engine": engine_name, "inputs": names,
        **({"calibration_texts": CALIBRATION_TEXTS} if engine_name == "openvino" else
           {"weight_bits": 7 if reduce_range() else 8}),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    try:
        tmp.rename(dest)
    except OSError:  # another worker on the same disk finished first (its folder is there): keep theirs
        if not dest.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / FILES[engine_name]


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


#: Input shapes whose compiled kernels OpenVINO's CPU plugin keeps (its default, 5,000, holds
#: megabytes a shape: a worker's passes come in thousands of (texts, tokens) shapes, and resident
#: memory grew without end, 1 GB -> 5 GB in a 10-minute soak). 16 keeps what a flood of odd shapes
#: leaves at about +20 MB over a clean run (64 left +47 to +71 MB after 90,000 hostile records), at a
#: cost inside this host's noise on ordinary traffic (docs/benchmarks.md: 0-9 % on backlog passes of
#: short texts, none seen on mixed ones). A shape seen again after eviction pays its ~12 ms compile.
SHAPE_CACHE = 16
#: oneDNN's own kernel cache, which outlives a compiled model, is bounded by the command line at start
#: (``worker.commands.cli.PRIMITIVE_CACHE``).


#: The folder, beside an OpenVINO export, where OpenVINO keeps the export compiled for this CPU.
COMPILED = "compiled"


def compiled_cache(path: Path) -> dict[str, str]:
    """OpenVINO's ``CACHE_DIR`` for the export at ``path``: its ``compiled`` folder, made where it can
    be; nothing where there is none.

    Compiling the int8 MiniLM costs ~0.9 s of CPU at every start; loading it compiled costs ~0.1 s
    and ~20 MB less resident memory, with the same outputs (measured on this project's 2-core host).
    OpenVINO keys each compiled copy by the model, the device and the options, and compiles again
    where a copy is missing or unreadable (a truncated one was seen recompiled and rewritten). A
    read-only folder is read: the CPU image bakes its copy beside the export, and a pod on a
    read-only root loads it; where it holds no copy for these options, OpenVINO compiles and keeps
    nothing (seen on a read-only bind mount, both ways)."""
    folder = path.parent / COMPILED
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        pass
    return {"CACHE_DIR": str(folder)} if folder.is_dir() else {}


class OpenVinoTransformer:
    """As :class:`OnnxTransformer`, for OpenVINO's int8 model: what it keeps in float runs in bf16
    on CPUs with bf16 instructions (measured here: 1.0-1.6x f32 there at the same cosine to fp32),
    else in f32. One infer request, called from the embed thread only."""

    def __init__(self, path: Path, input_names: list[str]) -> None:
        import openvino as ov

        hint = "bf16" if cpu.has_bf16() else "f32"
        config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                  "CPU_RUNTIME_CACHE_CAPACITY": SHAPE_CACHE, **compiled_cache(path)}
        try:
            compiled = ov.Core().compile_model(str(path), "CPU", config)
        except RuntimeError as exc:
            if "CACHE_DIR" not in config:
                raise
            # A copy it cannot read, on a folder where it cannot remove it (OpenVINO writes its copies
            # readable by their owner's group only: another user's, on a read-only root): compiled here.
            log.warning("int8 model's compiled copy in %s not loaded (%s): compiling it at this start",
                        config["CACHE_DIR"], str(exc).strip().splitlines()[-1][:200])
            config.pop("CACHE_DIR")
            compiled = ov.Core().compile_model(str(path), "CPU", config)
        #: Whether OpenVINO loaded a compiled copy (:func:`compiled_cache`) rather than compiling now.
        self.from_cache = bool(compiled.get_property("LOADED_FROM_CACHE"))
        self.request = compiled.create_infer_request()
        self.input_names = input_names

    def infer(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The last hidden state of one padded pass (numpy inputs): a copy, since the request's
        buffer is reused."""
        return self.request.infer({n: arrays[n] for n in self.input_names})[0]

    def __call__(self, features: dict) -> dict:
        import torch

        features["token_embeddings"] = torch.from_numpy(self.infer({n: features[n].numpy() for n in self.input_names}))
        return features


def load(st, model_path: str | Path, max_length: int) -> OnnxTransformer | OpenVinoTransformer:
    """The int8 transformer of the sentence-transformers model ``st`` (loaded from ``model_path``; its
    texts at most ``max_length`` tokens, what calibration truncates to) on
    :func:`engine`: from the cache, else exported now (tens of seconds, logged). Raises ConfigError
    when no engine is installed or the model's first module is not a Hugging Face transformer."""
    engine_name = engine()
    if engine_name is None:
        raise ConfigError("EMBEDSTREAM_PRECISION=int8 needs OpenVINO (openvino, nncf, onnx) or onnxruntime (and onnx): "
                          "pip install 'embedstream[int8]', or use auto, fp32 or bf16")
    transformer = st[0]
    if not hasattr(transformer, "auto_model"):
        raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: the model's first module ({type(transformer).__name__}) is "
                          "not a Hugging Face transformer that can be exported; use auto, fp32 or bf16")
    dest = cache_root() / model_key(model_path, engine_name)
    path = dest / FILES[engine_name]
    if not path.exists():
        log.info("exporting the model to ONNX and quantizing it to int8 with %s (once; kept in %s)", engine_name, dest)
        t0 = time.perf_counter()
        try:
            path = export(transformer, st.tokenizer, dest, engine_name, max_length)
        except OSError as exc:
            raise ConfigError(f"EMBEDSTREAM_PRECISION=int8: cannot write the exported model under {dest} ({exc}): "
                              "set XDG_CACHE_HOME to a writable folder") from None
        log.info("int8 export done in %.1fs", time.perf_counter() - t0)
    names = json.loads((dest / "export.json").read_text())["inputs"]
    return (OpenVinoTransformer if engine_name == "openvino" else OnnxTransformer)(path, names)


def record_check(model_path: str | Path, quality: Quality) -> None:
    """Write the check of ``model_path``'s OpenVINO export into its ``export.json``, so a later start
    may load the export without the float32 model to check it against (``worker.embedding.lite``).
    A read-only cache keeps no record: that start then checks again. Written beside and renamed over
    it, so a start reading it while another writes never reads half a file."""
    meta = cache_root() / model_key(model_path, "openvino") / "export.json"
    try:
        found = json.loads(meta.read_text())
        found["check"] = {"mean": quality.mean, "min": quality.min, "texts": quality.texts, "passes": quality.passes,
                          "gate": [MIN_MEAN_COSINE, MIN_COSINE]}
        tmp = meta.with_name(f"{meta.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(json.dumps(found))
            os.replace(tmp, meta)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, ValueError) as exc:
        log.debug("int8 check not recorded in %s (%s)", meta, exc)


def check_quality(int8_vectors: np.ndarray, fp32_vectors: np.ndarray) -> Quality:
    cos = (int8_vectors * fp32_vectors).sum(1) / (
        np.linalg.norm(int8_vectors, axis=1) * np.linalg.norm(fp32_vectors, axis=1))
    return Quality(float(cos.mean()), float(cos.min()), len(cos))
