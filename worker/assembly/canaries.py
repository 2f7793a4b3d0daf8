"""Each model's canary against the collection it writes (``worker.embedding.canary`` says what the
canary guards): stored by the first worker, compared by every later one before it writes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from connectors.milvus import MilvusAdmin
from schemas.errors import ConfigError, TransientError
from worker.embedding.base import Embedder
from worker.embedding.canary import Canary, bound

log = logging.getLogger(__name__)


#: How long a start-up keeps trying while workers starting together store the canary at once (two
#: processes of one pod, both finding none, raced on milvus-lite's schema file: the loser's write failed).
RACE_WINDOW_S = 10.0
#: Seconds between storing the canary and reading it back.
READ_BACK_S = 0.5


def check_canary(admin: MilvusAdmin, model: Embedder, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Embed the canary texts with ``model`` and compare them with what ``admin``'s collection keeps;
    keep them there when it keeps none (or one of other texts). Returns the smallest cosine found
    (None: this worker stored the canary). Raises :class:`ConfigError` with one line when the model
    does not make the vectors the collection holds. A Milvus failure is tried again for up to
    :data:`RACE_WINDOW_S`, reading first: a worker that lost the race compares with the winner's."""
    now = Canary.of(model)
    mine = now.dumps()
    deadline = clock() + RACE_WINDOW_S
    while True:
        try:
            stored = _stored(admin)
            if stored is not None and now.comparable(stored):
                break
            admin.keep_canary(mine)
            # Milvus has no compare-and-set: a worker storing at the same time may have replaced ours.
            # Read it back after a moment; another's is compared with, as if it had been there first.
            sleep(READ_BACK_S)
            if admin.canary() != mine:
                continue
            log.info("canary of %s at %s on %s kept with collection %s (%d texts)", model.model_id, model.precision,
                     model.device, admin.collection, len(now.vectors))
            return None
        except TransientError as exc:
            if clock() >= deadline:
                raise ConfigError(f"Milvus at {admin.where!r} did not answer, or refused, while checking the canary of "
                                  f"collection {admin.collection!r} ({exc}): check EMBEDSTREAM_MILVUS_URI, and that "
                                  "the worker's Milvus user may describe the collection and alter its properties"
                                  ) from None
            log.info("Milvus: %s while checking the canary of %s; another worker may be storing it, trying again",
                     exc, admin.collection)
            sleep(0.5)
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
    stored = _stored(admin)
    if stored is None:
        return None
    now = Canary.of(model)
    return float(now.cosines(stored).min()) if now.comparable(stored) else None


def _stored(admin: MilvusAdmin) -> Canary | None:
    """The canary ``admin``'s collection keeps; None when it keeps none, or one this worker cannot
    read. Raises TransientError."""
    kept = admin.canary()
    if kept is None:
        return None
    try:
        return Canary.loads(kept)
    except ValueError as exc:
        # Replacing it would drop the only record of what wrote the collection's vectors.
        raise ConfigError(f"collection {admin.collection!r} keeps a canary this worker cannot read ({exc}): the "
                          f"property {admin.CANARY_PROPERTY!r} was written by something else. Delete that property "
                          "if the collection's vectors are this model's (the next worker stores its own), or "
                          "re-embed into a new collection with `embedstream migrate`") from None
