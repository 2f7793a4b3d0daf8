"""The model gate between a live lane and a backfill lane: live first, the backfill in the gaps."""

from __future__ import annotations

import threading
import time

import pytest

from worker.core.lanes import ModelGate
from worker.core.records import Batch

pytestmark = pytest.mark.fast


def _enter(gate: ModelGate, lane: str, order: list[str], hold_s: float = 0.0) -> threading.Thread:
    def run() -> None:
        with getattr(gate, lane)():
            order.append(lane)
            time.sleep(hold_s)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_live_group_waiting_goes_before_a_backfill_group_waiting():
    gate, order = ModelGate(lambda: 0), []
    first = _enter(gate, "backfill", order, hold_s=0.2)  # in the model
    time.sleep(0.05)
    backfill = _enter(gate, "backfill", order)
    time.sleep(0.05)
    live = _enter(gate, "live", order)
    for t in (first, backfill, live):
        t.join(5)
    assert order == ["backfill", "live", "backfill"]  # the live group waited for one backfill group only


def test_a_backfill_turn_waits_while_the_live_chain_has_batches_in_its_stages():
    waiting = [2]
    gate, order = ModelGate(lambda: waiting[0]), []
    backfill = _enter(gate, "backfill", order)
    time.sleep(0.1)
    assert order == []  # the model is free, but two live batches are in the live lane's stages
    waiting[0] = 0
    backfill.join(5)
    assert order == ["backfill"] and gate.backfill_waited_s >= 0.1


def test_a_live_group_never_waits_for_the_live_chain_and_holds_the_model_alone():
    inside, most, sizes = [0], [0], []
    lock = threading.Lock()
    gate = ModelGate(lambda: 5)  # the live chain is busy: live groups go in all the same

    def step(group, handed):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            sizes.append(len(group))
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        return handed

    live = gate.live_step(step)
    threads = [threading.Thread(target=live, args=([Batch(), Batch()], [i, i])) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert most[0] == 1 and sizes == [2] * 8  # one group in the model at a time, whole


def test_a_backfill_group_takes_the_model_a_batch_at_a_time_so_a_live_group_waits_for_one_batch():
    gate, order = ModelGate(lambda: 0), []
    live_done = threading.Event()

    def backfill_step(group, handed):
        order.append(("backfill", handed))
        time.sleep(0.1)
        return [h * 2 for h in handed]

    def live_step(group, handed):
        order.append(("live", handed))
        live_done.set()
        return handed

    backfill = threading.Thread(target=lambda: order.append(
        ("result", gate.backfill_step(backfill_step)([Batch(), Batch(), Batch()], [1, 2, 3]))))
    backfill.start()
    time.sleep(0.05)  # the first backfill batch is in the model
    gate.live_step(live_step)([Batch()], [9])
    backfill.join(5)
    assert order == [("backfill", [1]), ("live", [9]), ("backfill", [2]), ("backfill", [3]), ("result", [2, 4, 6])]
    assert gate.backfill_batches == 3


def test_a_backfill_step_of_any_stage_waits_while_the_live_lane_has_a_batch_in_any_stage():
    live_batches = [1]  # one live batch in its sink: the backfill's prepare and sink wait too
    gate, order = ModelGate(lambda: live_batches[0]), []
    steps = {stage: gate.backfill_stage(stage, lambda group, handed, stage=stage: order.append(stage) or handed)
             for stage in ("prepare", "sink")}
    threads = [threading.Thread(target=step, args=([Batch()], [1])) for step in steps.values()]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert order == []
    live_batches[0] = 0
    for t in threads:
        t.join(5)
    assert sorted(order) == ["prepare", "sink"]


def test_a_backfill_batch_holds_the_model_and_a_live_group_waits_for_one_batch_at_most():
    gate, inside, most, order = ModelGate(lambda: 0), [0], [0], []
    lock = threading.Lock()

    def step(name):
        def run(group, handed):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            order.append(name)
            time.sleep(0.05)
            with lock:
                inside[0] -= 1
            return handed
        return run

    embed = gate.backfill_stage("embed", step("backfill"))
    backfill = threading.Thread(target=embed, args=([Batch(), Batch()], [1, 2]))
    backfill.start()
    time.sleep(0.02)  # the backfill's first batch is in the model, its second waits for the next turn
    gate.live_stage("embed", step("live"))([Batch()], [9])
    backfill.join(5)
    assert most[0] == 1  # never two model calls at once
    assert order == ["backfill", "live", "backfill"]  # the live group waited for the one batch running


def test_a_backfill_group_in_prepare_or_sink_holds_nothing_every_live_stage_runs_beside_it():
    gate = ModelGate(lambda: 0)

    for stage in ("prepare", "sink"):
        held, release = threading.Event(), threading.Event()

        def hold(group, handed, held=held, release=release):
            held.set()
            release.wait(5)
            return handed

        backfill = threading.Thread(target=gate.backfill_stage(stage, hold), args=([Batch()], [1]))
        backfill.start()
        assert held.wait(5)
        try:  # the backfill's step is running: a live group goes through each stage, the model's too
            assert gate.live_stage("prepare", lambda g, h: h)([Batch()], [3]) == [3]
            assert gate.live_stage("embed", lambda g, h: h)([Batch()], [5]) == [5]
            assert gate.live_stage("sink", lambda g, h: h)([Batch()], [4]) == [4]
        finally:
            release.set()
            backfill.join(5)


# -- the metrics of the live lane ------------------------------------------------------------------

def _value(metric, *labels) -> float:
    return (metric.metric.labels(*labels) if labels else metric.metric)._value.get()


def test_a_backfill_lane_s_polling_thread_writes_none_of_the_member_s_series():
    from worker.process import metrics

    before = _value(metrics.MESSAGES, "embedded"), _value(metrics.ASSIGNED_PARTITIONS)

    def backfill() -> None:
        metrics.quiet_this_thread()
        metrics.MESSAGES.labels("embedded").inc(1000)
        metrics.ASSIGNED_PARTITIONS.set(99)
        metrics.CONSUMER_LAG.labels("docs", "0").set(123456)
        metrics.END_TO_END_SECONDS.observe_many([3600.0])
        metrics.MODEL_DOCUMENTS.labels("lane-test-model").inc(7)  # not a member's series: counted

    t = threading.Thread(target=backfill)
    t.start()
    t.join(5)
    assert (_value(metrics.MESSAGES, "embedded"), _value(metrics.ASSIGNED_PARTITIONS)) == before
    assert ("docs", "0") not in metrics.CONSUMER_LAG.metric._metrics
    assert metrics.MODEL_DOCUMENTS.labels("lane-test-model")._value.get() == 7
    metrics.MESSAGES.labels("embedded").inc(2)  # the live lane's thread (this one) still writes
    assert _value(metrics.MESSAGES, "embedded") == before[0] + 2


# -- the backfill lane's settings and the two lanes' stops ------------------------------------------

def test_the_backfill_lane_runs_in_migrate_s_group_with_its_share_of_the_batches_in_flight():
    from types import SimpleNamespace

    from worker.assembly.lanes import backfill_inflight, backfill_settings
    from worker.settings import Settings

    s = Settings(group_id="live", group_type="share", backfill_model="/models/new", max_inflight_batches=8,
                 metrics_port=9400, milvus_collection="docs")
    model = SimpleNamespace(model_id="new-model@abc", space_id="new-model@abc|384")
    lane = backfill_settings(s, model)
    assert lane.group_id.startswith("live.migrate.docs__new_model_abc_") and lane.group_type == "consumer"
    assert (lane.model, lane.backfill_model, lane.metrics_port, lane.max_inflight_batches) == ("/models/new", None,
                                                                                               0, 2)
    assert (lane.max_batch_size, lane.max_batch_tokens) == (s.max_batch_size // 4, s.max_batch_tokens // 4)
    # its records reach its collection alone, unless a topic of its own is asked for
    assert lane.output_topic == "" and s.output_topic == "embeddings"
    asked = backfill_settings(s.model_copy(update={"backfill_output_topic": "embeddings.next"}), model)
    assert asked.output_topic == "embeddings.next"
    assert backfill_inflight(s.model_copy(update={"backfill_share": 0.01})) == 1  # never none
    assert backfill_inflight(s.model_copy(update={"backfill_share": 1.0})) == 8


class FakeMember:
    """A member that runs until stopped, or idle after ``idle_after`` seconds when asked to stop idle, or
    raises ``fails``."""

    def __init__(self, idle_after: float = 0.0, fails: BaseException | None = None) -> None:
        from types import SimpleNamespace

        from worker.core.stats import RunStats
        from worker.process.signals import GracefulStop

        self.stop, self.stats, self.metrics_port = GracefulStop(), RunStats(), None
        self.idle_after, self.fails, self.ended = idle_after, fails, None
        self.chain = SimpleNamespace(pipeline=SimpleNamespace(stages=[]))

    def run(self, stop_when_idle=None):
        start = time.monotonic()
        while not self.stop.requested:
            if self.fails is not None:
                raise self.fails
            if stop_when_idle is not None and time.monotonic() - start > self.idle_after:
                self.ended = "idle"
                return self.stats
            time.sleep(0.01)
        self.ended = "stopped"
        return self.stats


def _lanes(live, backfill):
    from worker.assembly.lanes import Lanes

    return Lanes(live, backfill, ModelGate(lambda: 0), "docs__new")


def test_a_stop_stops_both_lanes():
    live, backfill = FakeMember(), FakeMember()
    lanes = _lanes(live, backfill)
    threading.Timer(0.2, lambda: setattr(lanes.stop, "requested", True)).start()
    assert lanes.run() is live.stats
    assert (live.ended, backfill.ended) == ("stopped", "stopped")


def test_idle_the_process_ends_once_both_lanes_are_idle():
    live, backfill = FakeMember(idle_after=0.05), FakeMember(idle_after=0.5)
    start = time.monotonic()
    _lanes(live, backfill).run(stop_when_idle=1)
    assert (live.ended, backfill.ended) == ("idle", "idle") and time.monotonic() - start >= 0.5


def test_a_backfill_that_fails_ends_alone_and_the_live_lane_goes_on(caplog):
    live, backfill = FakeMember(), FakeMember(fails=RuntimeError("milvus refused the new collection"))
    lanes = _lanes(live, backfill)
    threading.Timer(0.3, lambda: setattr(lanes.stop, "requested", True)).start()
    lanes.run()
    assert live.ended == "stopped" and isinstance(lanes.backfill_error, RuntimeError)
    assert "the backfill lane into docs__new stopped (RuntimeError: milvus refused" in caplog.text


def test_a_live_lane_that_fails_stops_the_backfill_and_raises():
    live, backfill = FakeMember(fails=RuntimeError("consumer died")), FakeMember()
    with pytest.raises(RuntimeError, match="consumer died"):
        _lanes(live, backfill).run()
    assert backfill.ended == "stopped"


def _nice_of(tid: int) -> int:
    import os

    return os.getpriority(os.PRIO_PROCESS, tid)


def test_the_backfill_s_polling_thread_runs_at_the_lowest_priority_and_its_stage_threads_not():
    """A stage thread holds a turn the live lane waits for: at nice 19 it would stretch that wait."""
    from types import SimpleNamespace

    from worker.assembly.lanes import BACKFILL_NICE
    from worker.core.pipeline import Stage

    stages = [Stage(name, lambda group, handed: handed) for name in ("prepare", "embed", "sink")]
    abort = threading.Event()
    for stage in stages:
        stage.start(lambda handed: None, abort, 1.0, lambda exc: None)
    live, backfill = FakeMember(), FakeMember()
    backfill.chain = SimpleNamespace(pipeline=SimpleNamespace(stages=stages))
    polling = []
    backfill_run = backfill.run
    backfill.run = lambda stop_when_idle=None: (polling.append(_nice_of(threading.get_native_id())),
                                                backfill_run(stop_when_idle))[1]
    lanes = _lanes(live, backfill)
    before = _nice_of(threading.get_native_id())
    threading.Timer(0.2, lambda: setattr(lanes.stop, "requested", True)).start()
    lanes.run()
    nice = {stage.name: _nice_of(stage.thread_id) for stage in stages}
    for stage in stages:
        stage.put(None)
    assert polling == [BACKFILL_NICE]
    assert nice == {"prepare": before, "embed": before, "sink": before}
    assert _nice_of(threading.get_native_id()) == before  # the live lane's thread (this one) unchanged
