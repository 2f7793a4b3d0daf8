"""`embedstream lag` against librdkafka's mock cluster, whose ListOffsets is right (unlike Tansu's)."""

from __future__ import annotations

import json
import os

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.conftest import TEST_BROKER
from tests.helpers import run_cli
from tools.mock_broker import MockCluster

pytestmark = pytest.mark.integration


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
        res = run_cli(["lag", "--json", "--lag-threshold", "5", "--offset-reset-policy", "latest"], env, timeout=60)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        by_p = {p["partition"]: p for p in out["partitions"]}
        assert [by_p[i]["end_offset"] for i in range(3)] == [30, 30, 30]
        assert [by_p[i]["lag"] for i in range(3)] == [20, 0, 1]  # partition 2: no commit, latest → 1
        assert out["total_lag"] == 21 and out["desired_replicas"] == 3
        res = run_cli(["lag", "--json"], env, timeout=60)  # earliest, as the chart's KEDA trigger
        assert json.loads(res.stdout)["total_lag"] == 50
        table = run_cli(["lag", "--offset-reset-policy", "latest"], env, timeout=60)
        assert table.returncode == 0 and "total" in table.stdout and "21" in table.stdout


def test_a_drained_transactional_input_reads_lag_0(stack, model):
    """A transactional producer on the input topic: the worker embeds the committed records only (an
    aborted transaction's never), and once drained `embedstream lag` reads 0 with the partitions'
    ends committed, so KEDA can scale the deployment to zero. What the command reads agrees with
    what the broker itself says of the group's committed offsets and the partitions' ends.

    On Kafka a commit marker takes an offset after the last record, which the consumer is never
    handed: the worker commits the partition's end once drained (``test_loop``'s marker test).
    Tansu and the mock cluster give markers no offset; there the end is the last record's + 1."""
    from schemas.codec import Document, encode_document
    from tests.helpers import fresh_settings, read_topic, settings_env
    from worker.assembly.runner import build_worker

    s = fresh_settings(stack, partitions=2, redis_url=None)
    p = Producer({**s.kafka_common(), "transactional.id": f"tx-{s.group_id}"})
    p.init_transactions(30)
    kept: set[str] = set()
    for t, (n, commit) in enumerate(((12, True), (4, False), (6, True))):
        p.begin_transaction()
        for i in range(n):
            doc = Document(f"t{t}-{i}", f"transactional document {i} of transaction {t}")
            p.produce(s.input_topic, key=doc.id.encode(), value=encode_document(doc), partition=i % 2)
            kept |= {doc.id} if commit else set()
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    stats = build_worker(s, embedder=model).run(stop_when_idle=2.0)
    assert stats.embedded == len(kept) == 18
    assert {m.key().decode() for m in read_topic(s, s.output_topic, expect=18, idle=1.0)} == kept

    res = run_cli(["lag", "--json", "--lag-threshold", "5"], settings_env(s), timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["total_lag"] == 0 and out["desired_replicas"] == 0, out
    assert out["partitions"] and all(x["committed"] == x["end_offset"] > 0 for x in out["partitions"]), out

    # the broker's own answers, asked here: ListOffsets(latest) and the group's committed offsets
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import OffsetSpec

    from connectors.kafka import make_admin

    admin = make_admin(s.kafka_common())
    tps = [TopicPartition(s.input_topic, p) for p in range(2)]
    ends = {tp.partition: r.offset for tp, r in
            ((tp, f.result(10)) for tp, f in admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}).items())}
    group = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(s.group_id, tps)])
    committed = {tp.partition: tp.offset for tp in group[s.group_id].result(10).topic_partitions}
    assert {x["partition"]: x["end_offset"] for x in out["partitions"]} == ends
    assert {x["partition"]: x["committed"] for x in out["partitions"]} == committed
    last = {}
    for m in read_topic(s, s.input_topic, expect=18, idle=1.0):
        last[m.partition()] = max(last.get(m.partition(), -1), m.offset())
    if TEST_BROKER == "kafka":  # markers take offsets there: the end lies past the last record
        assert all(ends[p] > last[p] + 1 for p in last), (ends, last)


def test_lag_counts_a_missing_commit_as_the_records_retention_kept(stack):
    """On Apache Kafka, a topic whose first records are gone (deleted as retention deletes a segment:
    the log's start moves up) and a group that committed one partition only: under earliest the
    partition without a commit counts what a consumer starting there can fetch, end − log start, as
    KEDA 2.21 does; ``--keda-version 2.20`` counts its end offset, as KEDA did before."""
    from confluent_kafka.admin import OffsetSpec

    from connectors.kafka import make_admin
    from tests.helpers import fresh_settings, settings_env

    s = fresh_settings(stack, partitions=2, redis_url=None)
    p = Producer(s.kafka_common())
    for i in range(50):
        p.produce(s.input_topic, key=str(i).encode(), value=b"v", partition=i % 2)
    assert p.flush(30) == 0
    admin = make_admin(s.kafka_common())
    cut = {0: 18, 1: 5}
    for f in admin.delete_records([TopicPartition(s.input_topic, q, o) for q, o in cut.items()]).values():
        f.result(30)
    starts = {tp.partition: f.result(10).offset for tp, f in admin.list_offsets(
        {TopicPartition(s.input_topic, q): OffsetSpec.earliest() for q in cut}).items()}
    assert starts == cut  # the broker itself now starts each log past its deleted records
    c = Consumer({**s.kafka_common(), "group.id": s.group_id})
    c.commit(offsets=[TopicPartition(s.input_topic, 1, 20)], asynchronous=False)
    c.close()
    env = settings_env(s)

    def lag(*args: str) -> dict:
        res = run_cli(["lag", "--json", *args], env, timeout=60)
        assert res.returncode == 0, res.stderr
        return {x["partition"]: x["lag"] for x in json.loads(res.stdout)["partitions"]}

    assert lag() == {0: 25 - 18, 1: 25 - 20}
    assert lag("--keda-version", "2.20") == {0: 25, 1: 5}
    assert lag("--offset-reset-policy", "latest") == {0: 1, 1: 5}
    table = run_cli(["lag"], env, timeout=60)
    assert table.returncode == 0 and "log starts at 18" in table.stdout, table.stdout
    bad = run_cli(["lag", "--keda-version", "newest"], env, timeout=60)
    assert bad.returncode == 2 and "2.21" in bad.stderr + bad.stdout
