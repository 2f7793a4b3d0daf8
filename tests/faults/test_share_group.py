"""Share groups (``EMBEDSTREAM_GROUP_TYPE=share``, KIP-932) on Apache Kafka: workers wider than the
topic, a kill -9 among them, and a record that never succeeds.

A share group keeps no per-key order, so the documents arrive in several versions close together and
the check is that Milvus ends at the newest version of every one (the version guard), with nothing
lost. Apache Kafka 4.2 acquires whole record batches for a poll (until ``max.poll.records`` is
reached), so the input here is produced in small batches: one member then cannot take the whole
topic in one poll.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
import uuid

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from connectors.kafka import make_admin
from schemas.codec import Document
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    milvus_hold,
    record_row,
    scrape,
    short_docs,
    wait_until,
    worker_env,
)
from tests.helpers import CLI, fresh_settings, read_topic
from tools.dev import free_port
from worker.commands.produce import document_record, produce_records
from worker.settings import Settings

#: alone: the scenarios time acquisition locks and deliveries, which a test beside them would stretch.
pytestmark = [pytest.mark.faults, pytest.mark.alone, pytest.mark.timeout(600)]

#: Seconds a record stays locked to the member it was delivered to (the share group's own setting):
#: short, so a killed member's records come back soon.
LOCK_MS = 2500


@pytest.fixture(autouse=True)
def _on_kafka():
    from tests.conftest import TEST_BROKER

    if TEST_BROKER != "kafka":
        pytest.skip(f"share groups are Apache Kafka's (KIP-932); the test broker is {TEST_BROKER}")


def _share_settings(fault_stack, lock_ms: int = LOCK_MS, **overrides) -> Settings:
    _, env = fault_stack
    s = fresh_settings(env, partitions=1, group_type="share", kafka={}, max_batch_size=8, max_inflight_batches=2,
                       shutdown_grace_seconds=20, milvus_timeout_seconds=5, retry_backoff_max_seconds=2,
                       **overrides)
    admin = make_admin(s.kafka_common())
    group = ConfigResource(ConfigResource.Type.GROUP, s.group_id, incremental_configs=[
        ConfigEntry("share.record.lock.duration.ms", str(lock_ms), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([group])[group].result(timeout=30)
    return s


def _produce_small_batches(s: Settings, docs: list[Document], expected: Expected, per_batch: int = 4) -> None:
    """``docs`` in record batches of ``per_batch`` (the spread of a share group is a batch: the module
    doc); one batch of all of them when ``per_batch`` is their number (the linger lets them gather)."""
    produce_records(s.kafka_common(), s.input_topic, (document_record(d, stamp=False) for d in docs),
                    **{"batch.num.messages": per_batch, "linger.ms": 2 if per_batch < len(docs) else 500})
    for d in docs:
        expected.good[d.id] = d.text
    expected.records += len(docs)


@pytest.mark.guarantee
def test_four_workers_share_one_partition_end_at_the_newest_versions_and_lose_nothing_to_a_kill_9(
        fault_stack, model, tmp_path):
    s = _share_settings(fault_stack)
    expected = Expected()
    workers = [WorkerProcess(s, tmp_path, f"w{i}", ("--stop-when-idle", "8")) for i in range(4)]
    for w in workers:
        wait_until(lambda w=w: "joining the share group" in w.log(), 120, what=f"{w.log_path.stem} to join")
    base = short_docs(40, "share")
    t0 = time.monotonic()
    # Three versions of every document, each version right after the one before: workers take them
    # in any order, and Milvus must still end at the third.
    for version in range(3):
        _produce_small_batches(s, [Document(d.id, f"{d.text} (version {version})", None, d.metadata)
                                   for d in base], expected)
    wait_until(lambda: len(read_topic(s, s.output_topic, expect=30, idle=0.5)) >= 30, 180,
               what="the first output records")
    workers[0].kill9()  # what it had acquired comes back to the group when its locks run out
    for w in workers[1:]:
        assert w.wait(300) == 0, w.log()[-3000:]
    embedded = []
    for w in workers[1:]:
        done = [line for line in w.log().splitlines() if "done:" in line]
        assert done, w.log()[-2000:]
        embedded.append(int(done[-1].split("done: ")[1].split()[0]))
    # the one partition was read by more members than it has partitions (the killed one's share unknown)
    assert sum(1 for n in embedded if n > 0) >= 2, embedded
    report = check_nothing_lost(s, model, expected, partitions=1, lag=False)
    assert report.documents == 40
    record_row("share 4 on 1 partition", f"3 versions a document, kill -9 of one of 4; embedded {embedded}",
               report, time.monotonic() - t0)


def test_a_record_that_never_finishes_within_its_lock_reaches_the_dlq_after_its_deliveries(fault_stack, model,
                                                                                            caplog):
    """A record whose batch always outlives its lock (a model that stalls on it, crashing nothing) is
    delivered again and again; past ``EMBEDSTREAM_SHARE_MAX_DELIVERIES`` it is dead-lettered
    (``delivery_count_exceeded``) before anything else is done with it, and acknowledged."""
    from worker.assembly.runner import build_worker

    s = _share_settings(fault_stack, share_max_deliveries=2, redis_url=None)
    marker = f"quagmire{uuid.uuid4().hex[:6]}"
    stall_on = set(model.tokenize([marker])[0][1:-1])  # the marker's word pieces

    class StallOnMarker:
        """The real model, stalling past the record lock on any text with the marker in it."""

        def __getattr__(self, name):
            return getattr(model, name)

        def embed_prepared(self, prepared):
            if any(stall_on <= set(ids) for ids in prepared):
                time.sleep(LOCK_MS / 1000 + 1.5)
            return model.embed_prepared(prepared)

    expected = Expected()
    before = _share_metrics()
    worker = build_worker(s, embedder=StallOnMarker())  # type: ignore[arg-type]
    ran: list = []
    runner = threading.Thread(target=lambda: ran.append(worker.run(stop_when_idle=LOCK_MS / 1000 + 4)))
    runner.start()
    _produce_small_batches(s, short_docs(12, "fine"), expected)
    # The records of one poll travel together (a stage takes its waiting batches as one group): the
    # stalling record comes once the others are written, in a poll of its own.
    wait_until(lambda: len(read_topic(s, s.output_topic, expect=12, idle=0.3)) >= 12, 120,
               what="the fine documents")
    poison = Document("poison-1", f"a document that never finishes {marker}", None, {})
    produce_records(s.kafka_common(), s.input_topic, [document_record(poison, stamp=False)])
    expected.records += 1
    expected.bad["poison-1"] = (None, "delivery_count_exceeded")
    runner.join(240)
    stats = ran[0]
    assert stats.dead_lettered == 1
    assert "over half their 2.5s lock: poll fewer at a time" in caplog.text  # the stall was said, with what to do
    dlq = read_topic(s, s.dlq_topic, expect=1, idle=2.0)
    assert [m.key() for m in dlq] == [b"poison-1"]
    headers = dict(dlq[0].headers())
    assert headers["embedstream.error.reason"] == b"delivery_count_exceeded"
    assert b"delivered 3 times" in headers["embedstream.error.message"]
    # what an operator sees of it: the two later deliveries, the acknowledgements past the lock (the two
    # stalled ones at least), the two stalled deliveries released (their lock ran out before the sink
    # came to them: not this member's to write any more), the fine records and the dead letter accepted
    moved = {k: v - before[k] for k, v in _share_metrics().items()}
    assert moved["redeliveries"] == 2 and moved["lock_expiries"] >= 2, moved
    assert moved["accept"] == 12 + 1 and moved["release"] == 2 and moved["reject"] == 0, moved
    assert moved["acknowledged"] == 15 and moved["acknowledged_past_lock"] == moved["lock_expiries"], moved
    # the fine documents are in Milvus; the stalled one never was (each delivery outlived its lock)
    check_nothing_lost(s, model, expected, partitions=1, lag=False)


def _share_metrics() -> dict[str, float]:
    """The share-group series of this process' /metrics registry."""
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    return {"redeliveries": value("embedstream_share_redeliveries_total"),
            "lock_expiries": value("embedstream_share_lock_expiries_total"),
            **{t: value("embedstream_share_acknowledgements_total", type=t) for t in ("accept", "release", "reject")},
            "acknowledged": value("embedstream_share_ack_seconds_count"),
            # (the lock, 2.5 s, is one of the histogram's bounds)
            "acknowledged_past_lock": value("embedstream_share_ack_seconds_count") - value(
                "embedstream_share_ack_seconds_bucket", le=str(LOCK_MS / 1000))}


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
        return reply.read().decode()


def test_the_backlog_kedas_trigger_reads_rises_with_the_input_and_drains_to_zero(fault_stack, model, tmp_path):
    """``embedstream lag --serve`` (what the chart runs for KEDA's metrics-api trigger) on a share group
    no member has joined yet: /backlog and /metrics count every record produced, rise as more
    arrive, and reach 0 once a worker has drained the topic; nothing is lost."""
    from worker.assembly.runner import build_worker

    s = _share_settings(fault_stack)
    port = free_port()
    log = (tmp_path / "backlog.log").open("wb")
    exporter = subprocess.Popen([*CLI, "lag", "--serve", str(port), "--interval", "1"], env=worker_env(s),
                                stdout=log, stderr=subprocess.STDOUT)
    seen: list[int] = []

    def backlog() -> int | None:
        try:
            found = json.loads(_get(port, "/backlog"))["backlog"]
        except OSError:  # not serving yet, or 503 while a read fails
            return None
        seen.append(found)
        return found

    try:
        expected = Expected()
        _produce_small_batches(s, short_docs(40, "backlog"), expected)
        wait_until(lambda: backlog() == 40, 60, what="a backlog of 40")
        _produce_small_batches(s, short_docs(20, "backlog-more"), expected)
        wait_until(lambda: backlog() == 60, 30, what="the backlog to rise to 60")
        total = f'embedstream_share_topic_backlog{{group="{s.group_id}",topic="{s.input_topic}"}} 60.0'
        assert total in _get(port, "/metrics")
        stats = build_worker(s, embedder=model).run(stop_when_idle=3)
        assert stats.embedded == 60
        wait_until(lambda: backlog() == 0, 30, what="the backlog to drain to 0")
        assert total.replace(" 60.0", " 0.0") in _get(port, "/metrics")
        assert max(seen) == 60 and seen[-1] == 0 and seen.index(40) < seen.index(60), seen  # 0 before the first
    finally:
        exporter.terminate()
        assert exporter.wait(15) == 0, (tmp_path / "backlog.log").read_text()[-2000:]
    report = check_nothing_lost(s, model, expected, partitions=1, lag=False)
    assert report.documents == 60


def test_partitions_added_while_a_share_worker_runs_are_written_and_accepted(fault_stack, model, tmp_path):
    """A share member may be handed records of any partition of the topic, those added after it
    started too (no rebalance tells it of them). Their records are written and accepted, not left
    unwritten and released until the broker archives them past its delivery limit."""
    from confluent_kafka.admin import NewPartitions

    s = _share_settings(fault_stack)
    expected = Expected()
    worker = WorkerProcess(s, tmp_path, "w", ("--stop-when-idle", "10"), EMBEDSTREAM_METRICS_PORT="auto")
    port = worker.metrics_port()
    wait_until(lambda: "joining the share group" in worker.log(), 120, what="the worker to join")
    _produce_small_batches(s, short_docs(8, "before"), expected)
    wait_until(lambda: len(read_topic(s, s.output_topic, expect=8, idle=0.3)) >= 8, 120, what="the first documents")
    admin = make_admin(s.kafka_common())
    admin.create_partitions([NewPartitions(s.input_topic, 3)])[s.input_topic].result(timeout=30)
    later = short_docs(30, "after", unseen=True)
    _produce_small_batches(s, later, expected)  # a fresh producer: its keys spread over the three partitions
    spread = {m.partition() for m in read_topic(s, s.input_topic, expect=38, idle=1.0)}
    assert spread == {0, 1, 2}, spread
    wait_until(lambda: len({m.key() for m in read_topic(s, s.output_topic, idle=0.5)}) >= 38, 120,
               what="the documents of the added partitions on the output topic")
    assert scrape(port, "embedstream_share_acknowledgements_total", type="release") == 0
    worker.terminate()  # every record is written: a graceful stop sends the last acknowledgements
    assert worker.wait(60) == 0, worker.log()[-3000:]
    report = check_nothing_lost(s, model, expected, partitions=3, lag=False)
    assert report.documents == 38
    record_row("share, partitions added", "1 → 3 partitions under a running share worker", report, None)


def test_a_lock_that_expires_while_its_holder_writes_loses_nothing(fault_stack, model, tmp_path):
    """Member a reads the versions Milvus holds for its records, and the answer is held on the way back
    (``tools.grpc_hold``) past the records' lock: the group hands them to b, which writes them, and then
    the next version of each. When a gets its answer (older than what Milvus holds by then) the records
    are no longer its own: it writes none of them and releases them, so Milvus ends at the newest
    versions with nothing lost."""
    s = _share_settings(fault_stack, redis_url=None)
    expected = Expected()
    base = short_docs(8, "lock")
    with milvus_hold(fault_stack[1]) as (hold, through_hold):
        a = WorkerProcess(s, tmp_path, "a", EMBEDSTREAM_METRICS_PORT="auto", **through_hold)
        port = a.metrics_port()
        wait_until(lambda: "joining the share group" in a.log(), 120, what="a to join")
        hold.arm("Query")
        # one record batch: a's first poll holds all 8 (two batches of 4 could reach it in two polls, the
        # second after its locks ran out, and b would take those 4 from the start)
        _produce_small_batches(s, [Document(d.id, f"{d.text} (version 1)", None, d.metadata) for d in base], expected,
                               per_batch=8)
        assert hold.held.wait(60), f"a read no versions in 60 s: {hold.calls}"
        b = WorkerProcess(s, tmp_path, "b")
        # a's locks run out; b is handed the records and writes them, then their next versions
        wait_until(lambda: len(read_topic(s, s.output_topic, expect=8, idle=0.3)) >= 8, 120,
                   what="b to write the records whose locks a lost")
        _produce_small_batches(s, [Document(d.id, f"{d.text} (version 2)", None, d.metadata) for d in base], expected)
        wait_until(lambda: len(read_topic(s, s.output_topic, expect=16, idle=0.3)) >= 16, 120,
                   what="b to write the next versions")
        hold.release()
        wait_until(lambda: scrape(port, "embedstream_share_ack_seconds_count") >= 8, 60,
                   what="a to finish the records it held")
        released = scrape(port, "embedstream_share_acknowledgements_total", type="release")
        for w in (a, b):
            w.terminate()
        for w in (a, b):
            assert w.wait(60) == 0, w.log()[-3000:]
    report = check_nothing_lost(s, model, expected, partitions=1, lag=False)
    assert report.documents == 8
    assert released == 8, f"a released {released} of the 8 records whose locks it lost"
    record_row("share, lock lost while writing", "a's versions read held past the 2.5 s lock; b wrote 2 versions",
               report, None)


def test_a_record_released_inside_the_lock_margin_comes_back_at_once(fault_stack, model, tmp_path):
    """The fence gives a poll's records up a little before the broker's lock runs out (a second, of
    the 10 s lock here): a member that gets its version read's answer inside that margin writes none
    of them and releases them while the broker still takes its word. Released, they are delivered
    again at once and written; accepted unwritten, they would be lost."""
    s = _share_settings(fault_stack, lock_ms=10_000, redis_url=None)
    expected = Expected()
    with milvus_hold(fault_stack[1]) as (hold, through_hold):
        a = WorkerProcess(s, tmp_path, "a", EMBEDSTREAM_METRICS_PORT="auto", **through_hold)
        port = a.metrics_port()
        wait_until(lambda: "joining the share group" in a.log(), 120, what="a to join")
        # one document first: a's producer has its id and the broker's coordinators are loaded, so that
        # nothing but the held answer stands between the poll and the acknowledgement
        _produce_small_batches(s, short_docs(1, "warm"), expected)
        wait_until(lambda: len(read_topic(s, s.output_topic, expect=1, idle=0.3)) >= 1, 60, what="the first document")
        hold.arm("Query")
        _produce_small_batches(s, short_docs(4, "margin", unseen=True), expected)  # one record batch: one poll
        assert hold.held.wait(60), f"a read no versions in 60 s: {hold.calls}"
        held_at = time.monotonic()
        time.sleep(9.05)  # past the fence's 9 s from the poll (just before), before the broker's 10 s
        hold.release()
        answered_after = time.monotonic() - held_at
        # the group hands them out again (to a: the only member), and a writes them this time
        wait_until(lambda: len(read_topic(s, s.output_topic, expect=5, idle=0.3)) >= 5, 60,
                   what="the released records written")
        released = scrape(port, "embedstream_share_acknowledgements_total", type="release")
        redelivered = scrape(port, "embedstream_share_redeliveries_total")
        a.terminate()
        assert a.wait(60) == 0, a.log()[-3000:]
    assert answered_after < 10.0, f"the read answered {answered_after:.1f}s after it was held: past the broker's lock"
    assert released == 4 and redelivered >= 4, (released, redelivered)
    report = check_nothing_lost(s, model, expected, partitions=1, lag=False)
    record_row("share, released inside the margin", f"a's versions read held {answered_after:.1f}s of a 10 s lock",
               report, None)
