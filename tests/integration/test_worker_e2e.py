"""The whole path on the real stack and the real model: input topic → Milvus + output topic → commit."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from connectors.kafka import make_producer
from connectors.milvus import MilvusReader
from schemas.codec import EMBEDDING_FINGERPRINT, Document, decode_embedding, encode_document
from tests.faults.harness import run_worker
from tests.helpers import (
    CountingModel,
    cosine_floor,
    documents_in_milvus,
    fresh_settings,
    min_cosine_to_direct_encode,
    read_topic,
    run_cli,
    settings_env,
)
from tools.corpus import sample_documents
from worker.embedding.base import resolve_model_path

pytestmark = pytest.mark.integration


def test_end_to_end(stack, model):
    s = fresh_settings(stack, max_text_bytes=20_000)
    docs = sample_documents(800, repeat_fraction=0.15, prefix="e2e")  # was 2000: ~80 s less, the same paths
    docs = [d for d in docs if len(encode_document(d)) < 20_000]
    # a trace context (forwarded by default) beside a header that is not; an event time of the
    # document's own, and one that only the record's timestamp (CreateTime) gives
    trace = ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    docs += [Document("traced", "a document that came with a trace", event_time=1_600_000_000_000),
             Document("stamped", "a document whose producer stamped its record")]
    producer = make_producer(s.kafka_common())
    for d in docs:
        producer.produce(s.input_topic, key=d.id, value=encode_document(d),
                         headers=[trace, ("x-internal", b"not for consumers")] if d.id == "traced" else None,
                         timestamp=1_650_000_000_000 if d.id == "stamped" else 0)
    tomb_existing = [d.id for d in docs[:25]]
    for doc_id in [*tomb_existing, "never-existed-1", "never-existed-2"]:
        producer.produce(s.input_topic, key=doc_id, value=None)
    bad = {
        "bad-avro": (b"\x02\x06abc\xff", "decode_error"),
        "bad-json": (b'{"id": "bad-json", "text": ', "decode_error"),
        "bad-empty": (encode_document(Document("bad-empty", "   ")), "empty_text"),
        "bad-utf8": (b'{"id": "bad-utf8", "text": "\xff\xfe"}', "invalid_utf8"),
        "bad-model": (encode_document(Document("bad-model", "hello", model="no-such-model")), "unknown_model"),
        "bad-long": (encode_document(Document("bad-long", "word " * 10_000)), "text_too_long"),
        "i" * 600: (encode_document(Document("i" * 600, "an id over the 512 bytes a Milvus key takes")), "id_too_long"),
    }
    for key, (value, _) in bad.items():
        producer.produce(s.input_topic, key=key, value=value)
    assert producer.flush(30) == 0

    res = run_worker(s, "--stop-when-idle", "0.5", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    print(res.stderr[-2000:])

    gone = set(tomb_existing)
    expected = {d.id: d for d in docs if d.id not in gone}
    milvus = documents_in_milvus(s)
    assert set(milvus) == set(expected)
    assert any(len(chunks) > 1 for chunks in milvus.values()), "the sample has long documents: some are chunked"

    # vectors: each chunk's the same as a direct encode of its span, at the same precision
    worst = min_cosine_to_direct_encode(model, milvus, {i: d.text for i, d in expected.items()})
    assert worst >= cosine_floor(model.precision), (worst, model.precision)
    norms = np.linalg.norm(np.array([r["vector"] for c in milvus.values() for r in c], dtype=np.float32), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-4)

    # output topic: every good id; tombstones forwarded
    chunks = sum(len(c) for c in milvus.values())
    out = read_topic(s, s.output_topic, expect=chunks + len(gone) + 27)
    emb_ids = {m.key().decode() for m in out if m.value() is not None}
    assert emb_ids == {d.id for d in docs}
    assert {m.key().decode() for m in out if m.value() is None} == gone | {"never-existed-1", "never-existed-2"}
    sample = decode_embedding(next(m.value() for m in out if m.value() is not None))
    assert sample["dim"] == 384 and len(sample["vector"]) == 384 and sample["source_topic"] == s.input_topic
    hdrs = dict(next(m for m in out if m.value() is not None).headers())
    assert hdrs["embedstream.model"] == resolve_model_path(None)[0].encode()  # name @ a hash of its files
    # headers and time carried: the trace context, not the other header; the writer schema named
    by_id = {m.key().decode(): m for m in out if m.value() is not None}
    traced, stamped = by_id["traced"], by_id["stamped"]
    assert [h for h in traced.headers() if h[0] not in ("embedstream.model", "embedstream.cached")] == [
        ("embedstream.schema", EMBEDDING_FINGERPRINT.encode()), trace]
    assert decode_embedding(traced.value(), traced.headers())["event_time"] == 1_600_000_000_000
    assert decode_embedding(stamped.value(), stamped.headers())["event_time"] == 1_650_000_000_000
    assert "traceparent" not in dict(stamped.headers())

    # DLQ: every bad record, with its reason and original bytes
    dlq = read_topic(s, s.dlq_topic, expect=len(bad))
    assert len(dlq) == len(bad)
    for m in dlq:
        key = m.key().decode()
        h = dict(m.headers())
        assert h["embedstream.error.reason"].decode() == bad[key][1], (key, h)
        assert h["embedstream.error.message"]
        assert h["embedstream.source.topic"].decode() == s.input_topic
        assert m.value() == bad[key][0]

    # committed offsets: at the end of every partition
    ends = Counter()
    for m in read_topic(s, s.input_topic, expect=len(docs) + 27 + len(bad)):
        ends[m.partition()] = max(ends[m.partition()], m.offset() + 1)
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    committed = c.committed([TopicPartition(s.input_topic, p) for p in range(6)], timeout=10)
    c.close()
    assert {tp.partition: tp.offset for tp in committed if tp.partition in ends} == dict(ends)
    assert "done:" in res.stderr


def test_cache_second_stream_is_all_hits_and_survives_redis_down(stack, model, tmp_path):
    from worker.assembly.runner import build_worker

    s = fresh_settings(stack)
    texts = [d.text for d in sample_documents(300, prefix="c")]
    producer = make_producer(s.kafka_common())
    for i, t in enumerate(texts):
        producer.produce(s.input_topic, key=f"first-{i}", value=encode_document(Document(f"first-{i}", t)))
    assert producer.flush(30) == 0
    stats1 = build_worker(s, embedder=model).run(stop_when_idle=2)
    assert stats1.embedded == 300

    # Same texts under new ids: every one a cache hit, the model never called.
    for i, t in enumerate(texts):
        producer.produce(s.input_topic, key=f"second-{i}", value=encode_document(Document(f"second-{i}", t)))
    assert producer.flush(30) == 0
    counting = CountingModel(model)
    stats2 = build_worker(s, embedder=counting).run(stop_when_idle=2)
    assert stats2.embedded == 300 and stats2.cached == 300
    assert counting.texts == 0 and counting.canaries == 1  # only the canary, once at start-up

    store = MilvusReader(s.milvus_uri, s.milvus_collection)
    rows = {r["id"]: np.array(r["vector"]) for r in store.query_ids(fields=("id", "vector"))}
    for i in range(300):
        assert np.array_equal(rows[f"first-{i}#0"], rows[f"second-{i}#0"])
    out = read_topic(s, s.output_topic, expect=600)
    cached_flags = {m.key().decode(): decode_embedding(m.value())["cached"] for m in out}  # last chunk's
    assert all(cached_flags[f"second-{i}"] for i in range(300))

    # Redis unreachable: same results, no error, the model does the work.
    s_down = s.model_copy(update={"redis_url": SecretStr("redis://127.0.0.1:1/0")})
    for i, t in enumerate(texts[:100]):
        producer.produce(s.input_topic, key=f"third-{i}", value=encode_document(Document(f"third-{i}", t)))
    assert producer.flush(30) == 0
    counting = CountingModel(model)
    stats3 = build_worker(s_down, embedder=counting).run(stop_when_idle=2)
    rows = {r["id"]: np.array(r["vector"]) for r in store.query_ids(fields=("id", "vector"))}
    third_chunks = sum(1 for i in rows if i.startswith("third-"))  # long texts are several chunks
    assert stats3.embedded == 100 and stats3.cached == 0 and counting.texts == third_chunks
    floor = 0.9999 if model.precision in ("fp32", "bf16") else cosine_floor(model.precision)
    for i in range(100):  # int8 quantizes activations per batch: the same text in another batch moves a little
        cos = rows[f"first-{i}#0"] @ rows[f"third-{i}#0"]
        assert cos > floor


def test_on_a_redis_cluster_a_second_stream_is_all_hits(stack, model, redis_cluster):
    """The cache on a Redis Cluster of three masters (no setting: the worker finds out): the same
    texts under new ids come from the cache, every one, and the model is never called; the vectors
    are spread over the masters."""
    from worker.assembly.runner import build_worker

    s = fresh_settings(stack).model_copy(update={"redis_url": SecretStr(redis_cluster.url)})
    texts = [d.text for d in sample_documents(60, prefix="rc")]
    before = redis_cluster.keys_by_node()
    producer = make_producer(s.kafka_common())
    for round_ in ("first", "second"):
        for i, t in enumerate(texts):
            producer.produce(s.input_topic, key=f"{round_}-{i}", value=encode_document(Document(f"{round_}-{i}", t)))
        assert producer.flush(30) == 0
        counting = CountingModel(model)
        stats = build_worker(s, embedder=counting).run(stop_when_idle=2)
        assert stats.embedded == 60
    assert stats.cached == 60 and counting.texts == 0 and counting.canaries == 1
    added = [n - before[p] for p, n in redis_cluster.keys_by_node().items()]
    assert min(added) > 0 and sum(added) >= 60


def test_startup_errors_are_clear(stack, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    s = fresh_settings(stack)
    env = settings_env(s)

    # a collection built for another dim
    from pymilvus import DataType, MilvusClient

    from connectors.milvus.connection import connect

    # opened as the worker opens it: no idle keepalive pings (milvus-lite answers them with GOAWAY
    # "too_many_pings", which gRPC's shared subchannels pass on to the next client), a refused
    # handshake tried again
    client = connect(s.milvus_uri, None, 10)
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=128)
    client.create_collection("wrong_dim", schema=schema, timeout=10)
    # a collection of the shape from before chunking (one row per document): no silent mixing
    old = MilvusClient.create_schema(auto_id=False)
    old.add_field("id", DataType.VARCHAR, is_primary=True, max_length=512)
    old.add_field("vector", DataType.FLOAT_VECTOR, dim=384)
    for name in ("model", "content_hash"):
        old.add_field(name, DataType.VARCHAR, max_length=256)
    old.add_field("metadata", DataType.JSON)
    old.add_field("updated_at", DataType.INT64)
    client.create_collection("one_row_per_document", schema=old, timeout=10)
    client.close()

    # each wrong setting, and what its message must name (the runs are independent: two at a time)
    cases = [
        (["run", "--model", str(tmp_path / "no-such-model")], env, ["EMBEDSTREAM_MODEL"]),
        (["run", "--milvus-collection", "wrong_dim"], env, ["128-dim", "EMBEDSTREAM_MILVUS_COLLECTION"]),
        (["run", "--milvus-collection", "one_row_per_document"], env,
         ["before chunking", "EMBEDSTREAM_MILVUS_COLLECTION"]),
        (["run"], {**env, "EMBEDSTREAM_CHUNK_TOKENS": "1000"}, ["EMBEDSTREAM_CHUNK_TOKENS=1000", "254 tokens"]),
        (["run", "--kafka-bootstrap-servers", "127.0.0.1:1"], env, ["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"]),
        (["run", "--input-topic", "no-such-topic"], env, ["no-such-topic"]),
        (["run"], {**env, "EMBEDSTREAM_PRECISION": "fp8"}, ["EMBEDSTREAM_PRECISION"]),
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: run_cli(case[0], case[1], timeout=120), cases))
    for (args, _, names), res in zip(cases, results):
        assert res.returncode == 2 and all(n in res.stderr for n in names), (args, res.stderr[-2000:])
        json.dumps(res.stderr)  # printable
