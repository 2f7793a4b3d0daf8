"""`embedstream migrate` on the real stack: documents keep streaming in and a reader keeps querying
the alias while a new model backfills its collection; migrate is killed mid-way and re-run; after
the switch and the hand-over, every live document is in the new collection with the new model's
vector (updates and deletes made during the backfill included)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition

from connectors.kafka import create_topics, make_admin
from connectors.milvus import MilvusAdmin, MilvusReader
from connectors.milvus.connection import connect
from schemas.codec import Document, encode_document
from tests.helpers import (
    CLI,
    REPO,
    check_bm25_texts,
    cosine_floor,
    documents_in_milvus,
    fresh_settings,
    min_cosine_to_direct_encode,
    read_topic,
    run_cli,
    settings_env,
)
from tools.corpus import sample_documents
from tools.derived_models import packaged_model_path, projected_model
from tools.mock_broker import MockCluster
from worker.assembly.naming import versioned_name
from worker.assembly.runner import build_worker, load_embedder
from worker.commands.migrate import BackfillLag, backfill_lag
from worker.settings import Settings

pytestmark = pytest.mark.integration


def test_backfill_lag_counts_from_the_first_offset_and_is_certain_only_at_every_end():
    """On librdkafka's mock cluster (its end offsets are right): a group that never committed owes
    every record; ends the backfill's consumer saw raise the broker's; certain only with an end for
    every partition."""
    with MockCluster() as mc:
        mc.create_topic("docs", 2)
        producer = Producer({"bootstrap.servers": mc.bootstraps})
        for i in range(10):
            producer.produce("docs", key=str(i), value=b"v", partition=0)
        assert producer.flush(10) == 0
        s = Settings(kafka_bootstrap_servers=mc.bootstraps, input_topic="docs")
        assert backfill_lag(s, "g") == BackfillLag(10, False, False)
        group = Consumer({"bootstrap.servers": mc.bootstraps, "group.id": "g"})
        group.commit(offsets=[TopicPartition("docs", 0, 4)], asynchronous=False)
        assert backfill_lag(s, "g", ends={0: 10}) == BackfillLag(6, False, True)  # partition 1 not reached yet
        assert backfill_lag(s, "g", ends={0: 12, 1: 0}) == BackfillLag(8, True, True)  # a broker answering short
        group.commit(offsets=[TopicPartition("docs", 0, 10)], asynchronous=False)
        assert backfill_lag(s, "g", ends={0: 10, 1: 0}) == BackfillLag(0, True, True)
        group.close()


class Reader(threading.Thread):
    """Queries the alias in a loop, as a search service would; counts answers, empty ones and errors."""

    def __init__(self, uri: str, alias: str, vector: list[float]) -> None:
        super().__init__(daemon=True)
        self.client = connect(uri, None, 10)  # as the worker opens it: no idle keepalive pings
        self.alias, self.vector = alias, vector
        self.answers, self.empty, self.errors, self.models = 0, 0, [], set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                hits = self.client.search(self.alias, data=[self.vector], limit=5, output_fields=["model"])[0]
                self.answers += 1
                self.empty += not hits
                self.models.update(h["entity"]["model"] for h in hits)
            except Exception as exc:
                self.errors.append(repr(exc))
            time.sleep(0.05)


def _committed(s, group: str) -> int:
    admin = make_admin(s.kafka_common())
    tps = [TopicPartition(s.input_topic, p) for p in range(3)]
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])[group].result(10)
    return sum(max(tp.offset, 0) for tp in res.topic_partitions)


def test_migrate_while_documents_stream_and_readers_query_the_alias(stack, model, tmp_path):
    texts = [d.text for d in sample_documents(420, prefix="m")]
    s = fresh_settings(stack, partitions=3, compacted_input=True, precision="fp32", max_batch_size=16)
    new_path = str(projected_model(tmp_path / "new-model", dim=384))
    # The new deployment also turns on BM25 (EMBEDSTREAM_SPARSE=bm25): a collection of another shape,
    # filled by the same backfill; the old one has no sparse side.
    new = load_embedder(s.model_copy(update={"model": new_path, "sparse": "bm25"}))
    new_collection = versioned_name(s.milvus_collection, new.model_id, new.space_id)
    group = f"{s.group_id}.migrate.{new_collection}"
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5})
    live: dict[str, str | None] = {}

    def put(i: int, text: str | None) -> None:
        key = f"d{i}"
        value = encode_document(Document(key, text)) if text is not None else None
        producer.produce(s.input_topic, key=key, value=value)
        live[key] = text

    for i in range(200):
        put(i, texts[i])
    for k in range(3):  # records that can never succeed: dead-lettered once, by the live worker
        producer.produce(s.input_topic, key=f"bad{k}", value=b"not a document {")
    producer.flush(30)
    # The deployment in use: the packaged model, writing behind the alias it creates.
    build_worker(s, embedder=model).run(stop_when_idle=2)
    store = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    old_collection = store.alias_target(s.milvus_collection)
    assert old_collection is not None and old_collection != new_collection
    assert len(read_topic(s, s.dlq_topic, expect=3)) == 3

    # The new model's records go to a topic of their own, asked for (by default a backfill publishes
    # nothing): the output topic's readers see the old model alone until the hand-over.
    next_topic = f"{s.output_topic}.next"
    create_topics(make_admin(s.kafka_common()), [next_topic], 3)
    env = {**settings_env(s), "COLUMNS": "200", "EMBEDSTREAM_SPARSE": "bm25",  # long names on one line each
           "EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC": next_topic}
    dry = run_cli(["migrate", "--model", new_path, "--dry-run"], env, timeout=180)
    assert dry.returncode == 0, dry.stderr
    assert new_collection in dry.stdout and group in dry.stdout and "dry run" in dry.stdout
    assert store.alias_target(s.milvus_collection) == old_collection

    reader = Reader(s.milvus_uri, s.milvus_collection, model.embed_query(["how to open a file"])[0].tolist())
    reader.start()
    worker = build_worker(s, embedder=model)  # the live workers keep writing the old collection meanwhile
    live_thread = threading.Thread(target=worker.run, daemon=True)
    live_thread.start()

    def stream() -> None:  # updates, deletes and new documents while the migration runs
        for step in range(20):
            for j in range(4):
                i = step * 4 + j
                put(i, texts[200 + i] if i % 4 else None)  # every 4th a delete, the others updated
            put(280 + step, texts[280 + step])
            producer.flush(10)
            time.sleep(0.4)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()

    # A first migrate, killed once the backfill has committed some of its progress.
    first = subprocess.Popen([*CLI, "migrate", "--model", new_path], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while _committed(s, group) == 0 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    out_first = first.communicate()[0].decode(errors="replace")
    assert store.alias_target(s.milvus_collection) == old_collection, out_first
    assert 0 < _committed(s, group), out_first
    streamer.join(60)

    # Re-run: it resumes, catches up, compares, and an overlap floor the new model misses blocks it.
    blocked = run_cli(["migrate", "--model", new_path, "--min-overlap", "0.99"], env, timeout=300)
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "shadow check" in blocked.stdout and "not switching" in blocked.stdout, blocked.stdout
    # each collection's kept canary against its model now, beside the neighbours (worker.embedding.canary):
    # within int8's bound (a collection begun at int8 is checked here at float32, or the other way)
    canaries = re.search(r"canary cosine \(kept vs its model now\)\W+([\d.]+)\W+([\d.]+)", blocked.stdout)
    assert canaries is not None and min(map(float, canaries.groups())) >= 0.95, blocked.stdout
    assert store.alias_target(s.milvus_collection) == old_collection
    second = run_cli(["migrate", "--model", new_path], env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "switched" in second.stdout, second.stdout
    assert store.alias_target(s.milvus_collection) == new_collection

    # The hand-over: the live workers stop, and run the new model in the backfill group.
    worker.stop.requested = True
    live_thread.join(60)
    from schemas.codec import decode_embedding

    def models_in(topic: str) -> set[str]:
        return {decode_embedding(m.value())["model"] for m in read_topic(s, topic) if m.value() is not None}

    assert models_in(s.output_topic) == {model.model_id}
    assert models_in(next_topic) == {new.model_id}
    assert {m.key().decode() for m in read_topic(s, next_topic)} == set(live)  # every id, its tombstones too
    build_worker(s.model_copy(update={"model": new_path, "group_id": group, "sparse": "bm25"}),
                 embedder=new).run(stop_when_idle=2)
    time.sleep(0.5)
    reader.stop.set()
    reader.join(10)
    reader.client.close()
    assert reader.errors == [] and reader.empty == 0 and reader.answers > 20
    assert reader.models == {model.model_id, new.model_id}  # it was answered by both, never left without

    docs = documents_in_milvus(s)  # through the alias: the new collection
    expected = {k: t for k, t in live.items() if t is not None}
    assert set(docs) == set(expected)
    models = {r["model"] for r in MilvusReader.sharing(store, s.milvus_collection).query("", ["model"],
                                                     limit=16384)}
    assert models == {new.model_id}
    # every chunk holds the new model's vector of its span of the newest text
    assert min_cosine_to_direct_encode(new, docs, expected) > cosine_floor(new.precision)
    check_bm25_texts(s, docs, expected)  # and its text, for BM25
    # the backfill read the three bad records again and skipped them: the DLQ holds each once
    assert sorted(m.key() for m in read_topic(s, s.dlq_topic, expect=3)) == [b"bad0", b"bad1", b"bad2"]

    # A day later, a regression: roll back. The fleet (the new model, in the backfill group) wrote
    # updates and deletes the old collection never saw; the rollback catches it up from the group
    # that wrote it (the fleet's first one), compares, and moves the alias back.
    for i in range(0, 40, 5):
        put(i, texts[300 + i] if i % 10 else None)
    producer.flush(30)
    build_worker(s.model_copy(update={"model": new_path, "group_id": group, "sparse": "bm25"}),
                 embedder=new).run(stop_when_idle=1)
    fleet = {**settings_env(s), "COLUMNS": "200", "EMBEDSTREAM_MODEL": new_path, "EMBEDSTREAM_GROUP_ID": group}
    old_path = str(packaged_model_path())
    back = run_cli(["migrate", "--rollback", "--model", old_path], fleet, timeout=300)
    assert back.returncode == 0, back.stdout + back.stderr
    said = " ".join(back.stdout.split())
    assert "migrate --rollback" in said and "catch-up group" in said and f" {s.group_id} on " in said, said
    assert "switched" in said and f"EMBEDSTREAM_GROUP_ID={s.group_id} " in said, said  # never a longer name
    assert store.alias_target(s.milvus_collection) == old_collection
    expected = {k: t for k, t in live.items() if t is not None}
    docs = documents_in_milvus(s)  # through the alias: the old collection, caught up
    assert set(docs) == set(expected)
    assert min_cosine_to_direct_encode(model, docs, expected) > cosine_floor(model.precision)
    # migrating forward again names the backfill group after the fleet's first group, not the one it is in
    forward = run_cli(["migrate", "--model", new_path, "--dry-run"], {**fleet, "EMBEDSTREAM_SPARSE": "bm25"},
                      timeout=180)
    assert forward.returncode == 0 and f"{group} on" in " ".join(forward.stdout.split()), forward.stdout

    again = run_cli(["migrate", "--model", old_path, "--drop-old"], fleet, timeout=180)
    assert again.returncode == 0, again.stderr
    assert "already points" in again.stdout and new_collection in again.stdout
    assert store.collections(s.milvus_collection + "__") == [old_collection, f"{old_collection}_deleted"]
    store.close()


def test_a_backfill_lane_fills_the_new_collection_beside_the_live_one_and_migrate_lane_switches(stack, model,
                                                                                                 tmp_path):
    """`embedstream run` with EMBEDSTREAM_BACKFILL_MODEL: one process writes the live collection with the
    model in use and, in migrate's backfill group, the new model's collection from the topic's start;
    the records that cannot succeed are dead-lettered once (by the live lane). `migrate --lane` starts
    no backfill of its own: it sees the lane caught up, compares, and moves the alias."""
    texts = [d.text for d in sample_documents(40, prefix="lane")]
    s = fresh_settings(stack, partitions=2, compacted_input=True, precision="fp32", max_batch_size=8)
    new_path = str(projected_model(tmp_path / "new-model", dim=128))
    new = load_embedder(s.model_copy(update={"model": new_path}))
    new_collection = versioned_name(s.milvus_collection, new.model_id, new.space_id)
    group = f"{s.group_id}.migrate.{new_collection}"
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5})
    for i, text in enumerate(texts):
        producer.produce(s.input_topic, key=f"d{i}", value=encode_document(Document(f"d{i}", text)))
    for k in range(2):
        producer.produce(s.input_topic, key=f"bad{k}", value=b"not a document {")
    producer.flush(30)

    env = {**settings_env(s), "COLUMNS": "200", "EMBEDSTREAM_BACKFILL_MODEL": new_path,
           "EMBEDSTREAM_BACKFILL_SHARE": "0.5"}
    checked = run_cli(["run", "--check"], env, timeout=180)  # the lane's model loads, and where it would write
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "backfill lane" in checked.stdout and group in " ".join(checked.stdout.split()), checked.stdout
    ran = run_cli(["run", "--stop-when-idle", "0.5"], env, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"done: {len(texts)} embedded" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    lane_line = re.search(rf"backfill lane into {new_collection}: (\d+) embedded .*?(\d+) skipped; (\d+) batches",
                          ran.stderr)
    assert lane_line is not None and int(lane_line.group(1)) == len(texts), ran.stderr
    assert int(lane_line.group(2)) == 2 and int(lane_line.group(3)) > 0, ran.stderr

    store = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    old_collection = store.alias_target(s.milvus_collection)
    assert old_collection not in (None, new_collection)
    expected = {f"d{i}": t for i, t in enumerate(texts)}
    assert set(documents_in_milvus(s)) == set(expected)  # the live lane's, through the alias
    lane_docs = documents_in_milvus(s.model_copy(update={"milvus_collection": new_collection}))
    assert set(lane_docs) == set(expected)
    assert min_cosine_to_direct_encode(new, lane_docs, expected) > cosine_floor(new.precision)
    assert {r["model"] for r in MilvusReader.sharing(store, new_collection).query("", ["model"], limit=1000)} == {
        new.model_id}
    assert sorted(m.key() for m in read_topic(s, s.dlq_topic, expect=2)) == [b"bad0", b"bad1"]  # once each
    assert _committed(s, group) == len(texts) + 2  # the lane's group is at the end of the topic
    # The output topic's readers get the live model alone: the lane publishes nothing by default
    # (EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC unset), so no reader mixes the two vector spaces.
    from schemas.codec import decode_embedding

    out = read_topic(s, s.output_topic, expect=len(texts))
    assert {decode_embedding(m.value())["model"] for m in out} == {model.model_id}, Counter(
        (m.key().decode(), decode_embedding(m.value())["model"]) for m in out)
    assert {m.key().decode() for m in out} == set(expected)

    switched = run_cli(["migrate", "--model", new_path, "--lane"], env, timeout=300)
    assert switched.returncode == 0, switched.stdout + switched.stderr
    assert "backfill lane" in switched.stdout and "switched" in switched.stdout, switched.stdout
    assert "EMBEDSTREAM_BACKFILL_MODEL unset" in switched.stdout, switched.stdout
    canaries = re.search(r"canary cosine \(kept vs its model now\)\W+([\d.]+)\W+([\d.]+)", switched.stdout)
    assert canaries is not None and min(map(float, canaries.groups())) >= 0.95, switched.stdout
    assert store.alias_target(s.milvus_collection) == new_collection
    store.close()
