"""MilvusStore's contract: columnar chunk upserts replace rows by id, deletes remove them, a
document's version and chunk count read back (its delete's version too); every failure is a
TransientError. The fake decodes the very
request sent to the server."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from connectors.milvus import MilvusStore
from connectors.milvus_schema import ChunkRows
from schemas.errors import TransientError
from tests.unit.fakes import RecordingMilvusClient


def _store(kind, stack_env, client=None) -> MilvusStore:
    if kind == "fake":
        store = MilvusStore.__new__(MilvusStore)
        store._client, store.collection, store.timeout, store.uri = client or RecordingMilvusClient(), "c", 5.0, "fake"
        store.tombstones = "c_deleted"
        return store
    store = MilvusStore(stack_env["EMBEDSTREAM_MILVUS_URI"], f"contract_{uuid.uuid4().hex[:8]}", timeout=30)
    store.ensure_collection(4)
    return store


def _rows(docs: list[tuple[str, int, int]], vecs: np.ndarray, source: str = "T:0") -> ChunkRows:
    """Rows for ``(doc id, chunk index, offset)`` triples; each document's count is how many it has here."""
    count = {d: sum(1 for x, _, _ in docs if x == d) for d, _, _ in docs}
    return ChunkRows(doc_ids=[d for d, _, _ in docs], chunk_index=[i for _, i, _ in docs],
                     chunk_count=[count[d] for d, _, _ in docs], span_start=[10 * i for _, i, _ in docs],
                     span_end=[10 * i + 9 for _, i, _ in docs], excerpts=[f"{d} {i}" for d, i, _ in docs],
                     vectors=vecs, hashes=[f"h-{d}{i}" for d, i, _ in docs], metadata=[{"d": d} for d, _, _ in docs],
                     sources=[source] * len(docs), offsets=[o for _, _, o in docs])


def test_chunk_rows_upsert_by_id_delete_removes_and_versions_read_back(kind, stack_env):
    store = _store(kind, stack_env)
    vecs = np.eye(4, dtype=np.float32)
    store.upsert_chunks(_rows([("a", 0, 1), ("b", 0, 2), ("b", 1, 2), ("c", 0, 3)], vecs), "m", 1000)
    store.upsert_chunks(_rows([("b", 0, 7)], vecs[3:4]), "m", 2000)  # b shrank to one chunk at offset 7
    store.delete(["b#1"])
    store.record_deletes(["c"], (["T:0"], [9]), 3000)
    store.delete(["c#0"])
    versions, counts = store.versions(["a", "b", "c", "zz"])
    # a deleted id keeps the version of its delete; the rows' chunk 0 speaks for each document
    assert versions == {"a": ("T:0", 1), "b": ("T:0", 7), "c": ("T:0", 9)}
    assert counts == {"a": 1, "b": 1}
    store.upsert_chunks(_rows([("c", 0, 12)], vecs[1:2]), "m", 4000)
    assert store.versions(["c"]) == ({"c": ("T:0", 12)}, {"c": 1})
    rows = {r["id"]: r for r in store.query_ids(("id", "doc_id", "chunk_index", "chunk_count", "span_start",
                                                 "span_end", "excerpt", "vector", "content_hash", "metadata",
                                                 "updated_at"))}
    assert sorted(rows) == ["a#0", "b#0", "c#0"]
    b = rows["b#0"]
    assert (b["doc_id"], b["chunk_index"], b["chunk_count"], b["span_start"], b["span_end"]) == ("b", 0, 1, 0, 9)
    assert b["content_hash"] == "h-b0" and b["metadata"] == {"d": "b"} and b["updated_at"] == 2000
    assert b["excerpt"] == "b 0" and np.allclose(b["vector"], vecs[3]) and np.allclose(rows["a#0"]["vector"], vecs[0])
    store.upsert_chunks(_rows([], np.empty((0, 4), np.float32)), "m", 0)  # nothing to write: no call
    store.delete([])
    if kind == "real":
        store.drop()
    store.close()


def test_a_failed_write_is_transient(kind, stack_env):
    if kind == "fake":
        store = _store(kind, stack_env, RecordingMilvusClient(fail_upserts=1))
    else:
        store = _store(kind, stack_env)
        store.drop()  # writing to a collection that is gone fails on the server
    with pytest.raises(TransientError):
        store.upsert_chunks(_rows([("a", 0, 1)], np.ones((1, 4), np.float32)), "m", 0)
    store.close()


def test_a_collection_of_another_shape_is_refused_with_what_to_do():
    from connectors.milvus_schema import check_shape
    from schemas.errors import ConfigError

    def info(*names, dim=4):
        return {"fields": [{"name": n, "params": {"dim": dim} if n == "vector" else {}} for n in names]}

    new = ("id", "doc_id", "chunk_index", "chunk_count", "span_start", "span_end", "vector", "source", "source_offset")
    check_shape("c", info(*new), 4)
    with pytest.raises(ConfigError, match="holds 8-dim vectors"):
        check_shape("c", info(*new, dim=8), 4)
    with pytest.raises(ConfigError, match="from before chunking .* no doc_id, chunk_index"):
        check_shape("c", info("id", "vector", "model", "content_hash", "metadata", "updated_at"), 4)
    with pytest.raises(ConfigError, match="no 'vector' field"):
        check_shape("c", info("id"), 4)
