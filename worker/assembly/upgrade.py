"""Starting on a collection an earlier release wrote: keep writing where readers read.

Release 0.1.0 named a model by its path (or its hub name) where this one names it by its name and a hash
of its files (``worker.embedding.base.model_identity``). The collection a model writes is named from
that id (``worker.assembly.naming.versioned_name``), so the first start after an upgrade would write a
new collection while the alias readers query stays on the old one: every update after the upgrade
invisible to search until someone ran ``migrate``.

At start-up, :func:`collection_to_write` finds the collection 0.1.0 would have written for this model
and this configuration. When the alias points to it, the worker checks that its model reproduces the
vectors stored there (a few stored chunks whose whole text is kept, embedded again: cosine at least
:data:`SAME_MODEL_COSINE`) and then writes that collection (adopted under the new id: its rows of the new
release carry the new id). When the vectors differ (other files at that path, another model), the worker
stops with a line that says to run ``migrate``, rather than write where nobody reads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from connectors.milvus import MilvusAdmin, MilvusReader
from connectors.milvus.schema import EXCERPT_CHARS
from schemas.errors import ConfigError
from worker.assembly.milvus import open_milvus
from worker.assembly.naming import alias_of, collection_of, versioned_name
from worker.embedding.base import PACKAGED_MODEL_ID, Embedder
from worker.settings import Settings

log = logging.getLogger(__name__)

#: The least cosine between a stored vector and the same text embedded again for the model to count as
#: the one that wrote it. Precisions of one model agree far above it (int8 against fp32: ≥ 0.98 here);
#: two different models land far below (two sentence models on one text: ~0.1–0.6).
SAME_MODEL_COSINE = 0.95
#: Stored chunks embedded again to judge.
SAMPLE = 8


def legacy_model_id(setting: str | None) -> str:
    """The id release 0.1.0 gave the model of this ``EMBEDSTREAM_MODEL`` value: the packaged model's hub
    name, a path's resolved path, any other name as given."""
    if setting is None or setting in (PACKAGED_MODEL_ID, "all-MiniLM-L6-v2"):
        return PACKAGED_MODEL_ID
    path = Path(setting).expanduser()
    if setting.startswith(("/", ".", "~")) or path.exists():
        return str(path.resolve()).rstrip("/")
    return setting


def legacy_collection(s: Settings, name: str, model: Embedder, setting: str | None) -> str | None:
    """The collection 0.1.0 would have written for ``model`` (None: the same as this release's)."""
    legacy_id = legacy_model_id(setting)
    if legacy_id == model.model_id or not model.space_id.startswith(model.model_id):
        return None
    ours = collection_of(s, name, model)
    base = ours.rsplit("__", 1)[0]
    return versioned_name(base, legacy_id, legacy_id + model.space_id[len(model.model_id):])


def collection_to_write(s: Settings, name: str, model: Embedder, setting: str | None) -> str:
    """The collection model ``name`` writes: this release's, or the one an earlier release wrote for the
    same model behind the alias (adopted once its vectors are reproduced). Raises :class:`ConfigError`
    when the alias points to an earlier release's collection of this configuration whose vectors this
    model does not reproduce."""
    ours = collection_of(s, name, model)
    legacy = legacy_collection(s, name, model, setting)
    if legacy is None:
        return ours
    reader = open_milvus(s, MilvusReader, alias_of(s, name))
    try:
        target = MilvusAdmin.sharing(reader).alias_target(alias_of(s, name))
        if target != legacy:
            return ours
        cosine = _reproduced(MilvusReader.sharing(reader, legacy), model)
    finally:
        reader.close()
    if cosine is None or cosine >= SAME_MODEL_COSINE:
        judged = "" if cosine is None else f" (its vectors reproduced: cosine {cosine:.3f})"
        log.warning("the alias %r points to %r, which an earlier release wrote for this model (its id then: %r); "
                    "this worker writes it too%s: readers see every update", alias_of(s, name), legacy,
                    legacy_model_id(setting), judged)
        return legacy
    raise ConfigError(f"the alias {alias_of(s, name)!r} points to {legacy!r}, written by an earlier release with "
                      f"model {legacy_model_id(setting)!r}, whose vectors this model ({model.model_id}) does not "
                      f"reproduce (cosine {cosine:.3f} on stored texts, under {SAME_MODEL_COSINE}): the files at that "
                      "path changed. Run `embedstream migrate --model <this model>` to re-embed into a new collection "
                      "and move the alias, rather than write where nobody reads")


def _reproduced(store: MilvusReader, model: Embedder) -> float | None:
    """The least cosine between stored vectors and their chunks' texts embedded again by ``model``, over
    a few documents of one short chunk, whose whole text the rows keep (None: the collection has none to
    judge by)."""
    rows = store.query(f"chunk_index == 0 and span_start == 0 and span_end <= {EXCERPT_CHARS}", ["excerpt", "vector"],
                       limit=4 * SAMPLE)
    rows = [r for r in rows if r.get("excerpt")][:SAMPLE]
    if not rows:
        return None
    stored = np.asarray([r["vector"] for r in rows], dtype=np.float32)
    if stored.shape[1] != model.dim:
        return 0.0
    fresh = np.asarray(model.embed([r["excerpt"] for r in rows]), dtype=np.float32)
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    return float(np.min(np.sum(stored * fresh, axis=1)))
