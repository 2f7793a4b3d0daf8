"""Applications that read what the worker wrote, without embedstream: the Node.js reader of the output
topic (``examples/readers/node``, kafkajs and avsc) on the real output of each of the three formats,
record for record what the Python decoders read; and the query example (``examples/readers/query.py``,
pymilvus and sentence-transformers) on the alias, chunks grouped by document, a metadata filter whose
value is a producer's hostile text."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from connectors.kafka import make_producer
from schemas.codec import Document, decode_embedding, encode_document
from tests.faults.harness import run_worker
from tests.helpers import REPO, fresh_settings, missing_tool, read_topic

pytestmark = pytest.mark.integration

NODE_READER = REPO / "examples" / "readers" / "node"
HOSTILE_LANG = 'de" or metadata["lang"] != "'


@pytest.fixture(scope="module")
def node_reader(tmp_path_factory):
    """The Node.js reader with its locked dependencies installed (``npm ci``) in a copy of its folder."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        missing_tool("node and npm (Debian's nodejs and npm packages) run the Node.js reader example")
    folder = tmp_path_factory.mktemp("node-reader") / "reader"
    shutil.copytree(NODE_READER, folder, ignore=shutil.ignore_patterns("node_modules"))
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def _documents() -> dict[str, Document]:
    docs = {f"d{i}": Document(f"d{i}", f"short document number {i} about {['tea', 'rivers', 'trains'][i % 3]}",
                              metadata={"lang": "en" if i % 2 else "de"}) for i in range(8)}
    docs["long"] = Document("long", " ".join(f"Paragraph {k} of a long report on rail freight." for k in range(300)),
                            metadata={"lang": "en"})
    docs["odd"] = Document("odd", "a document whose language tag is a filter injection",
                           metadata={"lang": HOSTILE_LANG})
    return docs


def _python_reads(s, stack) -> list[dict]:
    """The output topic as the Python decoders read it: partition, offset, key, and the fields."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": stack["EMBEDSTREAM_SCHEMA_REGISTRY_URL"]}))
    out = []
    for m in read_topic(s, s.output_topic):
        where = {"partition": m.partition(), "offset": m.offset(), "key": m.key().decode()}
        if m.value() is None:
            out.append({**where, "deleted": True})
        elif s.output_format == "avro":
            out.append({**where, **decode_embedding(m.value(), m.headers())})
        elif s.output_format == "avro-registry":
            out.append({**where, **deserialize(m.value(), SerializationContext(m.topic(), MessageField.VALUE))})
        else:
            out.append({**where, **json.loads(m.value())})
    return out


@pytest.mark.parametrize("output_format", ["avro", "avro-registry", "json"])
def test_the_node_reader_reads_every_record_of_each_format_as_python_does(output_format, stack, node_reader):
    s = fresh_settings(stack, partitions=2, output_format=output_format,
                       schema_registry_url=stack["EMBEDSTREAM_SCHEMA_REGISTRY_URL"])
    docs = _documents()
    producer = make_producer(s.kafka_common())
    for d in docs.values():
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    producer.produce(s.input_topic, key="d3", value=None)  # a delete: a tombstone on the output topic
    assert producer.flush(30) == 0
    res = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = _python_reads(s, stack)
    chunks = [r for r in expected if not r.get("deleted")]
    # d3's upsert and its delete may meet in one group, where only the delete is written
    assert {r["key"] for r in chunks} | {"d3"} == set(docs) and sum(r["key"] == "long" for r in chunks) > 3
    assert [r["key"] for r in expected if r.get("deleted")] == ["d3"]

    env = {"PATH": os.environ["PATH"], "BROKERS": s.kafka_bootstrap_servers, "TOPIC": s.output_topic,
           "REGISTRY_URL": stack["EMBEDSTREAM_SCHEMA_REGISTRY_URL"], "UNTIL_END": "1",
           "SCHEMA": str(REPO / "schemas" / "embedding.avsc")}
    done = subprocess.run(["node", "reader.mjs"], cwd=node_reader, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    read = {(r["partition"], r["offset"]): r for r in lines if "offset" in r}
    assert set(read) == {(r["partition"], r["offset"]) for r in expected}
    for want in expected:
        got = read[want["partition"], want["offset"]]
        assert got["key"] == want["key"] and got.get("deleted") == want.get("deleted")
        if want.get("deleted"):
            continue
        assert got["format"] == output_format
        for field in ("id", "model", "dim", "chunk_index", "chunk_count", "source_offset", "content_hash",
                      "metadata", "span_start", "span_end"):
            assert got[field] == want[field], (field, got[field], want[field])
        assert np.array_equal(np.asarray(got["vector"], np.float32), np.asarray(want["vector"], np.float32))
    wholes = {line["whole"] for line in lines if "whole" in line}
    assert wholes == {r["key"] for r in chunks}  # every version whole, the long one's chunks counted to its count


def test_the_query_example_finds_documents_by_their_best_chunk_and_filters_by_a_parameter(stack):
    spec = importlib.util.spec_from_file_location("query_example", REPO / "examples" / "readers" / "query.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from pymilvus import MilvusClient
    from sentence_transformers import SentenceTransformer

    from tools.derived_models import packaged_model_path

    s = fresh_settings(stack, partitions=1)
    docs = _documents()
    producer = make_producer(s.kafka_common())
    for d in docs.values():
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    assert producer.flush(30) == 0
    res = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    client, model = MilvusClient(s.milvus_uri), SentenceTransformer(str(packaged_model_path()), device="cpu")
    try:
        # the alias, as a reader queries it; a long document's chunks come back as one document
        hits = example.search(client, model, "long report on rail freight, paragraph 120", alias=s.milvus_collection,
                              top_k=3, templates=False)
        assert hits[0]["doc_id"] == "long" and len({h["doc_id"] for h in hits}) == len(hits)
        assert hits[0]["excerpt"] and hits[0]["span"][1] > hits[0]["span"][0]
        # a filter value is data: each language tag matches its own documents only, the hostile one its own
        for lang in ("en", "de", HOSTILE_LANG):
            found = example.search(client, model, "a document", alias=s.milvus_collection, top_k=20, lang=lang,
                                   templates=False)
            assert {h["doc_id"] for h in found} == {d.id for d in docs.values() if d.metadata["lang"] == lang}, lang
    finally:
        client.close()
