"""The Milvus collection of the contract: created if missing, checked for dim, upserts and deletes.

Every call carries ``timeout=`` (a frozen server blocks forever without it), and every failure of
the server or the network becomes :class:`TransientError`, so the worker retries instead of
dead-lettering.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np

# pymilvus' generated protobuf modules: internal, but the columnar request needs them (see
# MilvusStore.upsert_columns); the unit fake decodes the same request, the contract test sends it.
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from schemas.errors import ConfigError, TransientError

log = logging.getLogger(__name__)

ID_MAX_LENGTH = 512
SOURCE_MAX_LENGTH = 300
# pymilvus pings every 10 s even without calls; gRPC servers by default allow one ping per 5 min
# and answer more with GOAWAY "too_many_pings", dropping the channel. Every call here carries its
# own timeout, so keepalive pings add nothing: keep them rare and only during calls.
_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": 0}


def _transient(exc: Exception) -> TransientError:
    return TransientError("milvus", f"{type(exc).__name__}: {exc}")


#: The fields that say which version of a document a row holds: the input log and partition it came
#: from (``<topic id>:<partition>``) and its offset there. Collections created before them have none.
VERSION_FIELDS = ("source", "source_offset")


def _upsert_request(collection: str, ids: list[str], vectors: np.ndarray, model: str, hashes: list[str],
                    metadata: list[dict[str, str]], updated_at: int,
                    versions: tuple[list[str], list[int]] | None):
    """The UpsertRequest for the collection's fields, one column each (``versions``: the
    ``source`` and ``source_offset`` columns, for a collection that has them)."""
    n = len(ids)
    req = milvus_pb2.UpsertRequest(collection_name=collection, num_rows=n)

    def column(name: str, dtype: int) -> Any:
        field = req.fields_data.add()
        field.field_name, field.type = name, dtype
        return field

    column("id", schema_pb2.VarChar).scalars.string_data.data.extend(ids)
    vec = column("vector", schema_pb2.FloatVector).vectors
    vec.dim = int(vectors.shape[1])
    vec.float_vector.data.extend(np.ascontiguousarray(vectors, dtype=np.float32).ravel().tolist())
    column("model", schema_pb2.VarChar).scalars.string_data.data.extend([model] * n)
    column("content_hash", schema_pb2.VarChar).scalars.string_data.data.extend(hashes)
    column("metadata", schema_pb2.JSON).scalars.json_data.data.extend(
        [json.dumps(m, separators=(",", ":")).encode() for m in metadata])
    column("updated_at", schema_pb2.Int64).scalars.long_data.data.extend([updated_at] * n)
    if versions is not None:
        column("source", schema_pb2.VarChar).scalars.string_data.data.extend(versions[0])
        column("source_offset", schema_pb2.Int64).scalars.long_data.data.extend(versions[1])
    return req


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


def _schema(dim: int) -> Any:
    """The collection's fields (``MilvusStore``'s docstring lists them)."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LENGTH)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("model", DataType.VARCHAR, max_length=256)
    schema.add_field("content_hash", DataType.VARCHAR, max_length=64)
    schema.add_field("metadata", DataType.JSON)
    schema.add_field("updated_at", DataType.INT64)
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX_LENGTH)
    schema.add_field("source_offset", DataType.INT64)
    return schema


def _tombstone_schema() -> Any:
    """The companion collection of deleted ids and the version of their delete. Milvus wants a
    vector field in every collection: ``marker`` is a constant 2-dim vector, never searched."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LENGTH)
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX_LENGTH)
    schema.add_field("source_offset", DataType.INT64)
    schema.add_field("updated_at", DataType.INT64)
    schema.add_field("marker", DataType.FLOAT_VECTOR, dim=2)
    return schema


def _newer(a: tuple[str | None, int | None] | None, b: tuple[str | None, int | None]) -> tuple[str | None, int | None]:
    """The later of two versions of one id; ``b`` (the row) where they are not comparable."""
    if a is None or a[0] != b[0] or a[1] is None or b[1] is None:
        return b if a is None or b[1] is not None else a
    return a if a[1] > b[1] else b


class MilvusStore:
    """One collection: ``id`` VARCHAR pk, ``vector`` FLOAT_VECTOR(dim), ``model``, ``content_hash``,
    ``metadata`` JSON, ``updated_at`` INT64 (ms), ``source`` VARCHAR and ``source_offset`` INT64 (the
    version a row holds); COSINE metric. A versioned collection has a companion,
    ``<collection>_deleted``, with the version of each id's last delete, so that a delete has a version
    to compare with too. ``versioned`` is False for a collection made before the version fields on a
    server that cannot add them."""

    def __init__(self, uri: str, collection: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.collection = collection
        self.timeout = timeout
        self.uri = uri
        self.versioned = True
        self.tombstones = f"{collection}_deleted"
        self._client = _connect(uri, token, timeout)

    def ensure_collection(self, dim: int) -> None:
        """Create the collection for ``dim`` if missing; raise :class:`ConfigError` when it exists
        with another dim (the model changed: use a new EMBEDSTREAM_MILVUS_COLLECTION)."""
        c = self._client
        try:
            if self.exists():
                have = self.dim()
                if have != dim:
                    raise ConfigError(
                        f"Milvus collection {self.collection!r} holds {have}-dim vectors but the model makes "
                        f"{dim}-dim ones: set EMBEDSTREAM_MILVUS_COLLECTION to a new collection, or use the "
                        "model the collection was built with."
                    )
                self.versioned = self._ensure_version_fields()
                c.load_collection(self.collection, timeout=self.timeout)
            else:
                index = c.prepare_index_params()
                index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
                c.create_collection(self.collection, schema=_schema(dim), index_params=index, timeout=self.timeout)
            if self.versioned:
                self._ensure_tombstones()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"Milvus at {self.uri!r} did not answer ({type(exc).__name__}: {exc}). "
                              "Check EMBEDSTREAM_MILVUS_URI and EMBEDSTREAM_MILVUS_TOKEN.") from None

    def _ensure_tombstones(self) -> None:
        c = self._client
        if c.has_collection(self.tombstones, timeout=self.timeout):
            c.load_collection(self.tombstones, timeout=self.timeout)
            return
        index = c.prepare_index_params()
        index.add_index(field_name="marker", index_type="AUTOINDEX", metric_type="L2")
        c.create_collection(self.tombstones, schema=_tombstone_schema(), index_params=index, timeout=self.timeout)

    def _ensure_version_fields(self) -> bool:
        """Add the version fields to a collection made before them, where the server can (Milvus
        2.6+); True when the collection has them."""
        from pymilvus import DataType

        have = {f["name"] for f in self._client.describe_collection(self.collection, timeout=self.timeout)["fields"]}
        if set(VERSION_FIELDS) <= have:
            return True
        try:
            self._client.add_collection_field(self.collection, field_name="source", data_type=DataType.VARCHAR,
                                              max_length=SOURCE_MAX_LENGTH, nullable=True, timeout=self.timeout)
            self._client.add_collection_field(self.collection, field_name="source_offset",
                                              data_type=DataType.INT64, nullable=True, timeout=self.timeout)
            return True
        except Exception as exc:
            log.warning("Milvus collection %r predates the version fields (source, source_offset) and this server "
                        "cannot add them (%s): writes are fenced by the lease and partition ownership only, without "
                        "the version guard. To have it: point EMBEDSTREAM_MILVUS_COLLECTION at a new collection and "
                        "replay the input topic into it.", self.collection, type(exc).__name__)
            return False

    def exists(self) -> bool:
        return bool(self._client.has_collection(self.collection, timeout=self.timeout))

    def dim(self) -> int:
        info = self._client.describe_collection(self.collection, timeout=self.timeout)
        for f in info["fields"]:
            if f["name"] == "vector":
                return int(f["params"]["dim"])
        raise ConfigError(f"Milvus collection {self.collection!r} has no 'vector' field: not an embedstream "
                          "collection; set EMBEDSTREAM_MILVUS_COLLECTION to another name.")

    def upsert_columns(self, ids: list[str], vectors: np.ndarray, model: str, hashes: list[str],
                       metadata: list[dict[str, str]], updated_at: int,
                       versions: tuple[list[str], list[int]] = ([], [])) -> None:
        """Upsert rows given as columns (``ids`` unique, ``vectors`` shape ``(len(ids), dim)``;
        ``versions`` = the ``source`` and ``source_offset`` columns, dropped when not ``versioned``).

        Same effect as :meth:`upsert`, built as one protobuf request: pymilvus packs dict rows in
        Python field by field, holding the GIL that the worker's other threads need; a column of
        vectors goes into the request in one copy."""
        if not ids:
            return
        request = _upsert_request(self.collection, ids, vectors, model, hashes, metadata, updated_at,
                                  versions if self.versioned else None)
        try:
            # A prepared request skips pymilvus' packing; ``schema`` only saves it a describe call.
            self._client._get_connection().upsert(self.collection, [], upsert_param=request,
                                                  schema={"fields": []}, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None

    def upsert(self, rows: list[dict[str, Any]]) -> None:
        """Upsert ``rows`` (already deduplicated by id: real Milvus rejects repeated keys in one call)."""
        if not rows:
            return
        try:
            self._client.upsert(self.collection, rows, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None

    def versions(self, ids: list[str]) -> dict[str, tuple[str | None, int | None]]:
        """``{id: (source, source_offset)}`` of the rows that exist among ``ids``, read at Strong
        consistency ({} for a collection without the version fields)."""
        if not ids or not self.versioned:
            return {}
        try:
            rows = self._client.get(self.collection, ids=ids, output_fields=list(VERSION_FIELDS),
                                    timeout=self.timeout, consistency_level="Strong")
            deleted = self._client.get(self.tombstones, ids=ids, output_fields=list(VERSION_FIELDS),
                                       timeout=self.timeout, consistency_level="Strong")
        except Exception as exc:
            raise _transient(exc) from None
        out: dict[str, tuple[str | None, int | None]] = {
            r["id"]: (r.get("source"), r.get("source_offset")) for r in deleted}
        for r in rows:
            out[r["id"]] = _newer(out.get(r["id"]), (r.get("source"), r.get("source_offset")))
        return out

    def delete(self, ids: list[str], versions: tuple[list[str], list[int]] | None = None,
               updated_at: int = 0) -> None:
        """Delete the rows of ``ids``; with ``versions`` (the deletes' ``source`` and ``source_offset``
        columns) a versioned collection first records them in its companion, where ``versions()``
        finds them: an older upsert of a deleted id is then known to be older."""
        if not ids:
            return
        try:
            if versions is not None and self.versioned:
                self._client.upsert(self.tombstones, [
                    {"id": i, "source": src, "source_offset": off, "updated_at": updated_at, "marker": [1.0, 0.0]}
                    for i, src, off in zip(ids, *versions)], timeout=self.timeout)
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
        try:
            hits = self._client.search(self.collection, data=[vector], limit=limit,
                                       output_fields=["id", "metadata", "model"],
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
