"""Scenario 11: a zombie member. A worker is frozen (SIGSTOP: a long GC pause, a stalled node) past
its session timeout while it has batches in flight; another member takes its partitions over and
writes newer versions (and tombstones) of the same ids; then the frozen one wakes. It must write
nothing old: every Milvus row at its newest version, nothing deleted back, and no reader of the
output topic from the beginning ever sees an older version of a key after a newer one."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest

from schemas.codec import Document, decode_embedding
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_reader,
    committed_total,
    frozen,
    milvus_hold,
    produce_docs,
    produce_tombstones,
    record_row,
    scrape,
    wait_until,
)
from tests.helpers import fresh_settings, read_topic
from tools.corpus import stdlib_docstrings

#: alone: each scenario times a frozen member against its group session and a broker round trip.
pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.alone]


#: No cache: every run embeds the same docstrings, and cached vectors would drain the backlog in a
#: blink, leaving nothing in flight when the freeze lands. Small batches and few of them in flight:
#: offsets are committed in small steps, so each run freezes at a point of its own.
_SETTINGS = dict(max_batch_size=16, max_inflight_batches=2, commit_interval_ms=0, shutdown_grace_seconds=10,
                 redis_url=None)


def _two_versions(n: int, prefix: str) -> tuple[list[Document], list[Document]]:
    """Version 1 and version 2 of the same ``n`` ids, with different texts: whole docstrings of 300
    to 1,200 characters, slow enough to embed that a freeze lands while batches are in flight."""
    texts = [doc for _, doc in stdlib_docstrings() if 300 <= len(doc) <= 1200][: 2 * n]
    v1 = [Document(f"{prefix}-{i}", t, None, {"version": "1"}) for i, t in enumerate(texts[:n])]
    v2 = [Document(d.id, t, None, {"version": "2"}) for d, t in zip(v1, texts[n:])]
    return v1, v2


def _trickle(s, docs: list[Document], expected: Expected, per: int = 25, every: float = 0.08) -> threading.Thread:
    """Produce ``docs`` a few at a time (a stream, not a backlog): a stage takes every batch waiting
    in its queue as one group, so a backlog is done in two or three large groups and every run
    froze at the same point (496 of 600 committed)."""
    def feed() -> None:
        for i in range(0, len(docs), per):
            produce_docs(s, docs[i:i + per], expected)
            time.sleep(every)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    return t


def _assert_never_backwards(s, v1: list[Document], v2: list[Document], deleted: set[str]) -> int:
    """Per key, in the order a reader from the beginning sees the output topic: versions by their
    input offset (version 1's records before version 2's on the one partition of a key), then the
    tombstone, never back. Returns how many records the topic holds."""
    seen: dict[str, float] = {}
    out = read_topic(s, s.output_topic, idle=2.0)
    for m in out:  # read_topic keeps each partition's order, and a key lives in one partition
        key = m.key().decode()
        version = float("inf") if m.value() is None else decode_embedding(m.value())["source_offset"]
        assert version >= seen.get(key, -1), f"{key}: the version at offset {version} after {seen[key]}"
        seen[key] = version
    assert {k for k, v in seen.items() if v == float("inf")} == deleted
    assert set(seen) == {d.id for d in v1} | {d.id for d in v2}
    return len(out)


def _fenced(port: int) -> float:
    """What the fence stopped in the woken worker: records left to the new owner, plus groups held
    back by the expired lease."""
    return (scrape(port, "embedstream_fenced_records_total")
            + scrape(port, "embedstream_retries_total", system="fence"))


def _newer_versions_while_frozen(s, zombie: WorkerProcess, expected: Expected, v2: list[Document], partitions: int,
                                 taken_over, port: int | None = None) -> tuple[list[str], float]:
    """Freeze ``zombie``; once ``taken_over()``, produce version 2 and tombstones for a tenth of the ids
    and wait until the others drained them; wake it. Returns the tombstoned ids, and the batches the
    zombie had in flight just before it froze (from its metrics at ``port``; 0 without one)."""
    inflight = scrape(port, "embedstream_inflight_batches") if port is not None else 0.0
    os.kill(zombie.proc.pid, signal.SIGSTOP)
    try:
        wait_until(taken_over, 120, what="the others to take the frozen member's partitions over")
        produce_docs(s, v2, expected)
        gone = [d.id for d in v2[::10]]
        produce_tombstones(s, gone, expected, existing=set(gone))
        wait_until(lambda: committed_total(s, partitions) >= expected.records, 240, what="version 2 drained")
    finally:
        os.kill(zombie.proc.pid, signal.SIGCONT)
    for d in v2:
        expected.good[d.id] = d.text  # the newest version is what Milvus must hold
    return gone, inflight


def _stop_and_check(s, model, workers: list[WorkerProcess], port: int, expected: Expected, v1, v2, gone,
                    partitions: int) -> tuple:
    # the woken worker: its beat thread sees the stall and closes the fence; its loop learns of the
    # loss or proves its membership before writes resume (the caller says whether the fence must
    # have held something back: in the rebalance of three, a revoke may drain what was in flight)
    zombie = workers[0]
    wait_until(lambda: "stalled for" in zombie.log(), 60, what="the woken worker to see its stall")
    wait_until(lambda: "membership re-validated" in zombie.log(), 90, what="the woken worker to re-validate")
    # every batch it had in flight finished (written or held back by its fence) before the check
    wait_until(lambda: scrape(port, "embedstream_inflight_batches") == 0, 60,
               what="the woken worker's batches in flight to finish")
    fenced = int(_fenced(port))
    for w in workers:
        w.terminate()
    for w in workers:
        assert w.wait(60) == 0, w.log()[-3000:]
    report = check_nothing_lost(s, model, expected, partitions)
    records = _assert_never_backwards(s, v1, v2, set(gone))
    assert records >= len(v1) + len(v2) + len(gone)
    return report, fenced


@pytest.mark.guarantee
@pytest.mark.parametrize(("freeze_at", "protocol"), [(0.15, "classic"), (0.5, "consumer")],
                         ids=["0.15 classic", "0.5 KIP-848"])
def test_a_frozen_member_writes_nothing_old_when_it_wakes(fault_stack, model, tmp_path, freeze_at, protocol):
    """At two freeze points, the second under KIP-848's protocol (the broker keeps the session and
    moves the frozen member's partition when it runs out; the member learns of it from its
    heartbeat's answer when it wakes) and with ``EMBEDSTREAM_SPARSE=bm25`` (the fence holds the rows'
    texts back as well)."""
    kip_848 = protocol == "consumer"
    _frozen_member(fault_stack, model, tmp_path, freeze_at, "11 zombie member" + (", KIP-848" if kip_848 else ""),
                   group_protocol=protocol, sparse="bm25" if kip_848 else "off")


def _frozen_member(fault_stack, model, tmp_path, freeze_at: float, row: str, **settings) -> None:
    """a owns the one partition, b waits beside it; a is frozen past its session with batches in flight,
    b takes over and writes version 2 (and tombstones); a wakes: nothing old written, and its fence held
    what it had in flight."""
    _, env = fault_stack
    s = fresh_settings(env, partitions=1, **_SETTINGS, **settings)
    expected = Expected()
    # freezes 30 and 100 documents in (was 400: ~50 s a run more to drain and check; a third point at 160 is
    # left to the scenario that freezes a member at the one moment only the fence can cover)
    n = 200
    v1, v2 = _two_versions(n, f"z{int(freeze_at * 100)}")
    a, port, b = _a_owns_b_waits(s, tmp_path)
    with committed_reader(s, 1) as committed:
        feeder = _trickle(s, v1, expected)  # version 1 for a alone
        # frozen with batches in the pipeline: the fence then has something to hold back when a wakes
        wait_until(lambda: committed() >= freeze_at * n and scrape(port, "embedstream_inflight_batches") >= 1,
                   180, every=0.01, what=f"{freeze_at:.0%} committed, with batches in flight")
        frozen_at = committed()  # the freeze follows at once
    # version 2 only once version 1 is all produced (the feeder ends seconds before the takeover)
    gone, _ = _newer_versions_while_frozen(s, a, expected, v2, 1,
                                           lambda: not feeder.is_alive() and "assigned [0]" in b.log())
    report, fenced = _stop_and_check(s, model, [a, b], port, expected, v1, v2, gone, 1)
    assert fenced >= 1, "a froze with batches in flight, yet its fence held nothing back when it woke"
    record_row(row, f"SIGSTOP a at {frozen_at}/{n} committed, past the session; fence held {fenced} "
               "records/groups", report, None)


def _a_owns_b_waits(s, tmp_path, both: dict[str, str] | None = None,
                    **a_env: str) -> tuple[WorkerProcess, int, WorkerProcess]:
    """Worker a (its metrics on the returned port) owning the one partition, and b a member beside it
    with nothing to do; ``both``: the environment of both."""
    a = WorkerProcess(s, tmp_path, "a", EMBEDSTREAM_METRICS_PORT="auto", **(both or {}), **a_env)
    port = a.metrics_port()
    wait_until(lambda: "assigned [0]" in a.log(), 120, what="a to own the partition")
    b = WorkerProcess(s, tmp_path, "b", **(both or {}))
    if s.group_protocol == "consumer":  # KIP-848 calls back only on a change: b, given nothing, says nothing
        from connectors.kafka import make_admin

        admin = make_admin(s.kafka_common())  # kept: a collected admin client never answers its futures
        wait_until(lambda: len(admin.describe_consumer_groups([s.group_id], request_timeout=10)[s.group_id]
                               .result(timeout=30).members) == 2, 120, what="b to be a member of the group")
    else:
        wait_until(lambda: "assigned [" in b.log(), 120, what="b to join (with nothing to do)")
    return a, port, b


@pytest.mark.parametrize("answered", ["on waking", "once re-validated"])
def test_a_member_frozen_between_its_version_read_and_its_write_writes_nothing_old(fault_stack, model, tmp_path,
                                                                                     parts, answered):
    """a's read of the versions Milvus holds reaches the server, and its answer is held on the way
    back (``tools.grpc_hold``) while a is frozen past its session; b takes over and writes version 2
    and tombstones; a gets the answer, older than what Milvus now holds. The version guard has done
    its read: only the fence can keep version 1 out.

    * ``on waking``: the answer is there the moment a wakes, and the broker holds still for a
      moment then: under KIP-848 a's polling thread learns of the loss only from the broker's answer
      to its heartbeat, so the sink has its answer first, and only the lease (run out while a was
      frozen) holds the group back.
    * ``once re-validated``: the answer comes only after a re-validated its membership, with its
      lease renewed: only ownership holds it back (the partition is b's, or a's again under a new
      tenure). The fence asks again after the reads for that reason."""
    _, env = fault_stack
    protocol = {"group_protocol": "consumer"} if answered == "on waking" else {}
    s = fresh_settings(env, partitions=1, **_SETTINGS, **protocol)
    expected = Expected()
    n = 100
    v1, v2 = _two_versions(n, "zr" + answered[0])
    with milvus_hold(env) as (hold, through_hold):
        a, port, b = _a_owns_b_waits(s, tmp_path, **through_hold)
        with committed_reader(s, 1) as committed:
            feeder = _trickle(s, v1, expected)
            wait_until(lambda: committed() >= 0.3 * n, 180, every=0.05, what="30% of version 1 committed")
        hold.arm("Query")
        assert hold.held.wait(60), f"a read no versions in 60 s: {hold.calls}"
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not feeder.is_alive() and "assigned [0]" in b.log(), 120,
                       what="b to take the frozen member's partition over")
            produce_docs(s, v2, expected)
            gone = [d.id for d in v2[::10]]
            produce_tombstones(s, gone, expected, existing=set(gone))
            wait_until(lambda: committed_total(s, 1) >= expected.records, 240, what="version 2 drained")
        finally:
            if answered == "on waking":
                with frozen(parts["broker"]):
                    hold.release()
                    os.kill(a.proc.pid, signal.SIGCONT)
                    time.sleep(1.5)
            else:
                os.kill(a.proc.pid, signal.SIGCONT)
        for d in v2:
            expected.good[d.id] = d.text
        if answered == "once re-validated":
            wait_until(lambda: "membership re-validated" in a.log(), 90, what="a to re-validate")
            hold.release()
        report, fenced = _stop_and_check(s, model, [a, b], port, expected, v1, v2, gone, 1)
    assert fenced >= 1, "a's held group was older than Milvus when it came back, yet its fence held nothing back"
    record_row(f"11 zombie, read answered {answered}", f"a's versions read held, SIGSTOP past the session; fence "
               f"held {fenced} records/groups; {hold.pings_answered} keep-alive pings answered", report, None)


def test_a_member_frozen_with_a_transaction_open_writes_nothing_visible(fault_stack, model, tmp_path):
    """Under exactly-once: a's group has its output records in an open transaction and its Milvus
    write on the server, and the write's answer is held (``tools.grpc_hold``) while a is frozen past
    its session; b takes over, reads a's records again from the committed offset, writes them and
    version 2 in transactions of its own. When a wakes, its transaction never commits: a
    read_committed reader sees every input record on the output topic exactly once, and Milvus ends
    at the newest versions."""
    from tests.faults.test_exactly_once import assert_transactional

    _, env = fault_stack
    s = fresh_settings(env, partitions=1, **_SETTINGS)
    expected = Expected()
    n = 80
    v1, v2 = _two_versions(n, "zt")
    with milvus_hold(env) as (hold, through_hold):
        a, port, b = _a_owns_b_waits(s, tmp_path, {"EMBEDSTREAM_DELIVERY": "exactly-once"}, **through_hold)
        with committed_reader(s, 1) as committed:
            feeder = _trickle(s, v1, expected)
            wait_until(lambda: committed() >= 0.3 * n, 180, every=0.05, what="30% of version 1 committed")
        hold.arm("Upsert")  # the group's records are in its open transaction by then
        assert hold.held.wait(60), f"a wrote nothing to Milvus in 60 s: {hold.calls}"
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not feeder.is_alive() and "assigned [0]" in b.log(), 120,
                       what="b to take the frozen member's partition over")
            produce_docs(s, v2, expected)
            wait_until(lambda: committed_total(s, 1) >= expected.records, 240, what="version 2 drained")
        finally:
            hold.release()
            os.kill(a.proc.pid, signal.SIGCONT)
        for d in v2:
            expected.good[d.id] = d.text
        report, fenced = _stop_and_check(s, model, [a, b], port, expected, v1, v2, [], 1)
    # the fence, not only the broker, stopped it: woken, a held back its group (with the fence off the
    # broker refuses the stale transaction all the same, which the checks below cannot tell apart)
    assert fenced >= 1, "a woke with its transaction open, yet its fence held nothing back"
    assert_transactional(s)
    # every input record on the output topic once: a's open transaction (a copy of what b wrote
    # again after the takeover) never became visible
    seen = Counter((r["source_offset"], r["chunk_index"]) for r in (decode_embedding(m.value()) for m in
                                                                    read_topic(s, s.output_topic) if m.value()))
    repeated = sorted(k for k, c in seen.items() if c > 1)
    assert not repeated, f"{len(repeated)} output records visible twice, e.g. {repeated[:5]}"
    record_row("11 zombie, exactly-once", f"a frozen with its transaction open; fence held {fenced} records/groups",
               report, None)


@pytest.mark.guarantee
def test_a_member_frozen_during_a_rebalance_of_three_writes_nothing_old(fault_stack, model, tmp_path):
    _, env = fault_stack
    s = fresh_settings(env, partitions=3, **_SETTINGS)
    expected = Expected()
    n = 300  # was 600: still a backlog in flight at two members when the third one joins
    v1, v2 = _two_versions(n, "z3")
    a = WorkerProcess(s, tmp_path, "a", EMBEDSTREAM_METRICS_PORT="auto")
    port = a.metrics_port()
    wait_until(lambda: "assigned [0, 1, 2]" in a.log(), 120, what="a to own every partition")
    b = WorkerProcess(s, tmp_path, "b")
    wait_until(lambda: "assigned [" in b.log(), 120, what="b to join")
    rebalances = a.log().count("assigned [") + a.log().count("revoked [")
    c = WorkerProcess(s, tmp_path, "c")
    wait_until(lambda: "model " in c.log(), 120, every=0.1, what="c to load its model (it joins right after)")
    produce_docs(s, v1, expected)  # a backlog for a and b as c's join starts the rebalance
    # freeze a the moment the rebalance that c's join starts reaches it
    wait_until(lambda: a.log().count("assigned [") + a.log().count("revoked [") > rebalances, 120, every=0.05,
               what="c's join to start a rebalance")
    gone, inflight = _newer_versions_while_frozen(s, a, expected, v2, 3, lambda: True, port)
    report, fenced = _stop_and_check(s, model, [a, b, c], port, expected, v1, v2, gone, 3)
    # its session ran out while frozen, so every partition it held was lost: whatever it had in flight
    # then was old by the time it woke, and the fence must have held it back
    assert fenced >= 1 or inflight == 0, f"a froze with {inflight:.0f} batches in flight, and its fence held nothing"
    record_row("11 zombie, 3 workers", f"SIGSTOP a during c's rebalance, {inflight:.0f} batches in flight; fence "
               f"held {fenced} records/groups",
               report, None)
