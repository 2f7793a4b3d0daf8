"""The fence: a lease its beat thread renews, closed after a stall until the polling loop re-validated the
membership."""

from __future__ import annotations

import time

import pytest

from schemas.errors import TransientError
from worker.core.fence import Fence, FenceClosed, lease_seconds

from .fakes import Clock


def test_lease_is_shorter_than_what_eviction_takes():
    assert lease_seconds(45, 3) == 41  # the production defaults
    assert lease_seconds(6, 3) == 2  # the local stack
    assert lease_seconds(2, 3) == 1  # never below a second


def test_the_lease_expires_without_a_beat_and_renews_on_each_beat():
    clock = Clock(10.0)
    fence = Fence(lease_s=2, clock=clock)
    fence.publish({("t", 0)})
    clock.now = 11.5
    assert fence.owned_now() == {("t", 0)}
    fence.beat()
    clock.now = 13.0
    fence.check()
    clock.now = 13.6
    with pytest.raises(FenceClosed, match="lease expired"):
        fence.owned_now()


def test_a_blocked_polling_loop_is_no_stall_while_the_process_beats():
    """A synchronous commit that waits out a JoinGroup blocks the loop for seconds; heartbeats go on."""
    clock = Clock(0.0)
    fence = Fence(lease_s=2, clock=clock)
    for t in range(1, 60):  # 6 s of beats and not one polling turn
        clock.now = t / 10
        fence.beat()
    assert not fence.suspect
    fence.check()


def test_after_a_stall_writes_wait_for_revalidation_by_polling_turns():
    clock = Clock(0.0)
    fence = Fence(lease_s=2, revalidate_s=1, clock=clock)
    clock.now = 9.0  # the whole process was stopped for 9 s
    with pytest.raises(FenceClosed):
        fence.check()  # the sink thread woke first
    fence.beat()
    assert fence.suspect
    clock.now = 9.1
    fence.beat()
    with pytest.raises(FenceClosed):
        fence.check()  # beats alone never renew after a stall
    fence.tick()  # the first polling turn after waking starts the re-validation
    clock.now = 9.9
    fence.beat()
    fence.tick()
    assert fence.suspect
    clock.now = 10.2
    fence.tick()
    assert not fence.suspect
    fence.check()


def test_the_beat_thread_keeps_the_lease_fresh_on_the_real_clock():
    fence = Fence(lease_s=0.3, beat_s=0.02)
    fence.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # three leases long, checked all along
            fence.check()
            time.sleep(0.05)
    finally:
        fence.stop()
    time.sleep(0.4)
    with pytest.raises(FenceClosed):
        fence.check()  # stopped: nothing renews it


def test_ownership_is_a_snapshot():
    fence = Fence(lease_s=5)
    owned = {("t", 0), ("t", 1)}
    fence.publish(owned)
    owned.discard(("t", 1))  # the loop's own set changes later: the published one does not
    assert fence.owned_now() == {("t", 0), ("t", 1)}


def test_revalidation_waits_for_a_proof_of_membership():
    """Polling turns alone are not enough: a member frozen mid-rebalance sees no loss on waking."""
    clock = Clock(0.0)
    fence = Fence(lease_s=2, revalidate_s=1, clock=clock)
    proofs = iter([False, False, True])
    asked = []

    def prove() -> bool:
        asked.append(clock.now)
        return next(proofs)

    clock.now = 9.0
    fence.beat()
    fence.tick(prove)  # starts the window
    for t in (9.5, 10.1, 10.6, 11.2, 12.3):
        clock.now = t
        fence.tick(prove)
    assert asked == [10.1, 11.2, 12.3]  # asked once per window, a refusal starts a new window
    assert not fence.suspect
    fence.check()


def test_a_refused_proof_keeps_the_fence_closed():
    clock = Clock(0.0)
    fence = Fence(lease_s=2, revalidate_s=1, clock=clock)
    clock.now = 9.0
    fence.beat()
    fence.tick(lambda: False)
    clock.now = 10.5
    fence.tick(lambda: False)
    assert fence.suspect
    with pytest.raises(FenceClosed):
        fence.check()


def test_a_partition_lost_and_given_back_is_a_new_tenure_and_older_batches_are_stale():
    """Found on Kafka: a member whose session lapsed (broker frozen) lost its partitions and was
    given them back; a batch read before the loss was then written and committed while the consumer
    read the same records again from the committed offset: every one of them twice, exactly-once
    included. A batch is written only in the tenure it was read in."""
    from worker.core.records import Batch

    from .test_sink import _item

    fence = Fence(lease_s=60)
    fence.publish({("docs", 0), ("docs", 1)})
    before = Batch()
    before.add(_item("a", 0, 0.1))
    before.add(_item("b", 1, 0.2, partition=1))
    fence.stamp(before)
    assert fence.stale(before) == set()
    fence.publish({("docs", 1)})  # lost partition 0 (and kept 1)
    assert fence.stale(before) == {("docs", 0)}
    fence.publish({("docs", 0), ("docs", 1)})  # given it back: a new tenure
    assert fence.stale(before) == {("docs", 0)}, "a batch of the old tenure would be written again"
    after = fence.stamp(Batch(offsets={("docs", 0): 5}))
    assert fence.stale(after) == set()
    unstamped = Batch(offsets={("docs", 0): 5, ("docs", 7): 1})
    assert fence.stale(unstamped) == {("docs", 7)}  # built by hand: ownership alone


def test_the_beat_thread_is_a_named_daemon_and_stopping_a_fence_never_started_is_harmless():
    fence = Fence(lease_s=5)
    fence.stop()  # a worker that failed before the fence started still stops it on its way out
    fence = Fence(lease_s=5)
    fence.start()
    try:
        beat = fence._thread
        # a daemon: a worker that dies without stopping it still exits; named: the bench's CPU
        # table attributes its time by the name
        assert beat is not None and beat.daemon and beat.name == "fence-beat" and beat.is_alive()
    finally:
        fence.stop()
    assert not beat.is_alive()  # stop waits for it


def test_a_closed_fence_is_a_fence_outage_to_retry():
    err = FenceClosed("lease expired")
    assert isinstance(err, TransientError) and err.system == "fence"


def test_the_runners_fence_beats_ten_times_a_second_and_revalidates_for_2_s():
    """The runner builds its fence with these defaults (the module's docstring promises them)."""
    fence = Fence(lease_s=5)
    assert (fence.beat_s, fence.revalidate_s) == (0.1, 2.0)


def test_a_share_members_batch_is_stale_whole_once_its_lock_ran_out_and_not_a_moment_before():
    from worker.core.records import Batch, Item, Source
    from worker.core.share_loop import lock_margin

    clock = Clock(100.0)
    fence = Fence(lease_s=60, clock=clock)
    fence.publish({("t", 0), ("t", 1)})
    batch = Batch()
    for p in (0, 1):
        batch.add(Item(Source("t", p, 7), f"d{p}", "x", "h", 1, {}, []))
    fence.stamp(batch)
    assert fence.stale(batch) == set()  # no lock known: never stale by it
    fence.lock(2.0)
    clock.now = 102.0
    assert fence.stale(batch) == set()  # at the bound: still its own
    clock.now = 102.01
    assert fence.stale(batch) == {("t", 0), ("t", 1)}
    fence.lock(2.0)  # the next poll's records: locked anew
    assert fence.stale(batch) == set()
    fence.lock(None)
    clock.now = 150.0
    assert fence.stale(batch) == set()
    # a poll's lock less a margin (the broker started it before the records arrived): a fifth, at most 1 s
    assert lock_margin(None) is None and lock_margin(2.5) == 2.0 and lock_margin(30.0) == 29.0


def test_the_bounds_of_the_lease_and_of_the_revalidation_window_are_inside(caplog):
    """A gap of exactly the lease is no stall, an age of exactly the lease still writes, and exactly
    ``revalidate_s`` of polling turns is enough to ask for the proof. The stall is said with its length."""
    clock = Clock(0.0)
    fence = Fence(lease_s=2, revalidate_s=1.5, clock=clock)
    fence.publish({("t", 0)})
    clock.now = 2.0
    fence.check()  # age 2.0 of a 2.0 s lease
    fence.beat()  # a gap of 2.0 s: no stall
    assert not fence.suspect
    clock.now = 7.25
    fence.beat()  # 5.25 s
    assert fence.suspect and "stalled for 5.2s (longer than the 2.0s lease)" in caplog.text
    proofs: list[float] = []
    fence.tick(lambda: proofs.append(clock.now) or True)  # the window opens
    clock.now = 8.75
    fence.tick(lambda: proofs.append(clock.now) or True)  # exactly 1.5 s of turns
    assert proofs == [8.75] and not fence.suspect
