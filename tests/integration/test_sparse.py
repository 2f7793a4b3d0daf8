"""Sparse vectors beside the dense ones (EMBEDSTREAM_SPARSE) on the real stack and the real model:
``bm25`` rows keep each chunk's text and Milvus derives their sparse vectors; a learned sparse model
(derived from the packaged MiniLM: its plumbing is the point, not its quality) writes its vectors to
Milvus, the output topic and the cache. Updates, shrinking documents and tombstones leave exactly the
last version's rows on the sparse side too, and search serves dense, sparse and hybrid."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.kafka import make_producer
from connectors.milvus import MilvusReader
from schemas.codec import Document, decode_embedding, encode_document
from tests.helpers import check_bm25_texts, documents_in_milvus, fresh_settings, read_topic
from tools.corpus import stdlib_docstrings
from worker.core.records import normalise_text

pytestmark = pytest.mark.integration

CHUNK = dict(chunk_tokens=32, chunk_overlap=4)
NEEDLE = "The handshake failed with ERR_SSL_VERSION_OR_CIPHER_MISMATCH before any byte was sent."


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """The packaged model with a learned sparse model on its tokenizer (``tools.derived_models``)."""
    from tools.derived_models import sparse_model
    from worker.embedding.sentence import SentenceTransformerEmbedder

    path = sparse_model(tmp_path_factory.mktemp("sparse") / "csr")
    return SentenceTransformerEmbedder(precision="fp32", sparse=str(path))


def _prose(n: int, skip: int = 0) -> list[str]:
    out = [" ".join(doc.split("\n\n")[0].split()) for _, doc in stdlib_docstrings()]
    return [p for p in out if len(p) >= 120][skip:skip + n]


def _produce(s, records: list[tuple[str, str | None]]) -> None:
    producer = make_producer(s.kafka_common())
    for key, text in records:
        producer.produce(s.input_topic, key=key, value=None if text is None else encode_document(Document(key, text)))
    assert producer.flush(30) == 0


def _run(s, model):
    from worker.assembly.runner import build_worker

    return build_worker(s, embedder=model).run(stop_when_idle=2)


def _rows(s, fields: tuple[str, ...]) -> dict[str, dict]:
    reader = MilvusReader(s.milvus_uri, s.milvus_collection, timeout=30)
    try:
        return {r["id"]: r for r in reader.query_ids(("id", *fields))}
    finally:
        reader.close()


def test_bm25_rows_keep_each_chunks_text_through_updates_and_search_finds_the_identifier(stack, model):
    from worker.commands.search import search_documents

    s = fresh_settings(stack, partitions=1, sparse="bm25", **CHUNK)
    p = _prose(24, skip=5)
    first = {"shrink": " ".join(p[0:5]), "gone": " ".join(p[5:8]), "needle": p[8] + " " + NEEDLE,
             **{f"other-{i}": p[10 + i] for i in range(12)}}
    _produce(s, list(first.items()))
    _run(s, model)
    second = {"shrink": p[0][:90]}
    _produce(s, [*second.items(), ("gone", None)])
    _run(s, model)
    newest = {**first, **second}
    del newest["gone"]
    docs = documents_in_milvus(s)
    assert set(docs) == set(newest) and len(docs["shrink"]) == 1
    check_bm25_texts(s, docs, newest)  # each row holds its chunk's whole text; the old chunks are gone

    query = "ERR_SSL_VERSION_OR_CIPHER_MISMATCH"
    by_mode = {mode: [h["id"] for h in search_documents(s, [query], top_k=3, embedder=model, mode=mode)[0]]
               for mode in ("dense", "sparse", "hybrid")}
    assert by_mode["sparse"][0] == "needle" and "needle" in by_mode["hybrid"]
    assert [h["id"] for h in search_documents(s, [query], top_k=3, embedder=model)[0]] == by_mode["hybrid"]
    weighted = search_documents(s, [query], top_k=3, embedder=model, mode="hybrid", weights=(0.0, 1.0))[0]
    assert weighted[0]["id"] == "needle"  # all the weight on the sparse side


def test_a_learned_sparse_model_writes_its_vectors_to_milvus_the_output_topic_and_the_cache(stack, learned):
    from worker.commands.search import search_documents

    s = fresh_settings(stack, partitions=1, sparse=learned.sparse.setting, **CHUNK)
    p = _prose(12, skip=40)
    first = {"long": " ".join(p[0:4]), "gone": p[4], **{f"d{i}": p[5 + i] for i in range(6)}}
    _produce(s, list(first.items()))
    _run(s, learned)
    _produce(s, [("long", p[0][:100]), ("gone", None)])
    _run(s, learned)
    newest = {**first, "long": p[0][:100]}
    del newest["gone"]
    docs = documents_in_milvus(s)
    assert set(docs) == set(newest) and len(docs["long"]) == 1
    rows = _rows(s, ("sparse",))
    assert len(rows) == sum(len(c) for c in docs.values())
    for doc, chunks in docs.items():  # the sparse vector of each row is the sparse model's, of its chunk
        text = normalise_text(newest[doc])
        _, want = learned.embed_sparse([text[r["span_start"]:r["span_end"]] for r in chunks])
        for r, (idx, val) in zip(chunks, want):
            got = rows[r["id"]]["sparse"]
            assert sorted(got) == sorted(idx.tolist()) and np.allclose([got[i] for i in idx.tolist()], val, atol=1e-5)

    out = [decode_embedding(m.value()) for m in read_topic(s, s.output_topic, idle=2.0) if m.value() is not None]
    assert out and all(r["sparse_indices"] and len(r["sparse_indices"]) == len(r["sparse_values"]) for r in out)
    last = [r for r in out if r["id"] == "long"][-1]
    assert {int(i): v for i, v in zip(last["sparse_indices"], last["sparse_values"])} == pytest.approx(
        rows["long#0"]["sparse"], abs=1e-6)

    # the same texts in another deployment sharing Redis: every vector from the cache, sparse included
    again = fresh_settings(stack, partitions=1, sparse=learned.sparse.setting, **CHUNK)
    _produce(again, list(newest.items()))
    stats = _run(again, learned)
    assert stats.cached == stats.embedded == len(newest)
    cached = [decode_embedding(m.value()) for m in read_topic(again, again.output_topic, idle=2.0)]
    assert len(cached) >= len(newest) and all(r["cached"] for r in cached)
    fresh = {(r["id"], r["chunk_index"]): r for r in out if r["id"] in newest and r["id"] != "long"}
    for r in cached:
        if (r["id"], r["chunk_index"]) in fresh:
            assert r["sparse_indices"] == fresh[r["id"], r["chunk_index"]]["sparse_indices"]

    hits = search_documents(s, [p[5][:60]], top_k=3, embedder=learned)[0]  # hybrid: the default here
    assert hits[0]["id"] == "d0"
    assert search_documents(s, [p[5][:60]], top_k=3, embedder=learned, mode="sparse")[0]
