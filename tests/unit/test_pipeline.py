"""Pipeline: batches complete in order through any number of stages, each handed on with the value its
stage returned for it; each stage retries transient failures on its own clock (handed the same values)
and counts its own backlog; bugs surface on the polling thread."""

from __future__ import annotations

import threading
import time

import pytest

from schemas.errors import TransientError
from worker.core.pipeline import Pipeline, Stage
from worker.core.records import Batch


def _batch(n: int) -> Batch:
    """A batch recognisable by its offset (the pipeline never looks inside)."""
    return Batch(offsets={("t", 0): n})


def _n(batch: Batch) -> int:
    return batch.offsets[("t", 0)]


def _wait(p: Pipeline, n: int, timeout: float = 10) -> list[Batch]:
    """The next ``n`` batches to complete (their values left out)."""
    return [batch for batch, _ in _wait_handed(p, n, timeout)]


def _wait_handed(p: Pipeline, n: int, timeout: float = 10) -> list[tuple[Batch, object]]:
    out: list[tuple[Batch, object]] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        out += p.completed(0.05)
    return out


def _noop(group: list[Batch], handed: list) -> list:
    return handed


def test_in_order_through_three_stages_and_inflight_count():
    seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def record(name):
        def step(group, handed):
            seen[name].extend(_n(b) for b in group)
            return [f"{before or ''}{name}{_n(b)};" for b, before in zip(group, handed)]
        return step

    p = Pipeline([Stage("a", record("a")), Stage("b", record("b")), Stage("c", record("c"))])
    for i in range(20):
        p.submit(_batch(i))
    done = _wait_handed(p, 20)
    assert [_n(b) for b, _ in done] == list(range(20))
    # each stage was handed what the stage before returned for that batch, the first stage None
    assert [value for _, value in done] == [f"a{i};b{i};c{i};" for i in range(20)]
    assert seen["a"] == seen["b"] == seen["c"] == list(range(20))
    assert p.inflight == 0 and all(s.backlog == 0 for s in p.stages)
    p.close()


def test_a_step_that_returns_a_value_short_is_a_bug_raised_on_the_polling_thread():
    p = Pipeline([Stage("short", lambda group, handed: handed[1:])])
    p.submit(_batch(0))
    with pytest.raises(ValueError, match="0 values for a group of 1"):
        _wait(p, 1)


def test_transient_errors_are_retried_until_success_on_the_stage_own_clock():
    attempts = {"n": 0}

    handed_to: list = []

    def flaky(group, handed):
        attempts["n"] += 1
        handed_to.append(list(handed))
        if attempts["n"] < 4:
            raise TransientError("milvus", "down")
        return ["written"]

    first, second = Stage("first", lambda group, handed: ["prepared"]), Stage("second", flaky)
    p = Pipeline([first, second], backoff_max=0.05)
    p.submit(_batch(1))
    [(batch, value)] = _wait_handed(p, 1)
    assert _n(batch) == 1 and value == "written" and attempts["n"] == 4
    assert handed_to == [["prepared"]] * 4  # every try is handed the same value
    assert second.retries == 3 and second.retrying_since is None  # recovered
    assert first.retries == 0 and first.groups == 1
    p.close()


def test_a_bug_is_raised_on_the_polling_thread():
    def broken(group, handed):
        raise KeyError("bug")

    p = Pipeline([Stage("broken", broken), Stage("after", _noop)])
    p.submit(_batch(0))
    with pytest.raises(KeyError):
        _wait(p, 1)


def test_abort_stops_retrying_and_completes_nothing():
    retried = threading.Event()
    calls = []

    def down(group, handed):
        calls.append(1)
        if len(calls) >= 2:
            retried.set()
        raise TransientError("kafka", "down")

    p = Pipeline([Stage("a", _noop), Stage("down", down)], backoff_max=0.05)
    p.submit(_batch(0))
    assert retried.wait(5), "the stage never retried"
    assert p.abort(wait=5), "the stage threads did not end: the retries went on"
    assert p.completed() == [] and p.inflight == 1 and p.aborted


def test_batches_waiting_for_a_busy_stage_are_taken_as_one_group_and_leave_in_order():
    release = threading.Event()
    groups: list[list[int]] = []

    busy = threading.Event()

    def slow(group, handed):
        groups.append([_n(b) for b in group])
        busy.set()
        release.wait(5)
        return handed

    slow_stage = Stage("slow", slow)
    p = Pipeline([slow_stage, Stage("sink", _noop)])
    p.submit(_batch(0))
    assert busy.wait(5)  # the stage is now blocked on batch 0
    for i in range(1, 5):
        p.submit(_batch(i))
    assert slow_stage.backlog == 5
    release.set()
    assert [_n(b) for b in _wait(p, 5)] == [0, 1, 2, 3, 4]
    assert groups == [[0], [1, 2, 3, 4]] and slow_stage.backlog == 0 and slow_stage.groups == 2
    p.close()


def test_close_releases_once_every_stage_stopped():
    released = []
    p = Pipeline([Stage("a", _noop)], release=lambda: released.append(True))
    p.submit(_batch(0))
    p.close()
    p.close()
    assert released == [True]
    assert [_n(b) for b, _ in p.completed()] == [0]


def test_a_pipeline_needs_a_stage():
    with pytest.raises(ValueError):
        Pipeline([])


def test_abort_waits_for_a_stage_inside_its_step_and_wakes_idle_ones():
    inside, release = threading.Event(), threading.Event()

    def slow(group, handed):
        inside.set()
        release.wait(5)
        return handed

    pipeline = Pipeline([Stage("model", slow), Stage("sink", _noop)])
    pipeline.submit(Batch())
    assert inside.wait(5)
    assert not pipeline.abort(wait=0.1)  # the model's call is still running
    release.set()
    assert pipeline.abort(wait=5)  # it returned: every thread ended, the idle sink's too
    assert pipeline.completed() == []
