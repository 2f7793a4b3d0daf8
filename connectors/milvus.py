"""The Milvus collection of the contract (its shape: ``connectors.milvus_schema``): created if
missing, checked for dim and shape, chunk rows upserted and deleted, versions read.

Every call carries ``timeout=`` (a frozen server blocks forever without it), and every failure of
the server or the network becomes :class:`TransientError`, so the worker retries instead of
dead-lettering.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from connectors.milvus_schema import (
    CHUNK_FIELDS,
    VERSION_FIELDS,
    ChunkRows,
    check_shape,
    chunk_id,
    collection_schema,
    tombstone_schema,
    upsert_request,
)
from schemas.errors import ConfigError, TransientError

log = logging.getLogger(__name__)

# pymilvus pings every 10 s even without calls; gRPC servers by default allow one ping per 5 min
# and answer more with GOAWAY "too_many_pings", dropping the channel. Every call here carries its
# own timeout, so keepalive pings add nothing: keep them rare and only during calls.
_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": 0}

#: A version as the collection holds it: ``(source, source_offset)`` (either None on an odd row).
Version = tuple[str | None, int | None]


def _transient(exc: Exception) -> TransientError:
    return TransientError("milvus", f"{type(exc).__name__}: {exc}")


def _connect(uri: str, token: str | None, timeout: float) -> Any:
    """A ``MilvusClient``; a refused handshake is retried for a few seconds before the URI is called wrong."""
    from pymilvus import MilvusClient

    deadline = time.monotonic() + max(timeout, 5.0)
    delay = 0.25
    while True:
        try:
            # dedicated: pymilvus otherwise shares one channel per URI in a process, and recovers it
            # with the timeout of whichever client opened it first.
            return MilvusClient(uri=uri, token=token or "", timeout=timeout, dedicated=True,
                                grpc_options=_GRPC_OPTIONS)
        except Exception as exc:
            # A busy or just-starting server refuses the handshake now and then.
            if time.monotonic() + delay > deadline:
                raise ConfigError(f"cannot reach Milvus at {uri!r}: {exc}. Check EMBEDSTREAM_MILVUS_URI.") from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _missing(exc: Exception) -> bool:
    """The server answered that the thing asked for does not exist."""
    text = str(exc).lower()
    return "not exist" in text or "not found" in text


class _QuietProbes(logging.Filter):
    """pymilvus logs every failed call at ERROR with a traceback, before the caller sees it. Asking
    whether an alias exists is a question here, not a failure (every first start asks): its "does not
    exist" answers are dropped; every other error still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("RPC error: [describe_alias]") and "not exist" in text.split("\n", 1)[0])


logging.getLogger("pymilvus.decorators").addFilter(_QuietProbes())


def _newer(a: Version | None, b: Version) -> Version:
    """The later of two versions of one id; ``b`` (the row) where they are not comparable."""
    if a is None or a[0] != b[0] or a[1] is None or b[1] is None:
        return b if a is None or b[1] is not None else a
    return a if a[1] > b[1] else b


class MilvusStore:
    """One collection of chunk rows (``connectors.milvus_schema``), COSINE metric, and its companion
    ``<collection>_deleted`` with the version of each document id's last delete, so that a delete
    has a version to compare with too."""

    def __init__(self, uri: str, collection: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.collection = collection
        self.timeout = timeout
        self.uri = uri
        self.tombstones = f"{collection}_deleted"
        self._client = _connect(uri, token, timeout)

    def ensure_collection(self, dim: int) -> None:
        """Create the collection for ``dim`` (and its companion) if missing. Raise :class:`ConfigError`
        when it exists with another dim (the model changed) or in the shape from before chunking (a row
        per document). Workers starting together may race to create it: the loser uses the winner's."""
        c = self._client
        try:
            index = c.prepare_index_params()
            index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
            if not self._create(self.collection, collection_schema(dim), index):
                check_shape(self.collection, c.describe_collection(self.collection, timeout=self.timeout), dim)
                c.load_collection(self.collection, timeout=self.timeout)
            marker = c.prepare_index_params()
            marker.add_index(field_name="marker", index_type="AUTOINDEX", metric_type="L2")
            if not self._create(self.tombstones, tombstone_schema(), marker):
                c.load_collection(self.tombstones, timeout=self.timeout)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"Milvus at {self.uri!r} did not answer ({type(exc).__name__}: {exc}). "
                              "Check EMBEDSTREAM_MILVUS_URI and EMBEDSTREAM_MILVUS_TOKEN.") from None

    def _create(self, name: str, schema: Any, index: Any) -> bool:
        """Create collection ``name`` (loaded) unless it exists; True when this call created it. A
        collection another process created meanwhile counts as existing (seen with three workers
        started at once: "collection already exists")."""
        c = self._client
        if not c.has_collection(name, timeout=self.timeout):
            try:
                c.create_collection(name, schema=schema, index_params=index, timeout=self.timeout)
                return True
            except Exception:
                if not c.has_collection(name, timeout=self.timeout):
                    raise
        return False

    @property
    def client(self) -> Any:
        """The ``MilvusClient`` (for tools that measure pymilvus itself, like the bench)."""
        return self._client

    def exists(self) -> bool:
        return bool(self._client.has_collection(self.collection, timeout=self.timeout))

    def dim(self) -> int:
        info = self._client.describe_collection(self.collection, timeout=self.timeout)
        return next(int(f["params"]["dim"]) for f in info["fields"] if f["name"] == "vector")

    def upsert_chunks(self, rows: ChunkRows, model: str, updated_at: int) -> None:
        """Upsert chunk rows (their ids unique), built as one columnar protobuf request: pymilvus
        packs dict rows in Python field by field, holding the GIL that the worker's other threads
        need; a column of vectors goes into the request in one copy."""
        if not len(rows):
            return
        request = upsert_request(self.collection, rows, model, updated_at)
        try:
            # A prepared request skips pymilvus' packing; ``schema`` only saves it a describe call.
            self._client._get_connection().upsert(self.collection, [], upsert_param=request,
                                                  schema={"fields": []}, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None

    def versions(self, doc_ids: list[str]) -> tuple[dict[str, Version], dict[str, int]]:
        """For the documents among ``doc_ids`` that Milvus knows, read at Strong consistency: the
        version each holds (its rows', or its last delete's where that is newer) and how many
        chunks its rows say it has (documents with rows only). Chunk 0 speaks for the document:
        every version has one, and its rows are written together."""
        if not doc_ids:
            return {}, {}
        try:
            rows = self._client.get(self.collection, ids=[chunk_id(d, 0) for d in doc_ids],
                                    output_fields=["doc_id", "chunk_count", *VERSION_FIELDS],
                                    timeout=self.timeout, consistency_level="Strong")
            deleted = self._client.get(self.tombstones, ids=doc_ids, output_fields=list(VERSION_FIELDS),
                                       timeout=self.timeout, consistency_level="Strong")
        except Exception as exc:
            raise _transient(exc) from None
        versions: dict[str, Version] = {r["id"]: (r.get("source"), r.get("source_offset")) for r in deleted}
        counts: dict[str, int] = {}
        for r in rows:
            doc = r["doc_id"]
            versions[doc] = _newer(versions.get(doc), (r.get("source"), r.get("source_offset")))
            counts[doc] = int(r["chunk_count"])
        return versions, counts

    def record_deletes(self, doc_ids: list[str], versions: tuple[list[str], list[int]], updated_at: int) -> None:
        """Keep the version of each document's delete in the companion, where ``versions()`` finds it:
        an older upsert of a deleted id is then known to be older."""
        if not doc_ids:
            return
        try:
            self._client.upsert(self.tombstones, [
                {"id": i, "source": src, "source_offset": off, "updated_at": updated_at, "marker": [1.0, 0.0]}
                for i, src, off in zip(doc_ids, *versions)], timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None

    def delete(self, ids: list[str]) -> None:
        """Delete rows by primary key (chunk ids)."""
        if not ids:
            return
        try:
            self._client.delete(self.collection, ids=ids, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None

    def query_ids(self, fields: tuple[str, ...] = ("id",)) -> list[dict]:
        """Every row's ``fields``, read at Strong consistency."""
        out: list[dict] = []
        try:
            it = self._client.query_iterator(self.collection, batch_size=1000, filter="",
                                             output_fields=list(fields), consistency_level="Strong",
                                             timeout=self.timeout)
            while True:
                page = it.next()
                if not page:
                    it.close()
                    break
                out.extend(page)
        except Exception as exc:
            raise _transient(exc) from None
        return out

    def count(self) -> int:
        try:
            res = self._client.query(self.collection, filter="", output_fields=["count(*)"],
                                     consistency_level="Strong", timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None
        return int(res[0]["count(*)"])

    def search(self, vector, limit: int = 5) -> list[dict]:
        """The ``limit`` nearest chunk rows: ``id`` (the chunk's), ``score``, and the row's
        ``doc_id``, ``chunk_index``, ``chunk_count``, span, ``excerpt``, ``metadata`` and ``model``."""
        try:
            hits = self._client.search(self.collection, data=[vector], limit=limit,
                                       output_fields=[*CHUNK_FIELDS, "excerpt", "metadata", "model"],
                                       search_params={"metric_type": "COSINE"}, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None
        return [{"id": h["id"], "score": float(h["distance"]), **h.get("entity", {})} for h in hits[0]]

    # -- aliases: readers query an alias; each vector space writes a collection of its own ------
    def alias_target(self, alias: str) -> str | None:
        """The collection ``alias`` points to; None when there is no alias of that name."""
        try:
            return self._client.describe_alias(alias, timeout=self.timeout)["collection_name"]
        except Exception as exc:
            if _missing(exc):
                return None
            raise _transient(exc) from None

    def adopt(self, legacy: str, model_id: str, dim: int) -> bool:
        """Take over ``legacy``, a collection from before aliases whose name the alias is to bear: it
        is renamed to this store's collection (its rows and its companion of deletes kept), so that
        the alias can take its name. True when this call renamed it; False when there was nothing to
        adopt (or another worker did it first). Raises :class:`ConfigError` when its dim, shape or
        model is not this worker's: those rows belong to another model (`embedstream migrate`)."""
        c = self._client
        try:
            if self.alias_target(legacy) is not None or not c.has_collection(legacy, timeout=self.timeout):
                return False
            if c.has_collection(self.collection, timeout=self.timeout):
                raise ConfigError(f"Milvus holds both a collection {legacy!r} and {self.collection!r}, so the alias "
                                  f"{legacy!r} cannot be created: drop the one not in use, or set "
                                  "EMBEDSTREAM_MILVUS_ALIAS to another name")
            check_shape(legacy, c.describe_collection(legacy, timeout=self.timeout), dim)
            c.load_collection(legacy, timeout=self.timeout)
            held = self.model_of(legacy)
            if held not in (None, "", model_id):
                raise ConfigError(f"collection {legacy!r} holds vectors of model {held!r}, this worker "
                                  f"runs {model_id!r}: run the old model once to move the collection behind an "
                                  f"alias, then `embedstream migrate --model {model_id}`")
            try:
                c.rename_collection(legacy, self.collection, timeout=self.timeout)
            except Exception:
                if c.has_collection(self.collection, timeout=self.timeout):
                    return False  # a worker starting beside this one renamed it
                raise
            # A renamed collection comes back released (milvus-lite): load it for reads again.
            c.load_collection(self.collection, timeout=self.timeout)
            if c.has_collection(f"{legacy}_deleted", timeout=self.timeout):
                c.rename_collection(f"{legacy}_deleted", self.tombstones, timeout=self.timeout)
                c.load_collection(self.tombstones, timeout=self.timeout)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"could not take over collection {legacy!r} in Milvus at {self.uri!r} "
                              f"({type(exc).__name__}: {exc})") from None
        log.warning("collection %r from before aliases is now %r behind the alias %r (its rows kept)",
                    legacy, self.collection, legacy)
        return True

    def prepare(self, alias: str, model_id: str, dim: int) -> str:
        """What a worker does at start-up: adopt a collection from before aliases named ``alias``,
        create this collection if missing (checked for ``dim``), create the alias if missing. Returns
        the collection the alias points to. Raises :class:`ConfigError`."""
        self.adopt(alias, model_id, dim)
        self.ensure_collection(dim)
        try:
            return self.ensure_alias(alias)
        except TransientError as exc:
            raise ConfigError(f"Milvus at {self.uri!r} did not answer ({exc})") from None

    def model_of(self, collection: str) -> str | None:
        """The model id of ``collection``'s rows (one row read); None when it has none."""
        rows = self._client.query(collection, filter="", output_fields=["model"], limit=1, timeout=self.timeout)
        return rows[0].get("model") if rows else None

    def ensure_alias(self, alias: str) -> str:
        """Create ``alias`` pointing to this collection unless it exists; returns the collection it
        points to. An alias pointing elsewhere is left alone (moving it is `migrate`'s job)."""
        target = self.alias_target(alias)
        if target is None:
            try:
                self._client.create_alias(self.collection, alias, timeout=self.timeout)
                log.info("alias %r → %r created", alias, self.collection)
                return self.collection
            except Exception as exc:
                target = self.alias_target(alias)  # another worker created it meanwhile
                if target is None:
                    raise ConfigError(f"could not create alias {alias!r} for {self.collection!r} in Milvus at "
                                      f"{self.uri!r}: {exc}") from None
        if target != self.collection:
            log.warning("alias %r points to %r; this worker writes %r. `embedstream migrate` moves the alias "
                        "once this collection has caught up", alias, target, self.collection)
        return target

    def point_alias(self, alias: str) -> None:
        """Move ``alias`` to this collection in one call (create it if missing)."""
        try:
            if self.alias_target(alias) is None:
                self._client.create_alias(self.collection, alias, timeout=self.timeout)
            else:
                self._client.alter_alias(self.collection, alias, timeout=self.timeout)
        except TransientError:
            raise
        except Exception as exc:
            raise _transient(exc) from None

    def collections(self, prefix: str = "") -> list[str]:
        """Names of the collections starting with ``prefix``."""
        try:
            return sorted(n for n in self._client.list_collections(timeout=self.timeout) if n.startswith(prefix))
        except Exception as exc:
            raise _transient(exc) from None

    def drop(self) -> None:
        """Drop the collection and its companion of deletes; opened on an alias, the alias and the
        collection it points to."""
        c = self._client
        target = self.alias_target(self.collection)
        if target is not None:
            c.drop_alias(self.collection, timeout=self.timeout)
        name = target or self.collection
        for n in (name, f"{name}_deleted"):
            if c.has_collection(n, timeout=self.timeout):
                c.drop_collection(n, timeout=self.timeout)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
