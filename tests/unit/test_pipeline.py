"""Pipeline: batches complete in order; transient failures are retried; bugs surface on the caller."""

from __future__ import annotations

import threading
import time

import pytest

from connectors.exceptions import TransientError
from worker.pipeline import Pipeline
from worker.records import Batch


def _wait(p: Pipeline, n: int, timeout: float = 10) -> list[Batch]:
    out: list[Batch] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        out += p.completed(0.05)
    return out


def test_in_order_and_inflight_count():
    p = Pipeline(lambda b: b, lambda b: b)
    batches = [Batch(seq=i) for i in range(20)]
    for b in batches:
        p.submit(b)
    assert [b.seq for b in _wait(p, 20)] == list(range(20))
    assert p.inflight == 0
    p.close()


def test_transient_errors_are_retried_until_success():
    attempts = {"n": 0}

    def flaky(b):
        attempts["n"] += 1
        if attempts["n"] < 4:
            raise TransientError("milvus", "down")
        return b

    p = Pipeline(lambda b: b, flaky, backoff_max=0.05)
    p.submit(Batch(seq=1))
    assert [b.seq for b in _wait(p, 1)] == [1] and attempts["n"] == 4
    p.close()


def test_a_bug_is_raised_on_the_polling_thread():
    def broken(b):
        raise KeyError("bug")

    p = Pipeline(broken, lambda b: b)
    p.submit(Batch())
    with pytest.raises(KeyError):
        _wait(p, 1)


def test_abort_stops_retrying():
    def down(b):
        raise TransientError("kafka", "down")

    p = Pipeline(lambda b: b, down, backoff_max=0.05)
    p.submit(Batch())
    time.sleep(0.2)
    p.abort()
    time.sleep(0.2)
    assert p.completed() == [] and p.inflight == 1


def test_batches_waiting_for_a_busy_stage_are_taken_as_one_group_and_leave_in_order():
    release = threading.Event()
    groups: list[list[int]] = []

    def embed(group):
        groups.append([b.seq for b in group])
        release.wait(5)

    p = Pipeline(embed, lambda g: None)
    p.submit(Batch(seq=0))
    time.sleep(0.2)  # the stage is now blocked on batch 0
    for i in range(1, 5):
        p.submit(Batch(seq=i))
    assert p.embed_backlog == 5
    release.set()
    assert [b.seq for b in _wait(p, 5)] == [0, 1, 2, 3, 4]
    assert groups == [[0], [1, 2, 3, 4]] and p.embed_backlog == 0
    p.close()
