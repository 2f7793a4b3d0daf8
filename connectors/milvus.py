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

    def drop(self) -> None:
        """Drop the collection and its companion of deletes."""
        self._client.drop_collection(self.collection, timeout=self.timeout)
        if self._client.has_collection(self.tombstones, timeout=self.timeout):
            self._client.drop_collection(self.tombstones, timeout=self.timeout)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
