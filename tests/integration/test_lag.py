"""`embedstream lag` against librdkafka's mock cluster, whose ListOffsets is right (unlike Tansu's)."""

from __future__ import annotations

import json
import os

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.lag import PartitionLag, desired_replicas, partition_lag
from tests.helpers import run_cli
from worker.tools.mock_broker import MockCluster

pytestmark = pytest.mark.integration


def test_partition_lag_rules_match_keda():
    assert partition_lag(100, 40) == 60
    assert partition_lag(100, None, "latest") == 1
    assert partition_lag(100, None, "earliest") == 100
    assert partition_lag(100, None, "earliest", scale_to_zero_on_invalid_offset=True) == 0
    lags = [PartitionLag("t", p, 0, 0, lag) for p, lag in enumerate([50, 0, 25, 0])]
    assert desired_replicas(lags, 10) == 4  # ceil(75/10)=8, capped at 4 partitions
    assert desired_replicas(lags, 10, limit_to_partitions_with_lag=True) == 2
    assert desired_replicas(lags, 100) == 1


def test_lag_command_on_a_correct_broker():
    with MockCluster() as mc:
        mc.create_topic("docs", 3)
        p = Producer({"bootstrap.servers": mc.bootstraps, "linger.ms": 20, "batch.num.messages": 7})
        for i in range(90):
            p.produce("docs", key=str(i), value=b"v", partition=i % 3)
        assert p.flush(10) == 0
        c = Consumer({"bootstrap.servers": mc.bootstraps, "group.id": "g1"})
        c.commit(offsets=[TopicPartition("docs", 0, 10), TopicPartition("docs", 1, 30)], asynchronous=False)
        c.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
        env.update(EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS=mc.bootstraps, EMBEDSTREAM_INPUT_TOPIC="docs",
                   EMBEDSTREAM_GROUP_ID="g1")
        res = run_cli(["lag", "--json", "--lag-threshold", "5"], env, timeout=60)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        by_p = {p["partition"]: p for p in out["partitions"]}
        assert [by_p[i]["end_offset"] for i in range(3)] == [30, 30, 30]
        assert [by_p[i]["lag"] for i in range(3)] == [20, 0, 1]  # partition 2: no commit, latest → 1
        assert out["total_lag"] == 21 and out["desired_replicas"] == 3
        res = run_cli(["lag", "--json", "--offset-reset-policy", "earliest"], env, timeout=60)
        assert json.loads(res.stdout)["total_lag"] == 50
        table = run_cli(["lag"], env, timeout=60)
        assert table.returncode == 0 and "total" in table.stdout and "21" in table.stdout
