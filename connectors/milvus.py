"""The Milvus collection of the contract: created if missing, checked for dim, upserts and deletes.

Every call carries ``timeout=`` (a frozen server blocks forever without it), and every failure of
the server or the network becomes :class:`TransientError`, so the worker retries instead of
dead-lettering.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from connectors.exceptions import ConfigError, TransientError

ID_MAX_LENGTH = 512
# pymilvus pings every 10 s even without calls; gRPC servers by default allow one ping per 5 min
# and answer more with GOAWAY "too_many_pings", dropping the channel. Every call here carries its
# own timeout, so keepalive pings add nothing: keep them rare and only during calls.
_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": 0}


def _transient(exc: Exception) -> TransientError:
    return TransientError("milvus", f"{type(exc).__name__}: {exc}")


try:  # pymilvus' generated protobuf modules (internal, so optional: see MilvusStore.upsert_columns)
    from pymilvus.grpc_gen import milvus_pb2 as _milvus_pb2
    from pymilvus.grpc_gen import schema_pb2 as _schema_pb2

    _pb: tuple[Any, Any] | None = (_milvus_pb2, _schema_pb2)
except ImportError:
    _pb = None


def _upsert_request(collection: str, ids: list[str], vectors: np.ndarray, model: str, hashes: list[str],
                    metadata: list[dict[str, str]], updated_at: int):
    """The UpsertRequest for the collection's six fields, one column each."""
    milvus_pb2, schema_pb2 = _pb
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
    return req


class MilvusStore:
    """One collection: ``id`` VARCHAR pk, ``vector`` FLOAT_VECTOR(dim), ``model``, ``content_hash``,
    ``metadata`` JSON, ``updated_at`` INT64 (ms); COSINE metric."""

    def __init__(self, uri: str, collection: str, token: str | None = None, timeout: float = 10.0) -> None:
        from pymilvus import MilvusClient

        self.collection = collection
        self.timeout = timeout
        self.uri = uri
        deadline = time.monotonic() + max(timeout, 5.0)
        delay = 0.25
        while True:
            try:
                # dedicated: pymilvus otherwise shares one channel per URI in a process, and recovers it
                # with the timeout of whichever client opened it first.
                self._client = MilvusClient(uri=uri, token=token or "", timeout=timeout, dedicated=True,
                                            grpc_options=_GRPC_OPTIONS)
                return
            except Exception as exc:
                # A busy or just-starting server refuses the handshake now and then: retry until the
                # deadline before calling the setting wrong.
                if time.monotonic() + delay > deadline:
                    raise ConfigError(f"cannot reach Milvus at {uri!r}: {exc}. Check EMBEDSTREAM_MILVUS_URI.") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def ensure_collection(self, dim: int) -> None:
        """Create the collection for ``dim`` if missing; raise :class:`ConfigError` when it exists
        with another dim (the model changed: use a new EMBEDSTREAM_MILVUS_COLLECTION)."""
        from pymilvus import DataType, MilvusClient

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
                c.load_collection(self.collection, timeout=self.timeout)
                return
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LENGTH)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("model", DataType.VARCHAR, max_length=256)
            schema.add_field("content_hash", DataType.VARCHAR, max_length=64)
            schema.add_field("metadata", DataType.JSON)
            schema.add_field("updated_at", DataType.INT64)
            index = c.prepare_index_params()
            index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
            c.create_collection(self.collection, schema=schema, index_params=index, timeout=self.timeout)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"Milvus at {self.uri!r} did not answer ({type(exc).__name__}: {exc}). "
                              "Check EMBEDSTREAM_MILVUS_URI and EMBEDSTREAM_MILVUS_TOKEN.") from None

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
                       metadata: list[dict[str, str]], updated_at: int) -> None:
        """Upsert rows given as columns (``ids`` unique, ``vectors`` shape ``(len(ids), dim)``).

        Same effect as :meth:`upsert`, built as one protobuf request: pymilvus packs dict rows in
        Python field by field, holding the GIL that the worker's other threads need; a column of
        vectors goes into the request in one copy."""
        if not ids:
            return
        connection = getattr(self._client, "_get_connection", None)
        if connection is None or _pb is None:  # a pymilvus without these internals (or a fake): rows
            self.upsert([{"id": i, "vector": v, "model": model, "content_hash": h, "metadata": m,
                          "updated_at": updated_at} for i, v, h, m in zip(ids, vectors, hashes, metadata)])
            return
        request = _upsert_request(self.collection, ids, vectors, model, hashes, metadata, updated_at)
        try:
            # A prepared request skips pymilvus' packing; ``schema`` only saves it a describe call.
            connection().upsert(self.collection, [], upsert_param=request, schema={"fields": []},
                                timeout=self.timeout)
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

    def delete(self, ids: list[str]) -> None:
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
        try:
            hits = self._client.search(self.collection, data=[vector], limit=limit,
                                       output_fields=["id", "metadata", "model"],
                                       search_params={"metric_type": "COSINE"}, timeout=self.timeout)
        except Exception as exc:
            raise _transient(exc) from None
        return [{"id": h["id"], "score": float(h["distance"]), **h.get("entity", {})} for h in hits[0]]

    def drop(self) -> None:
        self._client.drop_collection(self.collection, timeout=self.timeout)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
