"""Metrics: lag from librdkafka's statistics, health and readiness."""

from __future__ import annotations

import json

from prometheus_client import REGISTRY

from worker.metrics import Health, record_lag_from_stats


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


def test_health_needs_a_recent_tick_and_readiness_needs_model_and_partitions():
    h = Health(max_tick_age=60)
    assert h.alive() and not h.ready()
    h.model_loaded, h.assigned = True, 2
    assert h.ready()
    h.last_tick -= 61
    assert not h.alive()
