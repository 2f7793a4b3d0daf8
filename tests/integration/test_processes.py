"""`run --processes 2` on the real stack: two workers of one group split the partitions, and every
document lands once, at its newest version."""

from __future__ import annotations

import re

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.helpers import documents_in_milvus, fresh_settings, read_topic, run_cli, settings_env
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration


def test_two_processes_share_the_partitions_and_write_each_document_once(stack):
    s = fresh_settings(stack, partitions=4, processes=2, kafka={
        "session.timeout.ms": stack["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"]})
    producer = make_producer(s.kafka_common())
    docs = [Document(f"doc-{i}", f"document {i} about subject {i % 37}") for i in range(400)]
    for d in docs:
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    # a newer version of some: the newest must win
    for d in docs[:50]:
        producer.produce(s.input_topic, key=d.id, value=encode_document(Document(d.id, d.text + " (edited)")))
    assert producer.flush(30) == 0

    res = run_cli(["run", "--stop-when-idle", "4"], settings_env(s), timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "started 2 worker processes" in res.stderr
    assigned = [set(map(int, re.findall(r"\d+", m))) for m in re.findall(r"assigned \[([\d, ]*)\]", res.stderr)]
    assert len([a for a in assigned if a]) >= 2, res.stderr[-3000:]  # both took partitions
    assert res.stderr.count("done: ") == 2
    embedded = [int(n) for n in re.findall(r"done: (\d+) embedded", res.stderr)]
    assert len(embedded) == 2 and all(n > 0 for n in embedded), f"one process did all the work: {embedded}"
    assert sum(embedded) >= 400

    milvus = documents_in_milvus(s)
    assert set(milvus) == {d.id for d in docs}
    assert all(len(chunks) == 1 for chunks in milvus.values())
    newest = {d.id: d.text for d in docs} | {d.id: d.text + " (edited)" for d in docs[:50]}
    assert {i: chunks[0]["content_hash"] for i, chunks in milvus.items()} == \
        {i: content_hash(normalise_text(t)) for i, t in newest.items()}
    out = read_topic(s, s.output_topic, expect=450)
    assert {m.key().decode() for m in out} == {d.id for d in docs}
