"""The polling loop on a fake consumer and a chain of trivial stages: what it commits, when it
pauses, what a revoke, a lost partition and a tripped breaker leave committed."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from schemas.codec import Document, encode_document
from worker.core.assignment import Assignment
from worker.core.fence import Fence, FenceClosed
from worker.core.ledger import OffsetLedger
from worker.core.loop import Worker
from worker.core.member import Chain
from worker.core.pipeline import Pipeline, Stage
from worker.core.records import DeadLetter, Written
from worker.process.metrics import Health
from worker.steps.polling.batcher import Batcher
from worker.steps.polling.dlq_limit import DlqLimit, DlqLimitExceeded
from worker.steps.polling.intake import Intake
from worker.steps.polling.validate import Validator

from .fakes import Clock, FakeConsumer, FakeMessage


def _records(partition: int, n: int, bad_from: int | None = None) -> list[FakeMessage]:
    out = []
    for o in range(n):
        model = "wrong" if bad_from is not None and o >= bad_from else None
        doc = Document(f"d{partition}-{o}", f"text {partition} {o}", model)
        out.append(FakeMessage(doc.id.encode(), encode_document(doc), partition, o))
    return out


def _worker(consumer, embed=lambda g: None, sink=lambda g: None, *, batch=10, inflight=4, pause_after=0.0,
            dlq_run=1000, dlq_ratio=(1.0, 1000), fence: Fence | None = None) -> Worker:
    fence = fence or Fence(lease_s=5)
    # the fakes take a group; the stages hand nothing on but the sink's Written (nothing fenced)
    embed_stage = Stage("embed", lambda group, _handed: (embed(group), [None] * len(group))[1])
    pipeline = Pipeline([embed_stage, Stage("sink", lambda group, _handed: (sink(group), [Written()] * len(group))[1])],
                        backoff_max=0.05)
    intake = Intake(Validator(10_000, lambda m: "" if m is None else None), lambda texts, _model: [5] * len(texts),
                    DlqLimit(dlq_run, *dlq_ratio), Batcher(batch, 10_000, 0.01, max_bytes=1 << 24), pipeline.submit)
    chain = Chain(intake, pipeline, fence, model_free=lambda: embed_stage.backlog == 0)
    return Worker(consumer, "docs", chain, OffsetLedger(consumer, 0),
                  Assignment(pause_after=pause_after, join_grace=1.0), max_inflight=inflight, shutdown_grace=5,
                  health=Health())


def test_drains_every_partition_and_commits_the_next_offsets():
    consumer = FakeConsumer({0: _records(0, 35), 1: _records(1, 7)})
    stats = _worker(consumer).run(stop_when_idle=0.1)
    assert stats.embedded == 42 and stats.dead_lettered == 0
    assert consumer.committed_offsets == {0: 35, 1: 7} and consumer.closed


def test_the_shutdown_line_shows_real_offsets_never_the_invalid_one(caplog):
    consumer = FakeConsumer({0: _records(0, 5), 1: []})  # partition 1 never gets a record to commit
    with caplog.at_level(logging.INFO, logger="worker.core.loop"):
        _worker(consumer).run(stop_when_idle=0.1)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown: committed"))
    assert line == "shutdown: committed {0: 5}; nothing yet for partitions [1]" and "-1001" not in line


def test_a_drained_partition_is_committed_up_to_its_end_past_a_commit_marker():
    """A transactional producer's last record (offset 4) is followed by its commit marker (5), which
    the consumer never hands out: the partition's end (6) is committed once it is drained, so lag
    reads 0. A partition whose end follows its last record is committed as before."""
    consumer = FakeConsumer({0: _records(0, 5), 1: _records(1, 3)}, ends={0: 6, 1: 3})
    stats = _worker(consumer).run(stop_when_idle=0.1)
    assert stats.embedded == 8 and consumer.committed_offsets == {0: 6, 1: 3}


def test_a_consumed_chunk_never_holds_more_than_the_batches_still_allowed_in_flight():
    gate = threading.Event()
    consumer = FakeConsumer({0: _records(0, 600)})
    taken: list[int] = []
    real = consumer.consume
    consumer.consume = lambda n=1, timeout=-1: (taken.append(n), real(n, timeout))[1]  # type: ignore[method-assign]
    worker = _worker(consumer, embed=lambda g: gate.wait(5), batch=5, inflight=3)
    assert worker._chunk() == 15  # 3 batches of 5, nothing in flight
    threading.Timer(0.3, gate.set).start()
    stats = worker.run(stop_when_idle=0.1)
    assert stats.embedded == 600 and max(taken) <= 15
    big = _worker(FakeConsumer({0: []}), batch=2000, inflight=2)
    assert big._chunk() == 2000  # at least a batch's worth, past CONSUME_CHUNK


def test_a_full_pipeline_pauses_the_assignment_and_resumes_it():
    gate = threading.Event()
    threading.Timer(0.5, gate.set).start()
    consumer = FakeConsumer({0: _records(0, 60)})
    worker = _worker(consumer, embed=lambda g: gate.wait(5), batch=5, inflight=2)
    stats = worker.run(stop_when_idle=0.1)
    assert stats.embedded == 60 and consumer.committed_offsets == {0: 60}
    assert worker.assignment.pauses >= 1 and consumer.pause_calls >= 1 and consumer.resume_calls >= 1


def test_revoke_finishes_in_flight_batches_commits_them_and_stores_nothing_after():
    consumer = FakeConsumer({0: _records(0, 20), 1: _records(1, 20)})
    calls = {"n": 0}

    def sink(group):
        calls["n"] += 1
        if calls["n"] == 1:
            consumer.revoke_next([1])  # the next consume revokes partition 1

    stats = _worker(consumer, sink=sink).run(stop_when_idle=0.1)
    assert consumer.committed_offsets[0] == 20
    # whatever partition 1 had finished before the revoke was committed by it; nothing later was stored
    assert consumer.committed_offsets.get(1, 0) == consumer.stored.get(1, 0) <= 20
    assert stats.embedded >= 20


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_rebalance_events_are_counted_and_the_partitions_owned_are_gauged():
    consumer = FakeConsumer({0: _records(0, 20), 1: _records(1, 20)})
    before = {e: _sample("embedstream_rebalances_total", event=e) for e in ("assigned", "revoked")}
    seen: list[float] = []

    def sink(group):
        seen.append(_sample("embedstream_assigned_partitions"))
        if len(seen) == 1:
            consumer.revoke_next([1])

    _worker(consumer, sink=sink).run(stop_when_idle=0.1)
    assert seen[0] == 2 and _sample("embedstream_assigned_partitions") == 1  # two, then one after the revoke
    assert _sample("embedstream_rebalances_total", event="assigned") - before["assigned"] >= 1
    assert _sample("embedstream_rebalances_total", event="revoked") - before["revoked"] == 1


def test_lost_partitions_are_neither_written_nor_committed():
    consumer = FakeConsumer({0: _records(0, 30), 1: _records(1, 30)})
    fence = Fence(lease_s=5)
    written: list[int] = []

    def embed(group):
        consumer.lose_next([1])
        deadline = time.monotonic() + 5
        while ("docs", 1) in fence.owned_now():  # the loop serves the loss meanwhile
            assert time.monotonic() < deadline, "the loss was never served"
            time.sleep(0.005)

    def sink(group):  # writes what the fence lets through, as the real sink does
        owned = fence.owned_now()
        written.extend(e.source.partition for b in group for e in b.entries if e.source.tp in owned)

    _worker(consumer, embed=embed, sink=sink, fence=fence).run(stop_when_idle=1.5)
    assert consumer.committed_offsets[0] == 30
    assert 1 not in consumer.committed_offsets  # lost before any of its batches finished
    assert set(written) == {0} and len(written) == 30


def test_a_stall_longer_than_the_lease_closes_the_fence_until_revalidated():
    clock = Clock(100.0)
    fence = Fence(lease_s=2, revalidate_s=1, clock=clock)
    fence.publish({("docs", 0)})
    consumer = FakeConsumer({0: _records(0, 12)})
    attempts: list[str] = []

    def sink(group):
        try:
            fence.owned_now()
            attempts.append("written")
        except FenceClosed:
            attempts.append("fenced")
            raise

    def embed(group):
        if not attempts:
            clock.now += 5  # the process "froze" for 5 s while this batch was in the model

    def tick_clock():
        while not done.is_set():
            clock.now += 0.05
            time.sleep(0.01)

    done = threading.Event()
    threading.Thread(target=tick_clock, daemon=True).start()
    try:
        stats = _worker(consumer, embed=embed, sink=sink, fence=fence, batch=12).run(stop_when_idle=0.5)
    finally:
        done.set()
    assert attempts[0] == "fenced" and attempts[-1] == "written"
    assert stats.embedded == 12 and consumer.committed_offsets == {0: 12}


def test_a_producers_run_of_bad_records_never_halts_the_worker():
    """Undecodable records are the producer's alone: 30 in a row, past a run limit of 10, are
    dead-lettered at full speed and everything is committed (the breaker counts only the reasons that
    point at the worker)."""
    consumer = FakeConsumer({0: _records(0, 50, bad_from=20)})
    _worker(consumer, batch=5, dlq_run=10).run(stop_when_idle=1)
    assert consumer.committed_offsets[0] == 50 and consumer.closed


def test_dead_letters_made_after_intake_trip_the_breaker_too():
    """The sink step reports the dead letters it makes (``DlqLimit.record_late``): a topic of documents
    that Milvus refuses one by one (a collection of another shape) halts the worker well before its
    end, with what finished committed."""
    consumer = FakeConsumer({0: _records(0, 400)})
    holder: list[Worker] = []

    def embed(group):  # every document refused by the collection
        breaker = holder[0].chain.intake.dlq_limit
        for batch in group:
            for i, e in enumerate(batch.entries):
                batch.entries[i] = DeadLetter(e.source, b"k", b"v", None, "milvus_rejected", "no such field")
                breaker.record_late("milvus_rejected", "no such field")

    worker = _worker(consumer, embed=embed, batch=5, inflight=2, dlq_ratio=(0.5, 20))
    holder.append(worker)
    with pytest.raises(DlqLimitExceeded, match="milvus_rejected.*embedstream migrate"):
        worker.run(stop_when_idle=1)
    assert 10 <= consumer.committed_offsets.get(0, 0) < 100 and consumer.closed


def test_a_record_refused_for_good_stops_the_loop_with_what_finished_before_it_committed():
    from schemas.errors import RecordRefused

    def sink(group):
        if any(e.source.offset >= 20 for b in group for e in b.entries):
            raise RecordRefused("topic 'dlq' refused the dead letter of docs partition 0 offset 20 for good")

    consumer = FakeConsumer({0: _records(0, 40)})
    with pytest.raises(RecordRefused, match="offset 20"):
        _worker(consumer, sink=sink, batch=10, inflight=1).run(stop_when_idle=0.5)
    assert consumer.committed_offsets == {0: 20} and consumer.closed
