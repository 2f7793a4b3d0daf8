"""Lag and replicas as KEDA's Kafka scaler computes them."""

from __future__ import annotations

from connectors.lag import PartitionLag, desired_replicas, partition_lag


def test_partition_lag_follows_keda_for_missing_commits():
    assert partition_lag(100, 40) == 60
    assert partition_lag(100, None, "latest") == 1
    assert partition_lag(100, None, "earliest") == 100
    assert partition_lag(100, None, "earliest", scale_to_zero_on_invalid_offset=True) == 0


def test_desired_replicas_is_capped_by_partitions():
    lags = [PartitionLag("t", p, 0, 0, lag) for p, lag in enumerate([500, 0, 0, 10])]
    assert desired_replicas(lags, lag_threshold=100) == 4  # ceil(510 / 100) = 6, capped at 4 partitions
    assert desired_replicas(lags, 100, limit_to_partitions_with_lag=True) == 2
    assert desired_replicas(lags, 1000) == 1
    assert desired_replicas(lags, 100, max_replicas=3) == 3
