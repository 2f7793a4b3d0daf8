"""Milvus's contract, by job. Writes (MilvusStore): columnar chunk upserts replace rows by id,
deletes remove them, a document's version and chunk count read back (its delete's version too); every
failure is a TransientError. The fake decodes the very request sent to the server. Reads
(MilvusReader) see the rows; administration (MilvusAdmin) creates, adopts, aliases and drops."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest

from connectors.milvus import MilvusAdmin, MilvusReader, MilvusStore
from connectors.milvus.schema import CHUNK_FIELDS, VERSION_FIELDS, ChunkRows
from schemas.errors import ConfigError, Refused, TransientError
from schemas.sparse import SparseKind
from tests.unit.fakes import RecordingMilvusClient


def _store(kind, stack_env, client=None, sparse: SparseKind = SparseKind.OFF) -> MilvusStore:
    if kind == "fake":
        return MilvusStore("fake", "c", timeout=5.0, client=client or RecordingMilvusClient())
    admin = MilvusAdmin(stack_env["EMBEDSTREAM_MILVUS_URI"], f"contract_{uuid.uuid4().hex[:8]}", timeout=30)
    admin.ensure_collection(4, sparse)
    return MilvusStore.sharing(admin)


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
    reader = MilvusReader.sharing(store)
    assert reader.held(["a", "b", "c", "zz"]) == {"a", "b", "c"}
    rows = {r["id"]: r for r in reader.query_ids(("id", "doc_id", "chunk_index", "chunk_count", "span_start",
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
        MilvusAdmin.sharing(store).drop()
    store.close()


def test_sparse_sides_bm25_keeps_the_text_learned_keeps_the_vector_and_both_search(kind, stack_env):
    """``bm25``: a row keeps its chunk's whole text (cut at 65,535 bytes of UTF-8), Milvus derives the
    sparse vector and a word search finds the row; ``learned``: the sparse vector sent is the one read
    back, and searched by inner product. Hybrid fuses the dense and the sparse hits."""
    from connectors.milvus.reads import Query
    from connectors.milvus.schema import EMPTY_SPARSE

    texts = ["json.dumps serialises an object", "os.path.join joins paths", "ECONNREFUSED: connection refused"]
    punctuation = _rows([("p", 0, 5)], np.eye(4, dtype=np.float32)[:1])
    punctuation.texts = ["!!! ... ???"]  # no word for BM25: an empty sparse vector, derived by Milvus
    vecs = np.eye(4, dtype=np.float32)[:3]
    docs = [("a", 0, 1), ("b", 0, 2), ("c", 0, 3)]
    rows = _rows(docs, vecs)
    rows.texts = texts
    bm25 = _store(kind, stack_env, sparse=SparseKind.BM25)
    bm25.upsert_chunks(rows, "m", 1000)
    long_rows = _rows([("d", 0, 4)], vecs[:1])
    long_rows.texts = ["é" * 40_000]  # 80,000 bytes: cut to 65,535 (32,767 whole characters)
    bm25.upsert_chunks(long_rows, "m", 1000)
    bm25.upsert_chunks(punctuation, "m", 1000)
    learned = _store(kind, stack_env, sparse=SparseKind.LEARNED)
    rows = _rows(docs, vecs)
    rows.sparse = [(np.array([7, 3]), np.array([0.5, 1.0], np.float32)), (np.array([3]), np.array([2.0], np.float32)),
                   (np.array([], np.int32), np.array([], np.float32))]
    learned.upsert_chunks(rows, "m", 1000)
    if kind == "fake":
        sent = {r["id"]: r for r in bm25._client.calls[0][1]}
        assert sent["c#0"]["text"] == texts[2] and "sparse" not in sent["c#0"]
        assert bm25._client.calls[1][1][0]["text"] == "é" * 32_767
        sent = {r["id"]: r for r in learned._client.calls[0][1]}
        assert sent["a#0"]["sparse"] == {3: 1.0, 7: 0.5} and "text" not in sent["a#0"]
        assert sent["c#0"]["sparse"] == {0: EMPTY_SPARSE[1][0]}  # an empty vector, as milvus-lite takes it
        return
    reader = MilvusReader.sharing(bm25)
    assert reader.sparse_kind() is SparseKind.BM25
    got = {r["id"]: r["text"] for r in reader.query_ids(("id", "text"))}
    assert got["c#0"] == texts[2] and got["d#0"] == "é" * 32_767
    assert [h["doc_id"] for h in reader.search_by(Query(vecs[0], "ECONNREFUSED"), "sparse", 3)] == ["c"]
    hybrid = [h["doc_id"] for h in reader.search_by(Query(vecs[1], "ECONNREFUSED"), "hybrid", 2)]
    assert set(hybrid) == {"b", "c"}  # b by its vector, c by its word
    reader = MilvusReader.sharing(learned)
    assert reader.sparse_kind() is SparseKind.LEARNED
    got = {r["id"]: r["sparse"] for r in reader.query_ids(("id", "sparse"))}
    assert got["a#0"] == pytest.approx({3: 1.0, 7: 0.5}) and got["b#0"] == {3: 2.0}
    hits = reader.search_by(Query(vecs[2], "", (np.array([3]), np.array([1.0]))), "sparse", 3)
    assert [h["doc_id"] for h in hits][:2] == ["b", "a"]
    with pytest.raises(ConfigError, match="has no sparse field"):
        MilvusReader.sharing(MilvusStore.sharing(learned, bm25.collection + "x")).search_by(
            Query(vecs[0], "x"), "sparse", 1, kind=SparseKind.OFF)
    for store in (bm25, learned):
        MilvusAdmin.sharing(store).drop()
        store.close()


@pytest.mark.integration
def test_a_collection_made_with_another_sparse_setting_is_refused_at_start_up(stack):
    admin = MilvusAdmin(stack["EMBEDSTREAM_MILVUS_URI"], f"shape_{uuid.uuid4().hex[:8]}", timeout=30)
    admin.ensure_collection(4)
    with pytest.raises(ConfigError, match="has sparse side 'off' but this worker writes 'bm25'.*embedstream migrate"):
        admin.ensure_collection(4, SparseKind.BM25)
    admin.ensure_collection(4, SparseKind.OFF)  # the setting it was made with: fine
    admin.drop()
    admin.close()


def test_a_failed_write_is_transient(kind, stack_env):
    if kind == "fake":
        store = _store(kind, stack_env, RecordingMilvusClient(fail_upserts=1))
    else:
        store = _store(kind, stack_env)
        MilvusAdmin.sharing(store).drop()  # writing to a collection that is gone fails on the server
    with pytest.raises(TransientError):
        store.upsert_chunks(_rows([("a", 0, 1)], np.ones((1, 4), np.float32)), "m", 0)
    store.close()


#: Ids a producer may choose: each of the characters a filter expression treats specially, and one built
#: to widen a filter (a tombstone keyed so once deleted every row of the collection).
HOSTILE_IDS = ["o'brien", "back\\slash", 'quote"double', "new\nline", "cr\rret", "nul\x00byte", "tab\tx",
               "ünïcødé 文字 😀", "a'] or id not in ['", 'a"] or id not in ["', "\\", '"', "x\\\"y", "$meta"]


def test_claims_of_versions_are_rows_of_their_own_read_by_document_and_removed_by_key(kind, stack_env):
    """A share member's claims (``connectors.milvus.claims``): two versions of one document are two
    rows, read back by the document's exact id (hostile ones too), marked written, and removed by
    key without touching another's; ``version_parts`` gives a delete's and the rows' versions apart."""
    from connectors.milvus.claims import Claim

    store = _store(kind, stack_env)
    if kind == "real":
        MilvusAdmin.sharing(store).ensure_claims()
        MilvusAdmin.sharing(store).ensure_claims()  # a second start finds it made
    docs = ["a", *HOSTILE_IDS]
    claims = [Claim(d, "T:0", o, 1000 + o) for d in docs for o in (1, 2)]
    store.claim(claims)
    assert set(store.claims(docs)) == set(claims)  # each read back whole
    assert {(c.doc, c.offset) for c in store.claims(["a"])} == {("a", 1), ("a", 2)}
    store.claim([Claim("a", "T:0", 1, 5000, written=True)])  # the same version again: the same row
    assert {(c.offset, c.at_ms, c.written) for c in store.claims(["a"])} == {(1, 5000, True), (2, 1002, False)}
    store.unclaim([Claim("a", "T:0", 1).id, *(Claim(d, "T:0", 2).id for d in HOSTILE_IDS)])
    assert {(c.doc, c.offset) for c in store.claims(docs)} == {("a", 2), *((d, 1) for d in HOSTILE_IDS)}
    store.unclaim([c.id for c in store.claims(docs)])
    assert store.claims(docs) == [] and store.claims([]) == []

    store.upsert_chunks(_rows([("a", 0, 3)], np.eye(4, dtype=np.float32)[:1]), "m", 1000)
    store.record_deletes(["a", "b"], (["T:0", "T:0"], [5, 6]), 2000)  # a's delete landed before its rows went
    assert store.version_parts(["a", "b", "zz"]) == ({"a": ("T:0", 5), "b": ("T:0", 6)}, {"a": ("T:0", 3)}, {"a": 1})
    assert store.versions(["a", "b"]) == ({"a": ("T:0", 5), "b": ("T:0", 6)}, {"a": 1})
    if kind == "real":
        MilvusAdmin.sharing(store).drop()
        assert not store.has(store.claims_collection)
    store.close()


@pytest.mark.integration
@pytest.mark.parametrize("newer_deletes", [False, True], ids=["newer upsert", "newer delete"])
def test_an_older_version_landing_last_on_milvus_is_written_over_by_the_newer_member(stack, newer_deletes):
    """``tests/unit/test_share_order.py``'s interleaving on the real server: two share members, the
    older version planned first and written while the newer member waits (Strong reads see each write)."""
    from tests.unit.test_share_order import Clock, held, member, older_lands_last, share_item
    from worker.core.records import Delete, Source

    store = _store("real", stack)
    MilvusAdmin.sharing(store).ensure_claims()
    clock = Clock()
    older, newer = member(store, clock), member(store, clock)
    older_lands_last(older, newer, share_item("d", 1, 3),
                     Delete(Source("docs", 0, 2), "d") if newer_deletes else share_item("d", 2, 1))
    assert held(newer, "d") == ((None, 2) if newer_deletes else (2, None))
    reader = MilvusReader.sharing(store)
    assert [r["id"] for r in reader.query_ids(("id",))] == ([] if newer_deletes else ["d#0"])  # no older chunk
    assert store.claims(["d"]) == []
    MilvusAdmin.sharing(store).drop()
    store.close()


def test_ids_a_producer_chooses_are_data_never_part_of_an_expression(kind, stack_env):
    """Every odd id is written, read back and deleted as exactly itself; the tombstone keyed as an
    expression deletes its own rows and nothing else."""
    store = _store(kind, stack_env)
    ordinary = [f"doc-{i}" for i in range(5)]
    docs = ordinary + HOSTILE_IDS
    vecs = np.tile(np.eye(4, dtype=np.float32), (len(docs) // 4 + 1, 1))[:len(docs)]
    store.upsert_chunks(_rows([(d, 0, o) for o, d in enumerate(docs)], vecs), "m", 1000)
    versions, counts = store.versions(docs)
    assert versions == {d: ("T:0", o) for o, d in enumerate(docs)} and counts == dict.fromkeys(docs, 1)
    reader = MilvusReader.sharing(store)
    assert reader.held(docs) == set(docs)
    crafted = "a'] or id not in ['"
    store.record_deletes([crafted], (["T:0"], [99]), 2000)
    store.delete([f"{crafted}#0"])
    left = {r["doc_id"] for r in reader.query_ids(("id", "doc_id"))}
    assert left == set(docs) - {crafted}, "a crafted id deleted other rows"
    versions, _ = store.versions(docs)
    assert versions[crafted] == ("T:0", 99)  # its delete's version, under its exact id
    store.delete([f"{d}#0" for d in HOSTILE_IDS])
    assert {r["doc_id"] for r in reader.query_ids(("id", "doc_id"))} == set(ordinary)
    if kind == "real":
        MilvusAdmin.sharing(store).drop()
    store.close()


def test_a_row_milvus_will_never_take_is_refused_not_an_outage(kind, stack_env):
    """A value over a field's limit is refused for good (``Refused``, with Milvus' answer): the sink then
    finds the document and dead-letters it, where an outage would be retried."""
    long_id = "x" * 600  # over the primary key's 520 bytes (the validator stops such ids first)
    client = RecordingMilvusClient(refuse=lambda row: len(row["id"]) > 520) if kind == "fake" else None
    store = _store(kind, stack_env, client)
    with pytest.raises(Refused) as info:
        store.upsert_chunks(_rows([("ok", 0, 1), (long_id, 0, 2)], np.eye(4, dtype=np.float32)[:2]), "m", 0)
    assert info.value.system == "milvus" and info.value.message
    store.upsert_chunks(_rows([("ok", 0, 1)], np.eye(4, dtype=np.float32)[:1]), "m", 0)  # the rest goes in
    assert MilvusReader.sharing(store).held(["ok"]) == {"ok"}
    if kind == "real":
        MilvusAdmin.sharing(store).drop()
    store.close()


def _info(*names: str, dim: int = 4) -> dict:
    """``describe_collection``'s answer for a collection of fields ``names`` (``dim``-dim vectors)."""
    return {"fields": [{"name": n, "params": {"dim": dim} if n == "vector" else {}} for n in names]}


#: The fields of a collection in this version's shape.
CURRENT_FIELDS = ("id", *CHUNK_FIELDS, "vector", *VERSION_FIELDS)


def test_a_collection_of_another_shape_is_refused_with_what_to_do():
    from connectors.milvus.schema import check_shape

    check_shape("c", _info(*CURRENT_FIELDS), 4)
    with pytest.raises(ConfigError, match="holds 8-dim vectors"):
        check_shape("c", _info(*CURRENT_FIELDS, dim=8), 4)
    with pytest.raises(ConfigError, match="from before chunking .* no doc_id, chunk_index"):
        check_shape("c", _info("id", "vector", "model", "content_hash", "metadata", "updated_at"), 4)
    with pytest.raises(ConfigError, match="no 'vector' field"):
        check_shape("c", _info("id"), 4)
    from pymilvus import FunctionType

    bm25 = {**_info(*CURRENT_FIELDS, "text", "sparse"), "functions": [{"name": "bm25", "type": FunctionType.BM25}]}
    check_shape("c", bm25, 4, SparseKind.BM25)
    check_shape("c", _info(*CURRENT_FIELDS, "sparse"), 4, SparseKind.LEARNED)
    with pytest.raises(ConfigError, match="sparse side 'bm25' but this worker writes 'learned'"):
        check_shape("c", bm25, 4, SparseKind.LEARNED)
    with pytest.raises(ConfigError, match="sparse side 'off' but this worker writes 'bm25'"):
        check_shape("c", _info(*CURRENT_FIELDS), 4, SparseKind.BM25)


@pytest.mark.integration
def test_alias_created_at_first_start_a_collection_from_before_aliases_adopted_and_moved(stack, caplog):
    """``prepare``: a fresh alias gets a collection behind it; a collection from before aliases that
    bears the alias's name is renamed (rows and deletes kept) and the alias takes its name; another
    model's rows are refused; ``point_alias`` moves readers at once; ``drop`` on the alias drops both."""
    uri, tag = stack["EMBEDSTREAM_MILVUS_URI"], uuid.uuid4().hex[:8]
    fresh = MilvusAdmin(uri, f"fresh_{tag}__m_1", timeout=30)
    with caplog.at_level(logging.ERROR, logger="pymilvus"):
        assert fresh.prepare(f"fresh_{tag}", "m", 4) == fresh.collection
    assert not caplog.records  # asking whether the alias exists is no error (pymilvus logs one)
    assert fresh.alias_target(f"none_{tag}") is None
    MilvusStore.sharing(fresh).upsert_chunks(_rows([("a", 0, 1)], np.eye(4, dtype=np.float32)[:1]), "m", 1)
    reader = MilvusReader(uri, f"fresh_{tag}", timeout=30)
    assert [r["id"] for r in reader.query_ids()] == ["a#0"]

    legacy = MilvusStore(uri, f"old_{tag}", timeout=30)  # how a deployment from before aliases looks
    MilvusAdmin.sharing(legacy).ensure_collection(4)
    legacy.upsert_chunks(_rows([("x", 0, 5), ("y", 0, 6)], np.eye(4, dtype=np.float32)[:2]), "m", 1)
    legacy.record_deletes(["z"], (["T:0"], [9]), 1)
    other = MilvusAdmin(uri, f"old_{tag}__other_2", timeout=30)
    with pytest.raises(ConfigError, match="holds vectors of model 'm'.*migrate"):
        other.prepare(f"old_{tag}", "other", 4)
    behind = MilvusAdmin(uri, f"old_{tag}__m_1", timeout=30)
    assert behind.prepare(f"old_{tag}", "m", 4) == behind.collection
    assert behind.alias_target(f"old_{tag}") == behind.collection
    via_alias = MilvusReader(uri, f"old_{tag}", timeout=30)
    assert sorted(r["id"] for r in via_alias.query_ids()) == ["x#0", "y#0"]
    assert MilvusStore.sharing(behind).versions(["x", "z"])[0] == {"x": ("T:0", 5), "z": ("T:0", 9)}  # deletes came
    assert not behind.adopt(f"old_{tag}", "m", 4)  # a second worker starting finds nothing to adopt

    fresh.point_alias(f"old_{tag}")  # readers of old_ now see fresh's rows, in one call
    assert [r["id"] for r in via_alias.query_ids()] == ["a#0"]
    assert behind.prepare(f"old_{tag}", "m", 4) == fresh.collection  # a worker never moves it back
    assert behind.collections(f"old_{tag}__") == [behind.collection, f"{behind.collection}_deleted"]
    MilvusAdmin.sharing(via_alias).drop()
    assert behind.alias_target(f"old_{tag}") is None and not MilvusReader.sharing(fresh).exists()
    behind.drop()
    assert behind.collections(f"old_{tag}") == []
    for s in (fresh, reader, legacy, other, behind, via_alias):
        s.close()


class _RacingClient:
    """Milvus's names as two workers starting at once see them: ``has_collection`` answers for an
    alias too (as the server does), and the other worker's whole start-up (``other``) lands just
    before this worker's call number ``at``."""

    def __init__(self, collections: set[str], other, at: int) -> None:
        self.collections: set[str] = set(collections)
        self.aliases: dict[str, str] = {}
        self.other, self.at, self.calls = other, at, 0

    def _step(self, name: str | None = None) -> None:
        if self.calls == self.at:
            self.other(self)
        self.calls += 1
        if name is not None and name not in self.collections and name not in self.aliases:
            raise RuntimeError(f"collection {name} does not exist")

    def has_collection(self, name, timeout=None):
        self._step()
        return name in self.collections or name in self.aliases

    def describe_alias(self, alias, timeout=None):
        self._step()
        if alias not in self.aliases:
            raise RuntimeError(f"alias {alias} does not exist")
        return {"collection_name": self.aliases[alias]}

    def describe_collection(self, name, timeout=None):
        self._step(name)
        return _info(*CURRENT_FIELDS)

    def load_collection(self, name, timeout=None):
        self._step(name)

    def query(self, name, **_):
        self._step(name)
        return [{"model": "m"}]

    def rename_collection(self, old, new, timeout=None):
        self._step(old)
        if new in self.collections:
            raise RuntimeError(f"collection {new} already exists")
        self.collections.remove(old)
        self.collections.add(new)


@pytest.mark.parametrize("legacy_exists", [False, True])
@pytest.mark.parametrize("at", range(9))
def test_a_worker_starting_beside_another_never_mistakes_its_alias_for_a_collection_to_adopt(legacy_exists, at):
    """CI saw `run --processes 2` fail at start-up: one process created the alias while the other was
    between asking for an alias and asking for a collection of that name (which an alias answers too),
    and read the fresh alias as a collection from before aliases. Wherever the other worker's start
    lands among this one's calls, ``adopt`` raises nothing, the legacy collection (if any) is renamed
    once, and this worker says it adopted it only when the other did not."""
    renamed_by_other = []

    def other_starts(client):  # what a worker's prepare does: adopt a legacy collection, then the alias
        if "old" in client.collections:
            client.collections.remove("old")
            renamed_by_other.append(True)
        client.collections.add("old__m_1")
        client.aliases.setdefault("old", "old__m_1")

    client = _RacingClient({"old"} if legacy_exists else set(), other_starts, at)
    admin = MilvusAdmin("fake", "old__m_1", timeout=5.0, client=client)
    adopted = admin.adopt("old", "m", 4)
    if client.calls <= at:  # this worker was done before the other began
        other_starts(client)
    assert adopted is (legacy_exists and not renamed_by_other)
    assert client.collections == {"old__m_1"} and client.aliases == {"old": "old__m_1"}


class _HalfCreatedClient:
    """milvus-lite as the loser of a start-up race sees it: the other worker has made each collection's
    directory but not yet its schema file, so ``create_collection`` fails with "File exists" while
    ``has_collection`` still answers no; the other worker finishes after ``lag`` more calls."""

    def __init__(self, lag: int) -> None:
        self.lag, self.ready, self.half = lag, set(), {}

    def _tick(self) -> None:
        for name in list(self.half):
            self.half[name] -= 1
            if self.half[name] <= 0:
                self.ready.add(name)
                del self.half[name]

    def prepare_index_params(self):
        from pymilvus import MilvusClient

        return MilvusClient.prepare_index_params()

    def has_collection(self, name, timeout=None):
        self._tick()
        return name in self.ready

    def create_collection(self, name, schema=None, timeout=None):
        self._tick()
        self.half.setdefault(name, self.lag)  # the other worker got there first
        raise OSError(f"[Errno 17] File exists: '/milvus/collections/{name}'")

    def describe_collection(self, name, timeout=None):
        self._tick()
        return _info(*CURRENT_FIELDS)

    def load_collection(self, name, timeout=None):
        self._tick()
        if name not in self.ready:
            raise RuntimeError(f"collection {name} does not exist")


def test_a_worker_that_loses_the_race_to_create_its_collection_waits_for_the_winner(monkeypatch):
    """CI saw `run --processes 2` exit 2: both processes created the companion of deletes at once, and
    milvus-lite answered the loser "File exists" while the winner had not yet written the schema that
    ``has_collection`` looks for. The loser now tries again until the winner's collection answers."""
    monkeypatch.setattr("connectors.milvus.admin.time.sleep", lambda s: None)
    client = _HalfCreatedClient(lag=3)
    MilvusAdmin("fake", "c", timeout=5.0, client=client).ensure_collection(4)
    assert client.ready == {"c", "c_deleted"}
    never = _HalfCreatedClient(lag=10**9)
    monkeypatch.setattr(MilvusAdmin, "RACE_WINDOW_S", 0.05)
    with pytest.raises(ConfigError, match="did not answer .*File exists"):
        MilvusAdmin("fake", "c", timeout=5.0, client=never).ensure_collection(4)


@pytest.mark.integration
def test_workers_creating_the_same_collections_at_once_all_start(stack):
    """Four workers' start-ups at once against the real server, three times: each ends with the
    collection and its companion, and none raises. The race is made, not hoped for: each worker's
    ``create_collection`` of the collection waits until all four have seen it missing and got there."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    uri = stack["EMBEDSTREAM_MILVUS_URI"]
    for _ in range(3):
        name = f"race_{uuid.uuid4().hex[:8]}"
        admins = [MilvusAdmin(uri, name, timeout=30) for _ in range(4)]
        barrier, racers = threading.Barrier(len(admins), timeout=30), []

        def at_once(admin, real, name=name, barrier=barrier, racers=racers):
            def create_collection(collection, **kw):
                if collection == name:
                    barrier.wait()  # all four saw no collection and now create it together
                    racers.append(admin)
                return real(collection, **kw)
            return create_collection

        for a in admins:
            a._client.create_collection = at_once(a, a._client.create_collection)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda a: a.ensure_collection(4), admins))
        assert len(racers) == len(admins), "the race did not happen"
        assert admins[0].collections(name) == [name, f"{name}_deleted"]
        admins[0].drop()
        for a in admins:
            a.close()


def test_the_public_upsert_takes_over_when_the_private_call_moves(kind, stack_env, caplog):
    """pymilvus without the private call the columnar upsert uses (or with another signature): the
    rows go through ``MilvusClient.upsert`` instead, read back the same (sparse vectors too), with
    one warning and a count of each upsert."""
    from prometheus_client import REGISTRY

    def fallbacks() -> float:
        return REGISTRY.get_sample_value("embedstream_milvus_columnar_fallbacks_total") or 0.0

    vecs = np.eye(4, dtype=np.float32)
    stores = {"off": _store(kind, stack_env), "learned": _store(kind, stack_env, sparse=SparseKind.LEARNED)}
    stores["off"].upsert_chunks(_rows([("a", 0, 1), ("b", 0, 2)], vecs[:2]), "m", 1000)  # columnar, as usual

    class Moved:
        """The client's connection handler with the private call's signature changed (the public
        ``upsert`` goes through the same handler, by another of its calls)."""

        def __init__(self, handler) -> None:
            self._handler = handler

        def __getattr__(self, name):
            return getattr(self._handler, name)

        def upsert(self, *args, **kwargs):
            raise TypeError("upsert() got an unexpected keyword argument 'upsert_param'")

    for store in stores.values():
        store._client._get_connection = lambda real=store._client._get_connection: Moved(real())
    before = fallbacks()
    with caplog.at_level(logging.WARNING, logger="connectors.milvus.writes"):
        stores["off"].upsert_chunks(_rows([("c", 0, 3)], vecs[2:3]), "m", 2000)
        stores["off"].upsert_chunks(_rows([("a", 0, 5)], vecs[3:4]), "m", 3000)
    assert fallbacks() - before == 2
    assert sum("private columnar upsert failed" in r.getMessage() for r in caplog.records) == 1
    off = stores["off"]
    assert off.versions(["a", "b", "c"]) == ({"a": ("T:0", 5), "b": ("T:0", 2), "c": ("T:0", 3)},
                                             {"a": 1, "b": 1, "c": 1})
    rows = _rows([("s", 0, 1), ("e", 0, 2)], vecs[:2])
    rows.sparse = [(np.array([7, 3]), np.array([0.5, 1.0], np.float32)),
                   (np.array([], np.int32), np.array([], np.float32))]
    stores["learned"].upsert_chunks(rows, "m", 1000)
    if kind == "fake":
        assert off._client.calls[-1][1][0]["vector"] == pytest.approx(vecs[3].tolist())
        assert stores["learned"]._client.calls[-1][1][0]["sparse"] == {7: 0.5, 3: 1.0}
        return
    fields = ("id", "doc_id", "chunk_index", "chunk_count", "span_start", "span_end", "excerpt", "vector",
              "content_hash", "metadata", "updated_at", "model", "source", "source_offset")
    got = {r["id"]: r for r in MilvusReader.sharing(off).query_ids(fields)}
    c, b = got["c#0"], got["b#0"]  # c through the public upsert, b through the columnar request
    assert {k: type(v) for k, v in c.items()} == {k: type(v) for k, v in b.items()}
    assert (c["doc_id"], c["chunk_index"], c["chunk_count"], c["span_start"], c["span_end"], c["excerpt"]) == \
        ("c", 0, 1, 0, 9, "c 0")
    assert (c["content_hash"], c["metadata"], c["updated_at"], c["model"], c["source"], c["source_offset"]) == \
        ("h-c0", {"d": "c"}, 2000, "m", "T:0", 3)
    assert np.allclose(c["vector"], vecs[2]) and np.allclose(got["a#0"]["vector"], vecs[3])
    sparse = {r["id"]: r["sparse"] for r in MilvusReader.sharing(stores["learned"]).query_ids(("id", "sparse"))}
    assert sparse["s#0"] == pytest.approx({3: 1.0, 7: 0.5})
    for store in stores.values():
        MilvusAdmin.sharing(store).drop()
        store.close()
