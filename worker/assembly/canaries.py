"""Each model's canary against the collection it writes (``worker.embedding.canary`` says what the
canary guards): stored by the first worker, compared by every later one before it writes."""

from __future__ import annotations

import logging

from connectors.milvus import MilvusAdmin
from schemas.errors import ConfigError, TransientError
from worker.embedding.base import Embedder
from worker.embedding.canary import Canary, bound

log = logging.getLogger(__name__)


def check_canary(admin: MilvusAdmin, model: Embedder) -> float | None:
    """Embed the canary texts with ``model`` and compare them with what ``admin``'s collection keeps;
    keep them there when it keeps none (or one of other texts). Returns the smallest cosine found
    (None: this worker stored the canary). Raises :class:`ConfigError` with one line when the model
    does not make the vectors the collection holds."""
    now = Canary.of(model)
    try:
        kept = admin.canary()
        stored = _read(kept, admin.collection) if kept is not None else None
        if stored is None or not now.comparable(stored):
            admin.keep_canary(now.dumps())
            log.info("canary of %s at %s on %s kept with collection %s (%d texts)", model.model_id, model.precision,
                     model.device, admin.collection, len(now.vectors))
            return None
    except TransientError as exc:
        raise ConfigError(f"Milvus at {admin.where!r} did not answer while checking the canary of collection "
                          f"{admin.collection!r} ({exc}): check EMBEDSTREAM_MILVUS_URI") from None
    cosines = now.cosines(stored)
    worst, need = float(cosines.min()), bound(stored.precision, now.precision)
    if worst < need:
        raise ConfigError(
            f"model {model.model_id} at {now.precision} on {now.device} does not make the vectors collection "
            f"{admin.collection} holds: canary cosine {worst:.4f} (text {int(cosines.argmin())}), under the "
            f"{need} that {stored.precision} against {now.precision} must reach; what differs from the worker that "
            f"stored it: {now.differences(stored)}. Writing would mix two vector spaces in one collection: run "
            "what wrote it, or re-embed into a new collection with `embedstream migrate`")
    log.info("canary of %s at %s on %s: cosine %.4f at least against the one kept at %s on %s (bound %s)",
             model.model_id, now.precision, now.device, worst, stored.precision, stored.device, need)
    return worst


def canary_cosine(admin: MilvusAdmin, model: Embedder) -> float | None:
    """The smallest cosine between the canary ``admin``'s collection keeps and ``model``'s vectors of
    the same texts now (None: it keeps none comparable). Raises TransientError."""
    kept = admin.canary()
    stored = _read(kept, admin.collection) if kept is not None else None
    if stored is None:
        return None
    now = Canary.of(model)
    return float(now.cosines(stored).min()) if now.comparable(stored) else None


def _read(kept: str, collection: str) -> Canary | None:
    try:
        return Canary.loads(kept)
    except ValueError as exc:
        log.warning("collection %s keeps a canary this worker cannot read (%s): replacing it", collection, exc)
        return None
