"""Several models in one worker, on the real stack: the packaged MiniLM (384 dimensions) and a model
the test derives from it with a projection layer (256), records interleaved in one stream, under a
memory cap that holds only one of them at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import documents_in_milvus, fresh_settings, read_topic
from tools.derived_models import packaged_model_path, projected_model
from worker.assembly.naming import collection_name
from worker.embedding.base import resolve_model_path

pytestmark = pytest.mark.integration


def _cos(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_two_models_interleaved_under_a_memory_cap_lose_nothing_and_never_share_a_vector(stack, tmp_path):
    from sentence_transformers import SentenceTransformer

    proj_path = projected_model(tmp_path / "proj")
    models = {"minilm": {"precision": "fp32", "default": True},  # no path: the packaged model
              "proj": {"path": str(proj_path), "precision": "fp32"}}
    # ~87 MB of weights each: a cap of 120 MB holds one, so interleaved records swap them
    s = fresh_settings(stack, partitions=2, models=json.dumps(models), model_memory_mb=120,
                       milvus_collection="c_{model}_" + stack["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"][-5:])
    texts = [f"Document {i}: how a worker embeds text number {i} with the model it asked for." for i in range(40)]
    proj_id = resolve_model_path(str(proj_path))[0]
    want: dict[str, dict[str, str]] = {"minilm": {}, "proj": {}}
    producer = make_producer(s.kafka_common())
    for i, text in enumerate(texts):
        # interleaved: the default (no model field), by name, by the path it is configured with, by
        # its id (name @ a hash of its files); the same text for both
        model = ("", "proj", "minilm", str(proj_path), proj_id)[i % 5]
        target = "proj" if model in ("proj", str(proj_path), proj_id) else "minilm"
        doc = Document(f"{target}-{i}", text, model or None)
        want[target][doc.id] = text
        producer.produce(s.input_topic, key=doc.id, value=encode_document(doc))
    producer.produce(s.input_topic, key="nobody", value=encode_document(Document("nobody", "x", "no-such-model")))
    assert producer.flush(30) == 0
    res = run_worker(s, "--stop-when-idle", "0.5", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "unloaded" in res.stderr, "the memory cap never forced an eviction"
    assert "up to 16 batches in flight (8 a model served)" in res.stderr  # each model's calls as one model's

    st = {"minilm": SentenceTransformer(str(packaged_model_path()), device="cpu"),
          "proj": SentenceTransformer(str(proj_path), device="cpu")}
    for name, dim in (("minilm", 384), ("proj", 256)):
        coll = s.model_copy(update={"milvus_collection": collection_name(s.milvus_collection, name, several=True)})
        docs = documents_in_milvus(coll)
        assert set(docs) == set(want[name]), name  # exactly its model's ids
        ids = sorted(docs)
        assert ids, f"nothing in the {name} collection"
        got = np.array([docs[i][0]["vector"] for i in ids])
        assert got.shape[1] == dim
        assert _cos(got, st[name].encode_document([want[name][i] for i in ids])).min() >= 0.999, name

    out = {m.key().decode(): m for m in read_topic(s, s.output_topic, expect=40) if m.value() is not None}
    from schemas.codec import decode_embedding

    assert set(out) == set(want["minilm"]) | set(want["proj"])
    for doc_id, m in out.items():
        rec = decode_embedding(m.value())
        assert rec["dim"] == (256 if doc_id.startswith("proj") else 384)
        # each model by its id (name @ a hash of its files), never its path: the derived model's
        # folder is named after it, and differs from the base by a layer, so by its hash
        want_id = resolve_model_path(str(proj_path) if doc_id.startswith("proj") else None)[0]
        assert rec["model"] == want_id and rec["model"] != str(proj_path)
    dlq = read_topic(s, s.dlq_topic, expect=1)
    assert [dict(m.headers())["embedstream.error.reason"] for m in dlq] == [b"unknown_model"]

    # the same texts again, each under the other model: Redis holds both models' vectors for them now,
    # and each model must get its own (a vector of the other model would fail the cosine check)
    swap = fresh_settings(stack, partitions=2, models=json.dumps(models), model_memory_mb=400,
                          milvus_collection=s.milvus_collection)
    producer = make_producer(swap.kafka_common())
    for name, docs in want.items():
        other = "proj" if name == "minilm" else "minilm"
        for doc_id, text in docs.items():
            producer.produce(swap.input_topic, key=doc_id, value=encode_document(Document(doc_id, text, other)))
    assert producer.flush(30) == 0
    res = run_worker(swap, "--stop-when-idle", "0.5", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("minilm", "proj"):
        coll = swap.model_copy(update={"milvus_collection": collection_name(swap.milvus_collection, name, True)})
        docs = documents_in_milvus(coll)
        texts_of = {**want["minilm"], **want["proj"]}
        ids = sorted(docs)
        got = np.array([docs[i][0]["vector"] for i in ids])
        assert _cos(got, st[name].encode_document([texts_of[i] for i in ids])).min() >= 0.999, name


def test_a_model_load_the_host_cannot_hold_is_retried_once_the_other_models_are_unloaded():
    """Three real models under a budget that guesses two fit; the host's memory then fails the load of a
    third (a real allocation torch's allocator cannot satisfy, as its first attempt). The load is
    retried once every other model is unloaded, and the model loaded then embeds as it did before."""
    import torch

    from worker.assembly.runner import load_models
    from worker.settings import Settings

    spec = {"precision": "fp32"}
    s = Settings(kafka_bootstrap_servers="127.0.0.1:1", input_topic="docs", model_memory_mb=200,
                 models=json.dumps({"a": {**spec, "default": True}, "b": spec, "c": spec}))
    models = load_models(s)  # ~87 MB of weights each: a gave way to c at start-up
    assert [models.loaded(n) for n in "abc"] == [False, True, True]
    before = models.acquire("c").embed(["a text to embed"])
    real_load, attempts = models._load, []

    def load_short_of_memory(one):
        attempts.append(one)
        if len(attempts) == 1:
            torch.empty(2**46, dtype=torch.uint8)  # 64 TiB: the allocator fails for real
        return real_load(one)

    models._load = load_short_of_memory
    a = models.acquire("a")
    assert len(attempts) == 2 and [models.loaded(n) for n in "abc"] == [True, False, False]
    assert np.allclose(a.embed(["a text to embed"]), before, atol=1e-5)
