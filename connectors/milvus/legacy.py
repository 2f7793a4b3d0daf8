"""Taking over a collection from before aliases: the worker once wrote to the collection its
setting named; now that name is an alias. At start-up such a collection is renamed to the worker's
collection (its rows and its companion of deletes kept), so that the alias can take its name."""

from __future__ import annotations

import logging

from connectors.milvus.connection import MilvusConnection
from connectors.milvus.reads import MilvusReader
from connectors.milvus.schema import check_shape
from schemas.errors import ConfigError
from schemas.sparse import SparseKind

log = logging.getLogger(__name__)


def adopt(admin: MilvusConnection, legacy: str, model_id: str, dim: int, sparse: SparseKind = SparseKind.OFF) -> bool:
    """Take over ``legacy``, a collection from before aliases whose name the alias is to bear: it
    is renamed to ``admin``'s collection (its rows and its companion of deletes kept), so that the alias
    can take its name. True when this call renamed it; False when there was nothing to adopt (or
    another worker did it first). Raises :class:`ConfigError` when its dim, shape or model is not
    this worker's: those rows belong to another model (`embedstream migrate`)."""
    try:
        if not _present(admin, legacy):
            return False
        if admin.has(admin.collection):
            if not _present(admin, legacy):
                return False  # a worker starting beside this one adopted it, or created the alias
            raise ConfigError(f"Milvus holds both a collection {legacy!r} and {admin.collection!r}, so the alias "
                              f"{legacy!r} cannot be created: drop the one not in use, or set "
                              "EMBEDSTREAM_MILVUS_ALIAS to another name")
        _check(admin, legacy, model_id, dim, sparse)
        if not _rename(admin, legacy, admin.collection):
            return False  # a worker starting beside this one renamed it
        if admin.has(f"{legacy}_deleted"):
            _rename(admin, f"{legacy}_deleted", admin.tombstones)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"could not take over collection {legacy!r} in Milvus at {admin.where!r} "
                          f"({type(exc).__name__}: {exc})") from None
    log.warning("collection %r from before aliases is now %r behind the alias %r (its rows kept)",
                legacy, admin.collection, legacy)
    return True


def _present(admin: MilvusConnection, legacy: str) -> bool:
    """Whether ``legacy`` is a collection, not an alias. ``has_collection`` answers True for an alias
    too, so the alias is asked after it: a worker starting beside this one may create the alias (or
    rename the collection) between the two calls, and this order sees either (CI, `run
    --processes 2`: asked the other way round, a fresh alias read as a collection to adopt)."""
    return admin.has(legacy) and admin.alias_target(legacy) is None


def _check(admin: MilvusConnection, legacy: str, model_id: str, dim: int, sparse: SparseKind) -> None:
    """Refuse to take over ``legacy`` when its shape, dim, sparse side or model is not this worker's."""
    check_shape(legacy, admin._client.describe_collection(legacy, timeout=admin.timeout), dim, sparse)
    admin._client.load_collection(legacy, timeout=admin.timeout)
    held = MilvusReader.sharing(admin, legacy).model_of()
    if held not in (None, "", model_id):
        raise ConfigError(f"collection {legacy!r} holds vectors of model {held!r}, this worker "
                          f"runs {model_id!r}: run the old model once to move the collection behind an "
                          f"alias, then `embedstream migrate --model {model_id}`")


def _rename(admin: MilvusConnection, old: str, new: str) -> bool:
    """Rename ``old`` to ``new`` and load it again (a renamed collection comes back released in
    milvus-lite); False when ``new`` appeared meanwhile (another worker renamed it)."""
    try:
        admin._client.rename_collection(old, new, timeout=admin.timeout)
    except Exception:
        if admin.has(new):
            return False
        raise
    admin._client.load_collection(new, timeout=admin.timeout)
    return True
