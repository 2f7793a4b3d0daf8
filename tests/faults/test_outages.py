"""Scenarios 2, 3 and 4: the broker, Milvus or Redis stops answering, then comes back."""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_total,
    frozen,
    produce_docs,
    record_row,
    scrape,
    sessions_s,
    short_docs,
    wait_until,
)
from tests.helpers import document_schema_with, documents_in_milvus, read_topic, registry_serializer
from worker.commands.produce import produce_records

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_broker_frozen(fs, model, parts, tmp_path):
    expected = Expected()
    produce_docs(fs, short_docs(2500, "brk"), expected)
    # Without the cache every text is embedded, so the stream outlasts the start of the freeze (with
    # the texts hot from earlier scenarios it could be over first, and the test would prove nothing).
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "4"), EMBEDSTREAM_REDIS_URL="")
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    at_freeze = committed_total(fs, PARTITIONS)
    # three group sessions: the member's session lapses on the broker, every connection of the worker
    # sees the broker stop answering mid-stream
    freeze_s = sessions_s(fs)
    with frozen(parts["broker"]):
        time.sleep(freeze_s)
    assert at_freeze < 0.5 * expected.records, f"{at_freeze} committed before the freeze: it did not land mid-stream"
    t0 = time.monotonic()
    recovery = wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.5 * expected.records, 120,
                          what="progress after the broker came back")
    assert w.wait(300) == 0, w.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    record_row("2 broker frozen", f"SIGSTOP broker {freeze_s:.0f} s", report, recovery)
    assert time.monotonic() - t0 < 300


def test_milvus_frozen_pauses_and_commits_nothing(fs, model, parts, tmp_path):
    expected = Expected()
    produce_docs(fs, short_docs(2500, "mil"), expected)
    # Two batches in flight (512 documents) instead of 8 (2,048): with the texts hot in the cache the
    # 80 % left at the freeze once fitted in the default pipeline, and nothing needed pausing.
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "4"), EMBEDSTREAM_METRICS_PORT="auto",
                      EMBEDSTREAM_MAX_INFLIGHT_BATCHES="2")
    port = w.metrics_port()
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    retries_before = scrape(port, "embedstream_retries_total", system="milvus")
    t0 = time.monotonic()
    with frozen(parts["milvus"]):
        time.sleep(3)  # a batch that was past Milvus when the freeze began may still commit
        during_start = committed_total(fs, PARTITIONS)
        # down until the worker has retried Milvus and, its pipeline full, paused the partitions
        wait_until(lambda: scrape(port, "embedstream_retries_total", system="milvus") > retries_before
                   and scrape(port, "embedstream_paused_partitions") > 0, 60,
                   what="the worker to retry Milvus and pause its partitions")
        during_end = committed_total(fs, PARTITIONS)
        retries = scrape(port, "embedstream_retries_total", system="milvus") - retries_before
        paused = scrape(port, "embedstream_paused_partitions")
    down_s = time.monotonic() - t0
    assert during_end == during_start, "offsets were committed while Milvus was down"
    assert retries >= 1, "the worker never retried Milvus during the outage"
    assert paused > 0, "the partitions were not paused while the pipeline could not drain"
    recovery = wait_until(lambda: committed_total(fs, PARTITIONS) > during_end, 120,
                          what="progress after Milvus came back")
    assert w.wait(300) == 0, w.log()[-3000:]
    log = w.log()
    assert "lost [" not in log, "partitions were lost (max.poll.interval exceeded?)"
    assert log.count("assigned [") == 1, "the worker was rebalanced during the outage"
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.dead_lettered == 0
    record_row("3 Milvus frozen", f"SIGSTOP Milvus {down_s:.0f} s", report, recovery)


def test_redis_frozen_then_back(fs, model, parts, tmp_path):
    expected = Expected()
    docs = short_docs(2400, "red")
    produce_docs(fs, docs[:1200], expected)
    w = WorkerProcess(fs, tmp_path, "w", EMBEDSTREAM_METRICS_PORT="auto")
    port = w.metrics_port()
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 300, 180, what="300 committed")
    with frozen(parts["redis"]):
        produce_docs(fs, docs[1200:], expected)
        wait_until(lambda: committed_total(fs, PARTITIONS) >= expected.records, 240,
                   what="everything committed while Redis is frozen")
    # Redis is back: the same texts under new ids come from the cache again.
    again = [d.__class__(f"again-{i}", d.text) for i, d in enumerate(docs[:200])]
    produce_docs(fs, again, expected)
    wait_until(lambda: committed_total(fs, PARTITIONS) >= expected.records, 120, what="repeats committed")
    cache_errors = scrape(port, "embedstream_cache_requests_total", result="error")
    w.terminate()
    assert w.wait(60) == 0, w.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.dead_lettered == 0
    from schemas.codec import decode_embedding

    cached = [decode_embedding(m.value())["cached"] for m in read_topic(fs, fs.output_topic)
              if m.value() is not None and m.key().decode().startswith("again-")]
    assert len(cached) >= 200 and sum(cached) >= 190, f"{sum(cached)} of {len(cached)} repeats were cache hits"
    assert cache_errors > 0, "no cache lookup failed while Redis was frozen: was it frozen at all?"
    record_row("4 Redis frozen", "SIGSTOP Redis while 1,200 docs stream", report, None)


def test_registry_frozen_holds_framed_records_and_dead_letters_none(fs, model, parts, fault_stack, tmp_path):
    """Framed records of a schema id the worker has not seen yet arrive while the registry is frozen:
    the worker holds them (never a DLQ), and takes them once it answers."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from worker.commands.wire import document_encoder

    _, env = fault_stack
    s = fs.model_copy(update={"schema_registry_url": env["EMBEDSTREAM_SCHEMA_REGISTRY_URL"]})
    expected = Expected()
    docs = short_docs(1000, "reg")
    produce_docs(s, docs[:500], expected, encode=document_encoder("avro-registry", s, s.input_topic))
    # Version 2 of the schema: registered (and its frames built) now, first seen by the worker mid-freeze.
    v2 = registry_serializer(SchemaRegistryClient({"url": s.schema_registry_url}),
                     document_schema_with(name="lang", type=["null", "string"], default=None), s.input_topic)
    late = {d.id: v2({"id": d.id, "text": d.text, "metadata": d.metadata, "lang": "en"}) for d in docs[500:]}
    w = WorkerProcess(s, tmp_path, "w", ("--stop-when-idle", "4"))
    wait_until(lambda: committed_total(s, PARTITIONS) >= 250, 180, what="250 committed")
    with frozen(parts["registry"]):
        produce_records(s.kafka_common(), s.input_topic, late.items())
        for d in docs[500:]:
            expected.good[d.id] = d.text
        expected.records += len(late)
        time.sleep(8)  # past one request timeout (5 s): the worker has held the records at least once
        held = committed_total(s, PARTITIONS)
    assert held < expected.records, "everything was committed while the registry was frozen"
    recovery = wait_until(lambda: committed_total(s, PARTITIONS) >= expected.records, 120,
                          what="the held records taken after the registry came back")
    assert w.wait(300) == 0, w.log()[-3000:]
    assert "holding" in w.log(), "the worker never waited for the registry: was it frozen at all?"
    report = check_nothing_lost(s, model, expected, PARTITIONS)
    assert report.dead_lettered == 0
    record_row("3-4 registry frozen", "SIGSTOP registry while 500 framed v2 docs arrive", report, recovery)


def test_a_collection_dropped_under_the_worker_is_made_again_and_nothing_dead_lettered(fs, model, tmp_path):
    """Milvus answering "collection not found" is an outage of the collection, not a refusal of the
    records (newer servers mark it as the caller's error): the worker prepares the collection again
    (created, behind its alias, its canary kept) and writes on; it never splits a group or
    dead-letters a document for it."""
    from pymilvus import MilvusClient

    before = Expected()
    produce_docs(fs, short_docs(200, "drop-a"), before)
    w = WorkerProcess(fs, tmp_path, "w")
    wait_until(lambda: committed_total(fs, PARTITIONS) >= before.records, 180, what="the first documents committed")
    client = MilvusClient(uri=fs.milvus_uri, timeout=30)
    target = client.describe_alias(fs.milvus_collection)["collection_name"]
    client.drop_alias(fs.milvus_collection)
    client.drop_collection(target)
    assert not client.has_collection(target)
    after = Expected()
    produce_docs(fs, short_docs(200, "drop-b"), after)
    wait_until(lambda: committed_total(fs, PARTITIONS) >= before.records + after.records, 180,
               what="the documents after the drop committed")
    w.terminate()
    assert w.wait(60) == 0, w.log()[-3000:]
    assert "preparing it again" in w.log()
    assert client.has_collection(target) and client.describe_alias(fs.milvus_collection)["collection_name"] == target
    client.close()
    assert read_topic(fs, fs.dlq_topic, idle=1.0) == []
    assert {f"drop-b-{i}" for i in range(200)} <= set(documents_in_milvus(fs))
