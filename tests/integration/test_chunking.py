"""Long documents on the real stack and the real model: a row and an output record per chunk, and
updates and deletes that leave exactly the chunks of each document's last version (grow, shrink,
shrink to one, tombstone, two versions in one batch, replay), too many chunks dead-lettered whole,
and search that returns documents."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from connectors.kafka import make_producer
from schemas.codec import Document, decode_embedding, encode_document
from tests.helpers import cosine_floor, documents_in_milvus, fresh_settings, min_cosine_to_direct_encode, read_topic
from tools.corpus import stdlib_docstrings
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration

#: Small chunks, so that texts of a few hundred characters are several chunks.
CHUNK = dict(chunk_tokens=32, chunk_overlap=4)


def _prose(n: int, skip: int = 0) -> list[str]:
    """``n`` distinct paragraphs of real prose: the first paragraphs of stdlib docstrings."""
    out = []
    for _, doc in stdlib_docstrings():
        para = " ".join(doc.split("\n\n")[0].split())
        if len(para) >= 120:
            out.append(para)
    return out[skip:skip + n]


def _long(paragraphs: list[str], words: int) -> str:
    """About ``words`` words of prose made of ``paragraphs``."""
    text, i = [], 0
    while sum(len(p.split()) for p in text) < words:
        text.append(paragraphs[i % len(paragraphs)])
        i += 1
    return "\n\n".join(text)


def _produce(s, records: list[tuple[str, bytes | None]]) -> None:
    producer = make_producer(s.kafka_common())
    for key, value in records:
        producer.produce(s.input_topic, key=key, value=value)
    assert producer.flush(30) == 0


def _doc(doc_id: str, text: str) -> tuple[str, bytes]:
    return doc_id, encode_document(Document(doc_id, text))


def _run(s, model):
    from worker.assembly.runner import build_worker

    return build_worker(s, embedder=model).run(stop_when_idle=2)


def test_updates_and_deletes_leave_exactly_the_last_versions_chunks(stack, model):
    s = fresh_settings(stack, partitions=1, max_chunks=40, **CHUNK)
    p = _prose(40)
    first = {"grow": p[0][:60], "shrink": _long(p[1:6], 140), "to-one": _long(p[6:9], 90),
             "gone": _long(p[9:12], 80), "twice": p[12][:50]}
    chunked_before = REGISTRY.get_sample_value("embedstream_documents_chunked_total") or 0.0
    _produce(s, [_doc(i, t) for i, t in first.items()])
    stats = _run(s, model)
    assert stats.embedded == 5 and stats.chunked == 3
    docs = documents_in_milvus(s)
    assert len(docs["grow"]) == 1 and docs["grow"][0]["span_end"] == len(first["grow"])
    assert len(docs["shrink"]) > len(docs["to-one"]) > 1 and len(docs["gone"]) > 1
    before = {d: len(c) for d, c in docs.items()}
    assert REGISTRY.get_sample_value("embedstream_documents_chunked_total") - chunked_before == 3

    second = {"grow": _long(p[20:24], 110), "shrink": _long(p[1:3], 50), "to-one": p[6][:70]}
    # two versions of one id in the same batch: the last wins, chunk for chunk
    _produce(s, [*(_doc(i, t) for i, t in second.items()), ("gone", None),
                 _doc("twice", _long(p[30:34], 120)), _doc("twice", _long(p[34:36], 60))])
    _run(s, model)
    newest = {**first, **second, "twice": _long(p[34:36], 60)}
    del newest["gone"]
    docs = documents_in_milvus(s)
    assert set(docs) == set(newest)
    assert len(docs["grow"]) > 1 and 1 < len(docs["shrink"]) < before["shrink"]
    assert len(docs["to-one"]) == 1 and docs["to-one"][0]["span_end"] == len(second["to-one"])
    assert min_cosine_to_direct_encode(model, docs, newest) >= min(0.995, cosine_floor(model.precision))
    for doc, chunks in docs.items():  # the spans cover the text in order (overlapping or whitespace between)
        text = normalise_text(newest[doc])
        assert chunks[0]["span_start"] == 0 and chunks[-1]["span_end"] == len(text)
        for a, b in zip(chunks, chunks[1:]):
            assert a["span_start"] < b["span_start"] and not text[a["span_end"]:b["span_start"]].strip()
        assert all(r["content_hash"] == content_hash(text[r["span_start"]:r["span_end"]]) for r in chunks)
    snapshot = {r["id"]: np.array(r["vector"]) for chunks in docs.values() for r in chunks}

    # the output topic: a record per chunk under the document's key; a reader can tell when it holds
    # every chunk of a version (chunk_count records with the version's source offset)
    out = [m for m in read_topic(s, s.output_topic, idle=2.0) if m.key() == b"shrink"]
    last = [decode_embedding(m.value()) for m in out if m.value() is not None][-len(docs["shrink"]):]
    assert [r["chunk_index"] for r in last] == list(range(len(docs["shrink"])))
    assert {(r["chunk_count"], r["source_offset"]) for r in last} == {(len(docs["shrink"]), last[0]["source_offset"])}
    spans = [(c["span_start"], c["span_end"]) for c in docs["shrink"]]
    assert [(r["span_start"], r["span_end"]) for r in last] == spans

    # a replay of everything (a new group reads the topic from the start): exactly the same rows
    replay = s.model_copy(update={"group_id": s.group_id + "-replay"})
    stats = _run(replay, model)
    assert stats.superseded >= 5  # the first versions are older than what Milvus holds
    again = documents_in_milvus(s)
    assert {r["id"]: np.array(r["vector"]) for c in again.values() for r in c}.keys() == snapshot.keys()
    assert all(np.allclose(r["vector"], snapshot[r["id"]], atol=1e-3) for c in again.values() for r in c)


def test_a_text_of_too_many_chunks_is_dead_lettered_whole(stack, model):
    s = fresh_settings(stack, partitions=1, max_chunks=3, **CHUNK)
    p = _prose(12, skip=40)
    huge = _doc("huge", _long(p, 200))
    _produce(s, [huge, _doc("fine", p[0][:80])])
    stats = _run(s, model)
    assert stats.dlq_reasons == {"too_many_chunks": 1}
    assert set(documents_in_milvus(s)) == {"fine"}
    [dead] = read_topic(s, s.dlq_topic, expect=1)
    headers = dict(dead.headers())
    assert dead.key() == b"huge" and dead.value() == huge[1]
    assert headers["embedstream.error.reason"] == b"too_many_chunks"
    assert b"EMBEDSTREAM_MAX_CHUNKS" in headers["embedstream.error.message"]


def test_off_truncates_as_before_and_counts_it(stack, model):
    s = fresh_settings(stack, partitions=1, chunking="off")
    p = _prose(20, skip=60)
    long_text = _long(p, 600)
    truncated = REGISTRY.get_sample_value("embedstream_documents_truncated_total") or 0.0
    _produce(s, [_doc("long", long_text)])
    _run(s, model)
    [row] = documents_in_milvus(s)["long"]
    assert row["chunk_count"] == 1 and row["span_end"] == len(normalise_text(long_text))
    assert REGISTRY.get_sample_value("embedstream_documents_truncated_total") - truncated == 1
    ref = model.embed([normalise_text(long_text)])[0]  # the model truncates, as before chunking
    assert float(np.dot(ref, row["vector"])) > 0.999


def test_search_ranks_documents_by_their_best_chunk(stack, model):
    from worker.commands.search import search_documents

    s = fresh_settings(stack, partitions=1, **CHUNK)
    p = _prose(30, skip=80)
    needle = "The lighthouse keeper logs every passing ship in a leather notebook at midnight."
    manual = _long(p[:10], 400) + "\n\n" + needle
    _produce(s, [_doc("manual", manual), *(_doc(f"other-{i}", p[10 + i]) for i in range(15))])
    _run(s, model)
    hits = search_documents(s, ["who writes down the ships passing the lighthouse?"], top_k=5, embedder=model)[0]
    ids = [h["id"] for h in hits]
    assert ids[0] == "manual" and len(ids) == len(set(ids)) == 5
    best = hits[0]
    assert best["chunk"] == best["chunks"] - 1 > 0  # the needle sits in the last chunk
    assert "lighthouse" in normalise_text(manual)[best["span"][0]:best["span"][1]]
