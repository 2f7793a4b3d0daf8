"""The version guard on the real stack: a replay never goes backwards, and an input topic deleted and
re-created (its offsets start again at 0) is a new source whose updates are written."""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager

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


def test_an_older_upsert_replayed_after_its_tombstone_never_brings_the_row_back(stack, model):
    """Deletes have versions too, end to end: x written, then deleted; a group reset to earliest reads
    x's upsert again after the delete was written. The companion collection's delete version is newer:
    the replayed upsert is superseded, the row stays deleted, and the output topic's last record of x
    stays the tombstone. (With delete versions off, the replay wrote x back.)"""
    s = fresh_settings(stack, partitions=1)
    producer = make_producer(s.kafka_common())
    producer.produce(s.input_topic, key="x", value=encode_document(Document("x", "x, written then deleted")))
    producer.produce(s.input_topic, key="y", value=encode_document(Document("y", "y stays")))
    producer.produce(s.input_topic, key="x", value=None)
    assert producer.flush(30) == 0
    build_worker(s, embedder=model).run(stop_when_idle=0.5)
    assert set(documents_in_milvus(s)) == {"y"}
    replay = build_worker(s.model_copy(update={"group_id": f"replay-{uuid.uuid4().hex[:6]}"}), embedder=model)
    stats = replay.run(stop_when_idle=0.5)
    assert set(documents_in_milvus(s)) == {"y"}, "a replayed upsert older than its delete wrote the row back"
    assert stats.superseded >= 1
    last = [m for m in read_topic(s, s.output_topic) if m.key() == b"x"][-1]
    assert last.value() is None, "the output topic ends x with its older upsert, after the tombstone"


def test_a_topic_recreated_while_the_worker_runs_is_a_new_source(stack, model):
    """The worker reads the topic's id again when the group hands it the re-created topic's partition."""
    s = fresh_settings(stack, partitions=1)
    with _running_past_x(s, model) as done:
        _recreate(s, s.input_topic, 1)
        _produce(s, [Document("x", "x after the reset")])
        _wait_for(lambda: _offset_of(s, "x") == 0, "x rewritten from the re-created topic's offset 0")
    assert _row(s, "x")["content_hash"] == _hash("x after the reset")
    assert done["stats"].superseded == 0


@contextmanager
def _running_past_x(s, model):
    """A worker running on a thread over twenty fillers and then x (at offset 20), once x is written;
    stopped when the block ends. Yields the dict its run's stats land in (``stats``)."""
    _produce(s, [*(Document(f"f{i}", f"filler {i}") for i in range(20)), Document("x", "x before the reset")])
    worker = build_worker(s, embedder=model)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(stats=worker.run()), daemon=True)
    thread.start()
    try:
        _wait_for(lambda: _offset_of(s, "x") == 20, "x at offset 20")
        yield done
    finally:
        worker.stop.requested = True
        thread.join(60)


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


@pytest.mark.guarantee
def test_an_older_version_replayed_alone_is_kept_out_of_milvus_and_the_output_topic(stack, model):
    """The version guard's own test: versions 1 of twenty documents, 200 fillers, then their versions 2,
    written; then the group reset to the start, read in batches of ten with one batch in flight, so each
    version 1 reaches the sink alone, long before its version 2 (a replay, a rebalance's redo). Milvus stays
    at version 2 and the output topic never goes back from a version 2 to a version 1 of any document.
    With the guard off, every version 1 is written again after its version 2: the output goes back."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    s = fresh_settings(stack, partitions=1)
    ids = [f"x{i}" for i in range(20)]
    first = {d: f"{d}, the first version" for d in ids}
    second = {d: f"{d}, the second version" for d in ids}
    _produce(s, [*(Document(d, t) for d, t in first.items()),
                 *(Document(f"f{i}", f"filler {i} between the versions") for i in range(200)),
                 *(Document(d, t) for d, t in second.items())])
    # batches of 64 never hold a version 1 with its version 2 (200 offsets apart): all 240 are written
    build_worker(s.model_copy(update={"max_batch_size": 64}), embedder=model).run(stop_when_idle=2)
    assert {d: _row(s, d)["content_hash"] for d in ids} == {d: _hash(t) for d, t in second.items()}

    admin = make_admin(s.kafka_common())  # the group reset to the start, as an operator's replay does
    fut = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(s.group_id, [TopicPartition(
        s.input_topic, 0, 0)])])
    for f in fut.values():
        f.result(30)
    replay = s.model_copy(update={"max_batch_size": 10, "max_inflight_batches": 1})
    stats = build_worker(replay, embedder=model).run(stop_when_idle=2)
    assert stats.superseded >= len(ids), stats  # every version 1 judged older than what Milvus holds
    assert {d: _row(s, d)["content_hash"] for d in ids} == {d: _hash(t) for d, t in second.items()}
    newer = {_hash(t): d for d, t in second.items()}
    older = {_hash(t): d for d, t in first.items()}
    seen_newer: set[str] = set()
    went_back = []
    # 240 from the first run, then the replay's 200 fillers and 20 versions 2 (its versions 1 superseded)
    for m in read_topic(s, s.output_topic, expect=240 + 220):
        if m.value() is None or m.key().decode() not in ids:
            continue
        h = decode_embedding(m.value(), m.headers())["content_hash"]
        if h in newer:
            seen_newer.add(newer[h])
        elif h in older and older[h] in seen_newer:
            went_back.append(older[h])
    assert seen_newer == set(ids) and went_back == [], f"the output went back to version 1 for {went_back}"


def test_a_topic_recreated_with_more_partitions_is_read_whole(stack, model):
    """The input topic of one partition re-created with three under a running worker: the group hands
    it all three, and what is produced to each (a newer version of a document among them) is written
    from the new topic's own offsets."""
    s = fresh_settings(stack, partitions=1)
    with _running_past_x(s, model) as done:
        _recreate(s, s.input_topic, 3)
        producer = make_producer(s.kafka_common())
        # (partition, offset) of each: x then y2 on partition 2, y0 and y1 alone on theirs
        placed = {"x": (2, 0), "y0": (0, 0), "y1": (1, 0), "y2": (2, 1)}
        texts = {d: "x after the reset" if d == "x" else f"{d} on partition {p}" for d, (p, _) in placed.items()}
        for doc_id, (partition, _) in placed.items():
            producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, texts[doc_id])),
                             partition=partition)
        assert producer.flush(30) == 0

        def written() -> bool:
            rows = {d: chunks[0] for d, chunks in documents_in_milvus(s).items()}
            return all(d in rows and (rows[d]["content_hash"], rows[d]["source_offset"]) == (_hash(t), placed[d][1])
                       for d, t in texts.items())
        _wait_for(written, "every partition of the re-created topic read")
    assert done["stats"].superseded == 0
