"""Schema Registry on the real stack, driven only through confluent-kafka's own serializers, deserializer
and client (so the same test passes against a real registry: point ``EMBEDSTREAM_TEST_SCHEMA_REGISTRY_URL``
at one).

One worker run (``--stop-when-idle``) over one input topic that mixes everything a registry user
sends: framed Avro of three schema versions interleaved (v1 through ``embedstream produce --format
avro-registry``, v2 with an added optional field, v3 renaming ``text`` with an alias), schemaless Avro
and JSON, a frame
with an unknown schema id, a frame whose schema does not resolve against ours, a key/value id
disagreement, and a change-data-capture stream with structured keys (registry Avro and JSON, ``{"id":
n}``) — inserts, updates and deletes as tombstones. The output is ``avro-registry``, read back with
``AvroDeserializer`` given nothing but the registry's URL, and with ``embedstream tail``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from connectors.kafka import make_producer
from connectors.registry import frame
from schemas.codec import DOCUMENT_SCHEMA_TEXT, Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import (
    cosine_floor,
    document_schema_with,
    documents_in_milvus,
    fresh_settings,
    min_cosine_to_direct_encode,
    read_topic,
    registry_serializer,
    run_cli,
    settings_env,
)

pytestmark = pytest.mark.integration

KEY_SCHEMA = json.dumps({"type": "record", "name": "Key", "namespace": "dbserver.inventory.products",
                         "fields": [{"name": "id", "type": "int"}]})


@pytest.fixture(scope="module")
def run(stack, tmp_path_factory):
    """Produce the mixed stream, run the worker over it once; what the tests below check."""
    url = os.environ.get("EMBEDSTREAM_TEST_SCHEMA_REGISTRY_URL") or stack["EMBEDSTREAM_SCHEMA_REGISTRY_URL"]
    s = fresh_settings(stack, partitions=3, schema_registry_url=url, output_format="avro-registry", key_field="id")
    client = SchemaRegistryClient({"url": url})
    texts: dict[str, str] = {}

    # v1, framed by `embedstream produce --format avro-registry` (a JSONL file)
    jsonl = tmp_path_factory.mktemp("registry") / "v1.jsonl"
    v1 = {f"v1-{i}": f"Framed by the produce command, version one of the schema, document {i}." for i in range(20)}
    jsonl.write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in v1.items()))
    produced = run_cli(["produce", str(jsonl), "--format", "avro-registry"], settings_env(s), timeout=120)
    assert produced.returncode == 0, produced.stderr
    texts.update(v1)

    v2_schema = document_schema_with(name="lang", type=["null", "string"], default=None)
    v2 = registry_serializer(client, v2_schema, s.input_topic)
    v1_ser = registry_serializer(client, DOCUMENT_SCHEMA_TEXT, s.input_topic)
    renamed_schema = json.loads(v2_schema)
    renamed_schema["fields"][1] = {"name": "body", "type": "string", "aliases": ["text"]}  # v3: text → body
    v3 = registry_serializer(client, json.dumps(renamed_schema), s.input_topic)
    records: list[tuple[bytes | None, bytes | None]] = []
    for i in range(20):  # v1 and v2 interleaved, with schemaless Avro and JSON on the same topic
        for kind, value in (
            ("v2", lambda d: v2({"id": d, "text": texts[d], "lang": "en"})),
            ("v1b", lambda d: v1_ser({"id": d, "text": texts[d], "model": None, "metadata": {"kind": "v1b"},
                                      "event_time": None})),
            ("v3", lambda d: v3({"id": d, "body": texts[d], "lang": "de"})),
            ("plain", lambda d: encode_document(Document(d, texts[d]))),
            ("json", lambda d: json.dumps({"id": d, "text": texts[d]}).encode()),
        ):
            doc_id = f"{kind}-{i}"
            texts[doc_id] = f"A {kind} record on a topic that mixes formats, number {i}."
            records.append((doc_id.encode(), value(doc_id)))

    wrong = json.loads(DOCUMENT_SCHEMA_TEXT)
    wrong["fields"][1]["type"] = "int"  # a producer of another topic's schema writing to ours
    bad = {
        "bad-unknown": (frame(987_654) + b"\x02x\x04hi\x00\x00\x00", "unknown_schema"),
        "bad-incompatible": (registry_serializer(client, json.dumps(wrong), "another-topic")({"id": "x", "text": 3}),
                             "incompatible_schema"),
        "bad-mismatch": (encode_document(Document("not-the-key", "whose id is this?")), "id_mismatch"),
    }
    records += [(k.encode(), v) for k, (v, _) in bad.items()]

    # change data capture: struct keys {"id": n}, registry Avro and JSON; values carry no id
    key_ser = registry_serializer(client, KEY_SCHEMA, s.input_topic, key=True)
    cdc_final: dict[str, str | None] = {}
    for n in range(1, 11):
        key = key_ser({"id": n}) if n % 2 else json.dumps({"id": n}).encode()
        first = f"Product {n}: a sturdy thing, first description."
        records.append((key, encode_document(Document("", first))))
        cdc_final[str(n)] = first
        if n % 3 == 0:  # updated
            cdc_final[str(n)] = f"Product {n}: rewritten description after an update, with more detail."
            records.append((key, json.dumps({"id": n, "text": cdc_final[str(n)]}).encode()))
        if n % 4 == 0:  # deleted
            records.append((key, None))
            cdc_final[str(n)] = None

    producer = make_producer(s.kafka_common())
    for key, value in records:
        producer.produce(s.input_topic, key=key, value=value)
    assert producer.flush(30) == 0

    res = run_worker(s, "--stop-when-idle", "0.5", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    texts.update({k: v for k, v in cdc_final.items() if v is not None})
    good = {k for k in texts if k not in cdc_final} | {k for k, v in cdc_final.items() if v is not None}
    deleted = {k for k, v in cdc_final.items() if v is None}
    return {"s": s, "url": url, "texts": texts, "good": good, "deleted": deleted, "bad": bad, "cdc": cdc_final,
            "log": res.stderr}


def test_every_format_and_schema_version_is_embedded_and_bad_frames_are_dead_lettered(run, model):
    docs = documents_in_milvus(run["s"])
    assert set(docs) == run["good"], (sorted(set(docs) ^ run["good"])[:10], run["log"][-2000:])
    floor = cosine_floor(model.precision)
    assert min_cosine_to_direct_encode(model, docs, run["texts"]) >= floor
    dlq = read_topic(run["s"], run["s"].dlq_topic, expect=len(run["bad"]))
    reasons = {m.key().decode(): dict(m.headers())["embedstream.error.reason"].decode() for m in dlq}
    assert reasons == {k: reason for k, (_, reason) in run["bad"].items()}


def test_a_cdc_stream_with_struct_keys_updates_and_deletes_by_key(run):
    docs = documents_in_milvus(run["s"])
    for doc_id, text in run["cdc"].items():
        if text is None:
            assert doc_id not in docs, f"{doc_id} was deleted by a tombstone with a struct key"
        else:
            from worker.core.records import content_hash, normalise_text

            assert docs[doc_id][0]["content_hash"] == content_hash(normalise_text(text)), doc_id


def test_output_reads_with_nothing_but_the_registry_url(run):
    s = run["s"]
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": run["url"]}))
    out = [m for m in read_topic(s, s.output_topic) if m.value() is not None]
    records = [deserialize(m.value(), SerializationContext(s.output_topic, MessageField.VALUE)) for m in out]
    # a CDC row deleted later in the stream may have gone out before its tombstone
    assert run["good"] <= {r["id"] for r in records} <= run["good"] | run["deleted"]
    assert all(r["dim"] == len(r["vector"]) and abs(np.linalg.norm(r["vector"]) - 1) < 1e-3 for r in records)
    assert [m.key().decode() for m in out] == [r["id"] for r in records]
    # ... and so does `embedstream tail --format avro-registry`
    tail = run_cli(["tail", "--from-beginning", "--timeout", "2", "--format", "avro-registry", "--no-vectors"],
                   settings_env(s), timeout=120)
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert run["good"] <= {r["id"] for r in lines if not r.get("tombstone")} <= run["good"] | run["deleted"]
    assert {r["id"] for r in lines if r.get("tombstone")} == run["deleted"]
    assert all("error" not in r for r in lines)
    assert all(isinstance(r["embedded_at"], int) for r in lines if not r.get("tombstone"))
