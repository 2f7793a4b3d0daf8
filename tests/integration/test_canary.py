"""The canary on the real stack and the real model (``worker.embedding.canary``): the first worker on a
collection keeps the canary texts' vectors with it; a mixed fleet (int8 and float32 on one collection)
passes with its measured cosine in the log; a model of the same id that computes something else (its
pooling changed in memory: nothing in its files, so the id cannot see it) is refused before it writes,
and `embedstream run` stops with one line that says the model, the precision, the cosine and what
differs."""

from __future__ import annotations

import logging

import pytest

from connectors.kafka import make_producer
from connectors.milvus import MilvusAdmin
from schemas.codec import Document, encode_document
from schemas.errors import ConfigError
from tests.helpers import documents_in_milvus, fresh_settings, run_cli, settings_env
from worker.embedding.canary import Canary

pytestmark = pytest.mark.integration


def _produce(s, docs: dict[str, str]) -> None:
    producer = make_producer(s.kafka_common())
    for key, text in docs.items():
        producer.produce(s.input_topic, key=key, value=encode_document(Document(key, text)))
    assert producer.flush(30) == 0


def _admin(s) -> MilvusAdmin:
    """The collection the alias points to (the one the workers write)."""
    alias = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    try:
        target = alias.alias_target(s.milvus_collection)
    finally:
        alias.close()
    return MilvusAdmin(s.milvus_uri, target, timeout=30)


def test_a_mixed_fleet_passes_and_a_changed_computation_is_refused_before_it_writes(stack, model, caplog):
    from worker.assembly.runner import build_worker
    from worker.embedding.sentence import SentenceTransformerEmbedder

    s = fresh_settings(stack, partitions=1)
    _produce(s, {f"d{i}": f"document {i} about partitions and offsets" for i in range(4)})
    build_worker(s, embedder=model).run(stop_when_idle=1)
    admin = _admin(s)
    kept = Canary.loads(admin.canary())  # type: ignore[arg-type]
    assert (kept.model_id, kept.precision) == (model.model_id, model.precision) and len(kept.vectors) >= 8

    fp32 = SentenceTransformerEmbedder(precision="fp32")
    assert fp32.model_id == model.model_id and model.precision != "fp32"  # the same id, another precision
    _produce(s, {"d9": "a document written by the float32 worker"})
    with caplog.at_level(logging.INFO, logger="worker.assembly.canaries"):
        build_worker(s, embedder=fp32).run(stop_when_idle=1)
    [line] = [r.getMessage() for r in caplog.records if "canary of" in r.getMessage()]
    assert "at fp32 on cpu: cosine 0.9" in line and f"against the one kept at {model.precision}" in line
    assert set(documents_in_milvus(s)) == {"d0", "d1", "d2", "d3", "d9"}

    fp32.sentence_transformer[1].pooling_mode = "cls"  # the same files, another computation
    _produce(s, {"d10": "never written"})
    with pytest.raises(ConfigError) as raised:
        build_worker(s, embedder=fp32)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"model {model.model_id} at fp32 on cpu does not make")
    assert f"that {model.precision} against fp32 must reach" in message and "precision " in message
    assert "d10" not in documents_in_milvus(s)
    assert Canary.loads(admin.canary()).precision == model.precision  # type: ignore[arg-type]  # the reference stays
    admin.close()


def test_embedstream_run_stops_with_one_line_on_a_collection_another_computation_wrote(stack, model):
    from worker.embedding.sentence import SentenceTransformerEmbedder

    s = fresh_settings(stack, partitions=1)
    _produce(s, {"a": "the first document"})
    res = run_cli(["run", "--stop-when-idle", "1"], settings_env(s), timeout=300)
    assert res.returncode == 0 and "kept with collection" in res.stderr, res.stderr[-2000:]
    # the collection as a worker whose library pooled otherwise would have begun it
    other = SentenceTransformerEmbedder(precision="fp32")
    other.sentence_transformer[1].pooling_mode = "cls"
    made = Canary.of(other)
    admin = _admin(s)
    admin.keep_canary(Canary(made.model_id, made.precision, made.device,
                             {**made.versions, "sentence-transformers": "0.0.1"}, made.texts, made.vectors).dumps())
    admin.close()
    _produce(s, {"b": "never written"})
    res = run_cli(["run", "--stop-when-idle", "1"], settings_env(s), timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [ln for ln in res.stderr.splitlines() if "does not make the vectors" in ln]
    assert f"model {model.model_id} at {model.precision}" in line and "canary cosine 0." in line
    assert "sentence-transformers 0.0.1 → " in line and "embedstream migrate" in line
    assert "b" not in documents_in_milvus(s)
