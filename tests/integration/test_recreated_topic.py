"""The version guard on the real stack: a replay never goes backwards, and an input topic deleted and
re-created (its offsets start again at 0) is a new source whose updates are written."""

from __future__ import annotations

import time
import uuid

import pytest

from connectors.kafka import create_topics, make_admin, make_producer
from schemas.codec import Document, decode_embedding, encode_document
from tests.helpers import documents_in_milvus, fresh_settings, read_topic
from worker.assembly.runner import build_worker
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration


def _produce(s, docs: list[Document]) -> None:
    producer = make_producer(s.kafka_common())
    for d in docs:
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    assert producer.flush(30) == 0


def _topic_id(admin, topic: str) -> str | None:
    """The broker's id for ``topic``, asked here (not through the code under test)."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        return str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)
    except KafkaException:
        return None


def _recreate(s, topic: str, partitions: int) -> str:
    """Delete ``topic`` and create it again; returns its new id (once the broker names it by it)."""
    admin = make_admin(s.kafka_common())
    old = _topic_id(admin, topic)
    assert old is not None
    for fut in admin.delete_topics([topic], operation_timeout=30).values():
        fut.result(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a topic still being deleted counts as existing a moment
        create_topics(admin, [topic], partitions)
        new = _topic_id(admin, topic)
        if new is not None and new != old:
            return new
        time.sleep(0.5)
    raise AssertionError(f"topic {topic} was not re-created with a new id within 60 s")


def _hash(text: str) -> str:
    return content_hash(normalise_text(text))


def _row(s, doc_id: str) -> dict:
    chunks = documents_in_milvus(s)[doc_id]
    assert len(chunks) == 1
    return chunks[0]


def _last_output(s, doc_id: str, expect: int) -> dict:
    out = [m for m in read_topic(s, s.output_topic, expect=expect) if m.key() == doc_id.encode()]
    assert out, f"no output record for {doc_id}"
    return decode_embedding(out[-1].value())


def test_a_replay_never_goes_back_and_a_recreated_topic_writes_its_updates(stack, model):
    s = fresh_settings(stack, partitions=1)
    fillers = [Document(f"f{i}", f"filler document number {i}, written before the topic was reset") for i in range(299)]
    v1, v2, v3 = "x, the first version", "x, the second version", "x, the third version"
    _produce(s, [*fillers, Document("x", v1)])
    build_worker(s, embedder=model).run(stop_when_idle=2)
    row = _row(s, "x")
    assert (row["source_offset"], row["content_hash"]) == (299, _hash(v1))

    # An update, then a replay of the whole topic by a group reset to earliest: x stays at version 2.
    _produce(s, [Document("x", v2)])
    build_worker(s, embedder=model).run(stop_when_idle=2)
    build_worker(s.model_copy(update={"group_id": f"replay-{uuid.uuid4().hex[:6]}"}), embedder=model).run(
        stop_when_idle=2)
    row = _row(s, "x")
    assert (row["source_offset"], row["content_hash"]) == (300, _hash(v2))
    assert _last_output(s, "x", expect=300 + 301)["content_hash"] == _hash(v2)

    # The topic deleted and re-created: x version 3 sits at offset 0, below the 300 Milvus holds.
    _recreate(s, s.input_topic, 1)
    _produce(s, [Document("x", v3), Document("y", "y, new after the reset")])
    stats = build_worker(s, embedder=model).run(stop_when_idle=2)
    assert stats.superseded == 0, "the re-created topic's records were taken as older than the old topic's"
    row = _row(s, "x")
    assert (row["source_offset"], row["content_hash"]) == (0, _hash(v3))
    assert "y" in documents_in_milvus(s)
    out = _last_output(s, "x", expect=300 + 301 + 2)
    assert (out["content_hash"], out["source_offset"]) == (_hash(v3), 0)


def test_a_topic_recreated_while_the_worker_runs_is_a_new_source(stack, model):
    """The worker reads the topic's id again when the group hands it the re-created topic's partition."""
    import threading

    s = fresh_settings(stack, partitions=1)
    _produce(s, [*(Document(f"f{i}", f"filler {i}") for i in range(20)), Document("x", "x before the reset")])
    worker = build_worker(s, embedder=model)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(stats=worker.run()), daemon=True)
    thread.start()
    try:
        _wait_for(lambda: _offset_of(s, "x") == 20, "x at offset 20")
        _recreate(s, s.input_topic, 1)
        _produce(s, [Document("x", "x after the reset")])
        _wait_for(lambda: _offset_of(s, "x") == 0, "x rewritten from the re-created topic's offset 0")
    finally:
        worker.stop.requested = True
        thread.join(60)
    assert _row(s, "x")["content_hash"] == _hash("x after the reset")
    assert done["stats"].superseded == 0


def _offset_of(s, doc_id: str) -> int | None:
    chunks = documents_in_milvus(s).get(doc_id)
    return chunks[0]["source_offset"] if chunks else None


def _wait_for(check, what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds:.0f} s: {what}")
