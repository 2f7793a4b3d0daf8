"""Lag and replicas as KEDA's Kafka scaler computes them."""

from __future__ import annotations

import pytest

from connectors.lag import PartitionLag, desired_replicas, keda_counts_retained, partition_lag


def test_partition_lag_follows_keda_for_missing_commits():
    assert partition_lag(100, 40) == 60
    assert partition_lag(100, 40, "earliest", start=70) == 60  # a commit counts from itself, as in KEDA
    assert partition_lag(100, None, "latest") == 1
    assert partition_lag(100, None, "latest", start=70) == 1
    assert partition_lag(100, None, "earliest") == 100
    assert partition_lag(100, None, "earliest", start=70) == 30  # KEDA 2.21: the retained records only
    assert partition_lag(100, None, "earliest", start=100) == 0
    assert partition_lag(100, None, "earliest", start=70, retained_only=False) == 100  # before 2.21
    assert partition_lag(100, None, "earliest", scale_to_zero_on_invalid_offset=True, start=70) == 0


def test_keda_versions_read_as_their_count():
    assert [keda_counts_retained(v) for v in ("2.21", "2.21.0", "v2.22.1", "3.0", "2.20", "2.20.9", "v2.9")] == [
        True, True, True, True, False, False, False]
    with pytest.raises(ValueError, match="not a KEDA version"):
        keda_counts_retained("latest")


def test_desired_replicas_is_capped_by_partitions():
    lags = [PartitionLag("t", p, 0, 0, lag) for p, lag in enumerate([500, 0, 0, 10])]
    assert desired_replicas(lags, lag_threshold=100) == 4  # ceil(510 / 100) = 6, capped at 4 partitions
    assert desired_replicas(lags, 100, limit_to_partitions_with_lag=True) == 2
    assert desired_replicas(lags, 1000) == 1
    assert desired_replicas(lags, 100, max_replicas=3) == 3
