"""Metrics and health endpoints after a real stream; three workers sharing six partitions."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from connectors.kafka import make_producer
from connectors.milvus import MilvusReader
from schemas.codec import Document, encode_document
from tests.faults.harness import WorkerProcess, metric_samples, short_docs, wait_until
from tests.helpers import fresh_settings, run_cli, settings_env

pytestmark = pytest.mark.integration


def _value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_move_by_the_right_amounts_and_health_answers(stack, model):
    from worker.assembly.runner import build_worker

    s = fresh_settings(stack, metrics_port="auto", max_batch_size=50)
    # hits are counted exactly below: start from an empty cache, whatever earlier tests stored
    from tools.bench.measure import flush_cache

    flush_cache(s)
    before = {
        "embedded": _value("embedstream_messages_total", outcome="embedded"),
        "deleted": _value("embedstream_messages_total", outcome="deleted"),
        "dead": _value("embedstream_messages_total", outcome="dead_lettered"),
        "dlq_empty": _value("embedstream_dlq_messages_total", reason="empty_text"),
        "hits": _value("embedstream_cache_requests_total", result="hit"),
        "batches": _value("embedstream_batch_size_count"),
        "milvus": _value("embedstream_sink_seconds_count", sink="milvus"),
    }
    docs = short_docs(120, "met")
    p = make_producer(s.kafka_common())
    for d in docs:
        p.produce(s.input_topic, key=d.id, value=encode_document(d))
    for i in range(4):
        p.produce(s.input_topic, key=f"met-empty-{i}", value=encode_document(Document(f"met-empty-{i}", " ")))
    p.produce(s.input_topic, key="met-0", value=None)
    assert p.flush(10) == 0

    worker = build_worker(s, embedder=model)
    port = worker.metrics_port
    assert port  # the system picked it, the worker served on it
    code, body = _get(port, "/readyz")
    assert code == 503 and "not ready" in body  # model loaded, no partitions yet
    assert _get(port, "/healthz")[0] == 200
    seen_ready = []
    worker.on_progress = lambda _st: seen_ready.append(_get(port, "/readyz")[0])
    stats = worker.run(stop_when_idle=2)
    assert 200 in seen_ready
    assert stats.embedded == 120 and stats.deleted == 1 and stats.dead_lettered == 4
    assert _value("embedstream_batch_size_count") - before["batches"] == stats.batches
    # one Milvus write per group of batches the sink took at once
    assert 1 <= _value("embedstream_sink_seconds_count", sink="milvus") - before["milvus"] <= stats.batches

    # a second run: 30 known texts under new ids → exactly 29 cache hits and one miss: met-0 was deleted,
    # and its text left the cache with it (an erasure reaches the cache)
    misses = _value("embedstream_cache_requests_total", result="miss")
    for i, d in enumerate(docs[:30]):
        p.produce(s.input_topic, key=f"met-rep-{i}", value=encode_document(Document(f"met-rep-{i}", d.text)))
    assert p.flush(10) == 0
    s2 = s.model_copy(update={"metrics_port": 0})
    stats2 = build_worker(s2, embedder=model).run(stop_when_idle=2)
    assert stats2.cached == 29
    assert _value("embedstream_cache_requests_total", result="hit") - before["hits"] == 29
    assert _value("embedstream_cache_requests_total", result="miss") == misses + 1

    assert _value("embedstream_messages_total", outcome="embedded") - before["embedded"] == 150
    assert _value("embedstream_messages_total", outcome="deleted") - before["deleted"] == 1
    assert _value("embedstream_messages_total", outcome="dead_lettered") - before["dead"] == 4
    assert _value("embedstream_dlq_messages_total", reason="empty_text") - before["dlq_empty"] == 4
    assert _value("embedstream_model_info", model=model.model_id, precision=model.precision, device="cpu") == 1
    assert _value("embedstream_commit_seconds_count", mode="async") + _value("embedstream_commit_seconds_count",
                                                                             mode="sync") > 0
    assert _value("embedstream_rebalances_total", event="assigned") >= 1
    code, text = _get(port, "/metrics")
    assert code == 200
    for name in ("embedstream_messages_total", "embedstream_batch_size", "embedstream_batch_tokens",
                 "embedstream_embed_seconds", "embedstream_end_to_end_seconds", "embedstream_cache_requests_total",
                 "embedstream_sink_seconds", "embedstream_dlq_messages_total", "embedstream_paused_partitions",
                 "embedstream_consumer_lag", "embedstream_model_info", "embedstream_build_info",
                 "embedstream_rebalances_total", "embedstream_commit_seconds", "embedstream_commit_failures_total",
                 "embedstream_assigned_partitions", "embedstream_model_load_seconds"):
        assert f"# HELP {name}" in text, name
    # the loop has stopped: after the tick age passes, /healthz fails
    worker.health.max_tick_age = 0.5
    time.sleep(0.6)
    assert _get(port, "/healthz")[0] == 503


# Three workers and a 1 s lag gauge, watched in the 10 s each has between its input going idle and its
# exit: a test beside it (two at a time, tools/suite.py) stretched that window past the watch.
@pytest.mark.alone
def test_three_workers_split_six_partitions(stack, model, tmp_path):
    s = fresh_settings(stack, max_batch_size=32)
    # the eager protocol here (the fault suite's rebalance scenario runs cooperative-sticky, the default)
    s.kafka["partition.assignment.strategy"] = "range"
    docs = short_docs(1500, "scale")
    # one record per produce batch, so the local broker's ListOffsets (last batch base + 1) is exact
    p = make_producer(s.kafka_common(), **{"linger.ms": 0, "batch.num.messages": 1})
    for d in docs:
        p.produce(s.input_topic, key=d.id, value=encode_document(d))
    assert p.flush(30) == 0
    # One worker alone first, until its lag gauge has a backlog on all six partitions; then two more
    # join (a rebalance takes four of its partitions). Once everything is consumed, the members' lag
    # series together are the group's lag: each partition reported by its one owner, none left
    # behind by the member that lost it (their values would count the lag twice on a dashboard).
    def lag_by_worker() -> list[list[tuple[int, float]]]:
        out = []
        for w in workers:
            try:
                out.append([(int(x.labels["partition"]), x.value) for x in metric_samples(w.metrics_port())
                            if x.name == "embedstream_consumer_lag" and x.labels.get("topic") == s.input_topic])
            except OSError:  # a worker stopping (idle) as it is asked: this round does not count
                return []
        return out

    def lag_series() -> list[tuple[int, float]]:
        return [x for series in lag_by_worker() for x in series]

    # the lag gauge every second (5 s by default): the members report their share soon after a change
    quick = {"EMBEDSTREAM_METRICS_PORT": "auto", "EMBEDSTREAM_KAFKA__STATISTICS_INTERVAL_MS": "1000"}
    workers = [WorkerProcess(s, tmp_path, "w0", ("--stop-when-idle", "10"), **quick)]
    try:
        wait_until(lambda: len(lag_series()) == 6, 90, what="the first worker's lag on all six partitions")
        workers += [WorkerProcess(s, tmp_path, f"w{i}", ("--stop-when-idle", "10"), **quick) for i in (1, 2)]
        c = Consumer({**s.kafka_common(), "group.id": s.group_id})

        def group_lag() -> int:
            tps = c.committed([TopicPartition(s.input_topic, i) for i in range(6)], timeout=10)
            return sum(c.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0) for tp in tps)

        def members_agree() -> bool:
            # after the rebalance: each of the three reports its own partitions, the one that lost four
            # of them no longer reports those
            by_worker = lag_by_worker()
            series = [x for s in by_worker for x in s]
            return (len(by_worker) == 3 and all(by_worker) and sorted(p for p, _ in series) == list(range(6))
                    and sum(v for _, v in series) == group_lag() == 0)

        wait_until(members_agree, 120, what="the members' lag series to be the group's, once each")
        c.close()
        for w in workers:  # all consumed, committed and reported: stopped now rather than after 10 s idle
            w.terminate()
        for w in workers:
            assert w.wait(60) == 0, w.log()[-3000:]
    finally:
        WorkerProcess.kill_all()
    assigned = []
    for w in workers:
        last = [line for line in w.log().splitlines() if "assigned [" in line]
        assert last, w.log()[-2000:]
        assigned.append(last[-1].split("assigned ")[1])
    parts = [set(json.loads(a)) for a in assigned]
    assert all(parts), assigned  # each worker held partitions at the end
    assert set().union(*parts) == set(range(6))

    rows = MilvusReader(s.milvus_uri, s.milvus_collection).query_ids()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(docs)

    res = run_cli(["lag", "--json"], settings_env(s), timeout=60)
    assert res.returncode == 0, res.stderr
    lag = json.loads(res.stdout)
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    committed = {tp.partition: tp.offset for tp in
                 c.committed([TopicPartition(s.input_topic, i) for i in range(6)], timeout=10)}
    c.close()
    assert {p["partition"]: p["committed"] for p in lag["partitions"]} == committed
    assert sum(committed.values()) == len(docs)
    assert lag["total_lag"] == 0
    table = run_cli(["lag", "--lag-threshold", "100"], settings_env(s), timeout=60)
    assert table.returncode == 0, table.stderr
    rows = [line.split("│") for line in table.stdout.splitlines() if line.count("│") >= 4]
    assert [cells[4].strip() for cells in rows if cells[1].strip() == "total"] == ["0"], table.stdout
    assert "KEDA would ask for 0 replica(s)" in table.stdout
