"""Several models in one worker: a configured set, loaded on first use within a memory budget.

``EMBEDSTREAM_MODELS`` names the set, as JSON or as the path of a YAML/JSON file (a mounted
ConfigMap)::

    {"minilm": {"path": "/models/minilm", "default": true},
     "e5": {"path": "/models/e5-small", "precision": "bf16", "document_prompt": "passage: ",
            "sparse": "/models/splade"}}

A record's ``model`` field picks one by its name (or the model's id); an empty field picks the
default (the one marked ``default``, else the first). Without the setting the set is the one model
of ``EMBEDSTREAM_MODEL`` and its neighbours.

Every model is loaded once at start-up, so that a wrong path, precision or dimension stops the worker
then, and what the rest of the chain needs is known without the weights: its dimension, its token
budget, its prompts (its :class:`~worker.embedding.base.ModelProfile`). The worker then holds the models that fit
``EMBEDSTREAM_MODEL_MEMORY_MB`` (their weights' bytes); a model that is asked for when it does not fit
is loaded after the least recently used ones are unloaded. Loads and evictions are logged and
counted (``embedstream_model_loads_total``, ``embedstream_model_evictions_total``). The chain holds a
:class:`LazyModel` per model: an :class:`Embedder` with the profile's attributes whose model calls
load the model first, so the chunk and embed steps work unchanged. Loading runs on the embed thread,
the only one that runs a model. The prepare thread's calls (chunk cuts, token ids) go to each
model's :attr:`~worker.embedding.base.Embedder.preparer`, kept from its first load: a tokenizer
without weights, so preparing never loads a model (nor unloads the one the embed thread runs).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.errors import ConfigError, TransientError
from worker.embedding.base import Embedder, ModelProfile, Preparer
from worker.embedding.sparse import Embedded, Sparse
from worker.process import heap, metrics

log = logging.getLogger(__name__)


class ModelSpec(BaseModel):
    """One model of the set, as configured."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="model path or name; None = the packaged default")
    #: None: EMBEDSTREAM_PRECISION / EMBEDSTREAM_DEVICE
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    document_prompt: str | None = None
    query_prompt: str | None = None
    truncate_dim: int | None = Field(None, ge=1)
    #: None: EMBEDSTREAM_SPARSE (a setting of ``schemas.sparse.SparseMode.of``)
    sparse: str | None = None
    default: bool = False


def parse_models(value: str) -> dict[str, ModelSpec]:
    """``EMBEDSTREAM_MODELS`` (JSON, or a path to a YAML or JSON file) → ``{name: spec}``, in order.
    Raises :class:`ConfigError` saying what is wrong."""
    text, where = value, "EMBEDSTREAM_MODELS"
    if not value.lstrip().startswith("{"):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"EMBEDSTREAM_MODELS={value!r} is neither a JSON object nor a file: give the model "
                              'set as JSON ({"name": {"path": ...}}) or the path of a YAML/JSON file')
        text, where = path.read_text(), str(path)
    try:
        import yaml  # a superset of JSON

        raw = yaml.safe_load(text)
    except Exception as exc:
        raise ConfigError(f"{where}: not valid YAML/JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: the model set must be a non-empty object of name → settings")
    specs: dict[str, ModelSpec] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}: model names must be non-empty strings, got {name!r}")
        try:
            specs[name] = ModelSpec.model_validate(spec or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"{where}: model {name!r}: {problems}") from None
    if sum(s.default for s in specs.values()) > 1:
        raise ConfigError(f"{where}: more than one model is marked default")
    return specs


def default_model(specs: dict[str, ModelSpec]) -> str:
    """The model of a record with no ``model``: the one marked default, else the first."""
    return next((n for n, s in specs.items() if s.default), next(iter(specs)))


def weight_bytes(embedder: Embedder) -> int:
    """Bytes of a loaded model's parameters and buffers (what it holds on its device)."""
    st = getattr(embedder, "sentence_transformer", None)
    if st is None:  # built without torch (worker.embedding.lite): its int8 weights' file
        return int(getattr(embedder, "weights_bytes", 0))
    tensors = [*st.parameters(), *st.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


class LazyModel(Embedder):
    """A model of the set by name: the profile's attributes, and calls that load it first."""

    def __init__(self, models: ModelSet, name: str) -> None:
        self._models = models
        self.name = name
        self._profile = models.profiles[name]
        for f in dataclasses.fields(ModelProfile):
            if f.name not in ("cache_id", "space_id"):  # properties of an Embedder, answered below
                setattr(self, f.name, getattr(self._profile, f.name))

    @property
    def profile(self) -> ModelProfile:
        return self._profile

    @property
    def cache_id(self) -> str:
        return self._profile.cache_id

    @property
    def space_id(self) -> str:
        return self._profile.space_id

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._models.acquire(self.name).embed(texts)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._models.acquire(self.name).embed_query(texts)

    def embed_sparse(self, texts: list[str], query: bool = False) -> tuple[np.ndarray, list[Sparse]]:
        return self._models.acquire(self.name).embed_sparse(texts, query)

    def embed_prepared(self, prepared: list) -> Embedded:
        return self._models.acquire(self.name).embed_prepared(prepared)

    @property
    def preparer(self) -> Preparer:
        return self._models.preparers[self.name]

    def prepare(self, texts: list[str]) -> list:
        return self.preparer.prepare(texts)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        return self.preparer.token_offsets(texts)

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None]:
        return self.preparer.offsets_over(texts, limit)

    def warmup(self) -> None:
        self._models.acquire(self.name).warmup()


class ModelSet:
    """The models of one worker by name; ``acquire(name)`` hands a loaded one (loading it, and
    unloading the least recently used ones when it does not fit ``memory_mb``)."""

    def __init__(self, specs: dict[str, ModelSpec], load: Callable[[ModelSpec], Embedder],
                 memory_mb: int | None = None, preloaded: dict[str, Embedder] | None = None) -> None:
        self.specs = specs
        self.default = default_model(specs)
        self._load = load
        self.budget = memory_mb * 1024 * 1024 if memory_mb else None
        self._lock = threading.Lock()
        self._resident: OrderedDict[str, Embedder] = OrderedDict()  # least recently used first
        self.profiles: dict[str, ModelProfile] = {}
        #: Each model's prepare-thread side, from its first load (``LazyModel.preparer``).
        self.preparers: dict[str, Preparer] = {}
        #: Bytes of each model's weights.
        self.sizes: dict[str, int] = {}
        self.loads = self.evictions = 0
        for name, spec in specs.items():  # every model once: a wrong setting fails now, not mid-stream
            model = (preloaded or {}).get(name) or self._timed_load(name, spec)
            self.profiles[name], self.sizes[name] = model.profile, weight_bytes(model)
            self.preparers[name] = model.preparer
            if self.budget is not None and self.sizes[name] > self.budget:
                raise ConfigError(f"model {name!r} needs {self.sizes[name] / 2**20:,.0f} MB of weights, more "
                                  f"than EMBEDSTREAM_MODEL_MEMORY_MB={memory_mb}: raise it")
            self._resident[name] = model
            self._fit(keep=name)
        # What a record's ``model`` may name a model by, besides its name in the set: its id
        # (``<name>@<hash>``), and, where only one model of the set answers to it, the name in its id
        # and the path or name it is configured with (what its id was before ids carried a hash).
        named: dict[str, set[str]] = {}
        for n, p in self.profiles.items():
            title = str(p.model_id).split("@", 1)[0]
            for alias in (specs[n].path, title, title.rsplit("/", 1)[-1]):
                if alias:
                    named.setdefault(alias, set()).add(n)
        self._ids = {alias: next(iter(ns)) for alias, ns in named.items() if len(ns) == 1}
        self._ids.update({p.model_id: n for n, p in self.profiles.items()})
        self.handles = {name: LazyModel(self, name) for name in specs}
        for p in self.profiles.values():
            metrics.MODEL_INFO.labels(p.model_id, p.precision, p.device).set(1)

    @classmethod
    def single(cls, embedder: Embedder, name: str | None = None) -> ModelSet:
        """A set of one model already loaded (no EMBEDSTREAM_MODELS)."""
        name = name or str(embedder.model_id).rsplit("/", 1)[-1]
        return cls({name: ModelSpec()}, load=lambda spec: embedder, preloaded={name: embedder})

    def resolve(self, requested: str | None) -> str | None:
        """The name of the model a record asks for (empty: the default); None when none serves it."""
        if not requested:
            return self.default
        if requested in self.specs:
            return requested
        return self._ids.get(requested)

    def loaded(self, name: str) -> bool:
        return name in self._resident

    def acquire(self, name: str) -> Embedder:
        """The loaded model ``name`` (marked most recently used). Loads it if needed, unloading the
        least recently used others until it fits; a load that fails for memory is retried after
        unloading every other model, then raised as TransientError (the batch waits and retries)."""
        with self._lock:
            model = self._resident.get(name)
            if model is not None:
                self._resident.move_to_end(name)
                return model
            self._fit(keep=None, room=self.sizes[name])
            try:
                model = self._timed_load(name, self.specs[name])
            except (MemoryError, RuntimeError, OSError) as exc:
                if not _out_of_memory(exc) or not self._resident:
                    raise TransientError("model", f"loading {name!r}: {exc}") from None
                self._unload_all()
                try:
                    model = self._timed_load(name, self.specs[name])
                except (MemoryError, RuntimeError, OSError) as again:
                    raise TransientError("model", f"loading {name!r}: {again}") from None
            self._resident[name] = model
            return model

    def _timed_load(self, name: str, spec: ModelSpec) -> Embedder:
        t0 = time.monotonic()
        model = self._load(spec)
        model.warmup()
        if heap.settled():  # a model loaded mid-stream joins the frozen heap (worker.process.heap)
            heap.settle()
        self.loads += 1
        took = time.monotonic() - t0
        metrics.MODEL_LOADS.labels(name).inc()
        metrics.MODEL_LOAD_SECONDS.labels(name).observe(took)
        log.info("model %s loaded in %.1fs (%s)", name, took, model.model_id)
        return model

    def _fit(self, keep: str | None, room: int = 0) -> None:
        """Unload least recently used models (never ``keep``) until ``room`` more bytes fit the budget."""
        if self.budget is None:
            return
        while self._resident and sum(self.sizes[n] for n in self._resident) + room > self.budget:
            victim = next((n for n in self._resident if n != keep), None)
            if victim is None:
                return
            self._unload(victim)

    def _unload(self, name: str) -> None:
        self._resident.pop(name)
        self.evictions += 1
        metrics.MODEL_EVICTIONS.labels(name).inc()
        log.info("model %s unloaded (EMBEDSTREAM_MODEL_MEMORY_MB: %s resident)", name,
                 ", ".join(self._resident) or "none")
        heap.release()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass

    def _unload_all(self) -> None:
        for name in list(self._resident):
            self._unload(name)


#: How a failed allocation reads: CUDA's ("CUDA out of memory"), torch's CPU allocator's ("DefaultCPUAllocator:
#: can't allocate memory", or "not enough memory" in other releases), the C library's (ENOMEM).
_OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed (worth retrying once other models are unloaded)."""
    if isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM:
        return True
    text = str(exc).lower()
    return any(words in text for words in _OUT_OF_MEMORY)


def describe(models: ModelSet) -> str:
    """One line per model for the start-up log."""
    return "; ".join(f"{n}{' (default)' if n == models.default else ''}: {p.model_id}, dim {p.dim}, "
                     f"{p.precision} on {p.device}, {models.sizes[n] / 2**20:,.0f} MB"
                     for n, p in models.profiles.items())
