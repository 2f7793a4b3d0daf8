"""Metrics: lag from librdkafka's statistics, health and readiness."""

from __future__ import annotations

import json

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from worker.process.metrics import BatchHistogram, Health, record_lag_from_stats


def _lag(topic: str, partition: str) -> float | None:
    return REGISTRY.get_sample_value("embedstream_consumer_lag", {"topic": topic, "partition": partition})


def test_lag_comes_from_assigned_partitions_only():
    stats = {"topics": {"lagtopic": {"partitions": {
        "0": {"fetch_state": "active", "consumer_lag": 12},
        "1": {"fetch_state": "none", "consumer_lag": 99},
        "2": {"fetch_state": "active", "consumer_lag": -1},
        "-1": {"fetch_state": "active", "consumer_lag": 5},
    }}}}
    record_lag_from_stats(json.dumps(stats))
    assert _lag("lagtopic", "0") == 12
    assert _lag("lagtopic", "1") is None and _lag("lagtopic", "2") is None and _lag("lagtopic", "-1") is None
    record_lag_from_stats("not json")  # ignored, never raises


def test_a_revoked_partitions_lag_is_dropped_so_a_sum_over_members_counts_it_once():
    """After a rebalance the new owner reports the partition: the old one's series goes, at the
    revoke (forget_lag, from the loop) and whenever librdkafka still lists it as not desired."""
    from worker.process.metrics import forget_lag

    record_lag_from_stats(json.dumps({"topics": {"moving": {"partitions": {
        "0": {"fetch_state": "active", "consumer_lag": 7, "desired": True},
        "1": {"fetch_state": "active", "consumer_lag": 3, "desired": True}}}}}))
    assert _lag("moving", "0") == 7 and _lag("moving", "1") == 3
    forget_lag("moving", [0, 5])  # 5 never had a series: no error
    assert _lag("moving", "0") is None and _lag("moving", "1") == 3
    record_lag_from_stats(json.dumps({"topics": {"moving": {"partitions": {
        "1": {"fetch_state": "stopped", "consumer_lag": 3, "desired": False}}}}}))
    assert _lag("moving", "1") is None


def test_health_needs_a_recent_tick_and_readiness_needs_model_and_partitions():
    h = Health(max_tick_age=60)
    assert h.alive() and not h.ready()
    h.model_loaded, h.assigned = True, 2
    assert h.ready()
    h.last_tick -= 61
    assert not h.alive()


def test_a_batch_histogram_exposes_what_a_histogram_observing_one_value_at_a_time_does():
    """Same buckets (a value on a bound counts in it), count and sum, same exposition text."""
    values = [0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 2.5, 59.9, 60.0, 61.0, 1e9]
    values += list(np.random.default_rng(0).exponential(2.0, 500))
    buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batched = BatchHistogram("h_seconds", "doc", buckets, registry=ours)
    single = Histogram("h_seconds", "doc", buckets=buckets, registry=theirs)
    batched.observe_many(values[:7])
    batched.observe_many([])
    batched.observe(values[7])
    batched.observe_many(np.array(values[8:]))
    for v in values:
        single.observe(v)

    def samples(reg):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for m in reg.collect() for s in m.samples if not s.name.endswith("_created")}

    got, want = samples(ours), samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    text = [ln for ln in generate_latest(ours).decode().splitlines() if "_sum" not in ln]
    assert text == [ln for ln in generate_latest(theirs).decode().splitlines()
                    if "_sum" not in ln and "_created" not in ln]


def test_idle_connections_cannot_hold_the_metrics_server():
    """A connection silent past the timeout is closed, and past the bound on connections a new one is
    closed at once: idle clients never hold a thread each (200 idle ones held 200 threads before)."""
    import socket
    import threading
    import time
    import urllib.request

    from worker.process.metrics import serve_answers

    server = serve_answers(0, lambda path: (200, "text/plain", b"ok"), "127.0.0.1", timeout=1.0, limit=4)
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/metrics"
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    deadline = time.monotonic() + 5
    while threading.active_count() < before + 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threading.active_count() >= before + 4  # the four idle ones hold every slot
    try:
        refused = urllib.request.urlopen(url, timeout=5).read()
    except Exception as exc:  # closed at once: no answer
        refused = exc
    assert not isinstance(refused, bytes), "a fifth connection was served past the bound"
    for s in idle:
        s.settimeout(10)
        assert s.recv(1) == b""  # closed by the server after its second of silence
    assert urllib.request.urlopen(url, timeout=5).read() == b"ok"  # slots free again
    server.shutdown()
    for s in idle:
        s.close()
