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
    short_docs,
    wait_until,
)
from tests.helpers import read_topic
from worker.tools.dev import free_port

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_broker_frozen(fs, model, parts, tmp_path):
    expected = Expected()
    produce_docs(fs, short_docs(2500, "brk"), expected)
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "4"))
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    with frozen(parts["broker"]):
        time.sleep(15)
    t0 = time.monotonic()
    recovery = wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.5 * expected.records, 120,
                          what="progress after the broker came back")
    assert w.wait(300) == 0, w.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    record_row("2 broker frozen", "SIGSTOP broker 15 s", report, recovery)
    assert time.monotonic() - t0 < 300


def test_milvus_frozen_pauses_and_commits_nothing(fs, model, parts, tmp_path):
    expected = Expected()
    produce_docs(fs, short_docs(2500, "mil"), expected)
    port = free_port()
    w = WorkerProcess(fs, tmp_path, "w", ("--stop-when-idle", "4"), EMBEDSTREAM_METRICS_PORT=str(port))
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.2 * expected.records, 180, what="20% committed")
    retries_before = scrape(port, "embedstream_retries_total", system="milvus")
    with frozen(parts["milvus"]):
        time.sleep(3)  # a batch that was past Milvus when the freeze began may still commit
        during_start = committed_total(fs, PARTITIONS)
        time.sleep(14)
        during_end = committed_total(fs, PARTITIONS)
        retries = scrape(port, "embedstream_retries_total", system="milvus") - retries_before
        paused = scrape(port, "embedstream_paused_partitions")
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
    record_row("3 Milvus frozen", "SIGSTOP Milvus 17 s", report, recovery)


def test_redis_frozen_then_back(fs, model, parts, tmp_path):
    expected = Expected()
    docs = short_docs(2400, "red")
    produce_docs(fs, docs[:1200], expected)
    port = free_port()
    w = WorkerProcess(fs, tmp_path, "w", EMBEDSTREAM_METRICS_PORT=str(port))
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
