"""MilvusStore's contract: columnar upserts replace rows by id, deletes remove them and keep their
version, rows read back as written; every failure is a TransientError. The fake decodes the very
request sent to the server."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from connectors.milvus import MilvusStore
from schemas.errors import TransientError
from tests.unit.fakes import RecordingMilvusClient


def _store(kind, stack_env, client=None) -> MilvusStore:
    if kind == "fake":
        store = MilvusStore.__new__(MilvusStore)
        store._client, store.collection, store.timeout, store.uri = client or RecordingMilvusClient(), "c", 5.0, "fake"
        store.versioned, store.tombstones = True, "c_deleted"
        return store
    store = MilvusStore(stack_env["EMBEDSTREAM_MILVUS_URI"], f"contract_{uuid.uuid4().hex[:8]}", timeout=30)
    store.ensure_collection(4)
    return store


def test_upsert_replaces_by_id_delete_removes_and_rows_read_back(kind, stack_env):
    store = _store(kind, stack_env)
    vecs = np.eye(4, dtype=np.float32)[:3]
    store.upsert_columns(["a", "b", "c"], vecs, "m", ["h1", "h2", "h3"], [{"k": "1"}, {}, {"k": "3"}], 1000,
                         (["T:0", "T:0", "T:1"], [1, 2, 3]))
    store.upsert_columns(["b"], vecs[2:3], "m", ["h2b"], [{"v": "2"}], 2000, (["T:0"], [7]))
    store.delete(["c"], (["T:1"], [9]), 3000)
    # a deleted id keeps the version of its delete; a row re-created after it shows the row's
    assert store.versions(["a", "b", "c", "zz"]) == {"a": ("T:0", 1), "b": ("T:0", 7), "c": ("T:1", 9)}
    store.upsert_columns(["c"], vecs[1:2], "m", ["h3b"], [{}], 4000, (["T:1"], [12]))
    assert store.versions(["c"]) == {"c": ("T:1", 12)}
    store.delete(["c"], (["T:1"], [13]), 5000)
    rows = {r["id"]: r for r in store.query_ids(("id", "vector", "content_hash", "metadata", "updated_at"))}
    assert sorted(rows) == ["a", "b"]
    assert rows["b"]["content_hash"] == "h2b" and rows["b"]["metadata"] == {"v": "2"}
    assert rows["b"]["updated_at"] == 2000 and rows["a"]["metadata"] == {"k": "1"}
    assert np.allclose(rows["a"]["vector"], vecs[0]) and np.allclose(rows["b"]["vector"], vecs[2])
    store.upsert_columns([], np.empty((0, 4), np.float32), "m", [], [], 0)  # nothing to write: no call
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
        store.upsert_columns(["a"], np.ones((1, 4), np.float32), "m", ["h"], [{}], 0)
    store.close()
