"""The start-up clock: phases in order, each from the mark before, the first from the process's start."""

from __future__ import annotations

import time

from worker.process.startup import StartClock, process_age


def test_the_process_age_is_read_from_the_system():
    assert 0.0 < process_age() < 24 * 3600  # this test's process started a moment (not a day) ago


def test_each_phase_runs_from_the_previous_mark_and_the_account_adds_them_up():
    clock = StartClock()
    before = process_age()
    time.sleep(0.05)
    clock.mark("models")
    time.sleep(0.02)
    clock.mark("joining the group")
    (first, t1), (second, t2) = clock.phases
    assert (first, second) == ("models", "joining the group")
    assert t1 >= before + 0.05 - 0.02 and 0.02 <= t2 < t1  # process_age reads whole clock ticks (10 ms)
    account = clock.account()
    assert account.startswith(f"started in {t1 + t2:.1f}s: models {t1:.1f}s, joining the group {t2:.1f}s")
