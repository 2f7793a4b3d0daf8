"""A consumer group's ledger: stores only owned partitions, commits on its interval, retries what failed."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.core.ledger import OffsetLedger

from .fakes import Clock, FakeConsumer


def _ledger(consumer) -> OffsetLedger:
    return OffsetLedger(consumer, 0)


def test_stores_only_partitions_still_owned():
    c = FakeConsumer({})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 5, ("docs", 1): 9})
    ledger.tick()
    assert c.committed_offsets == {0: 5}


def test_commits_at_most_every_interval_and_when_forced():
    c, clock = FakeConsumer({}), Clock()
    ledger = OffsetLedger(c, 1.0, clock=clock)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 3})
    clock.now = 0.5
    ledger.tick()
    assert c.committed_offsets == {}
    clock.now = 1.1
    ledger.tick()
    assert c.committed_offsets == {0: 3}
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 4})
    assert ledger.flush(sync=True) and c.committed_offsets == {0: 4}


class FlakyConsumer(FakeConsumer):
    def __init__(self, failures: int) -> None:
        super().__init__({})
        self.failures = failures

    def commit(self, offsets=None, asynchronous=True):
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
        super().commit(offsets, asynchronous)


def test_a_failed_commit_keeps_the_offsets_for_the_next_one():
    c = FlakyConsumer(failures=1)
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 7})
    assert ledger.flush(sync=True) is False and c.committed_offsets == {}
    assert ledger.flush(sync=True) is True and c.committed_offsets == {0: 7}


def test_commits_are_timed_and_failures_counted():
    from prometheus_client import REGISTRY

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    failures, timed = value("embedstream_commit_failures_total"), value("embedstream_commit_seconds_count", mode="sync")
    c = FlakyConsumer(failures=1)
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 7})
    ledger.flush(sync=True)
    ledger.flush(sync=True)
    assert value("embedstream_commit_failures_total") - failures == 1
    assert value("embedstream_commit_seconds_count", mode="sync") - timed == 1  # the one that went through
    # an asynchronous commit is timed under its own label, in seconds (not a clock reading)
    before = (value("embedstream_commit_seconds_count", mode="async"),
              value("embedstream_commit_seconds_sum", mode="async"),
              value("embedstream_commit_seconds_count", mode="sync"))
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 8})
    ledger.flush(sync=False)
    assert value("embedstream_commit_seconds_count", mode="async") - before[0] == 1
    assert 0 <= value("embedstream_commit_seconds_sum", mode="async") - before[1] < 60
    assert value("embedstream_commit_seconds_count", mode="sync") == before[2]


def test_shutdown_commit_retries_within_its_attempts():
    c = FlakyConsumer(failures=2)
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 2})
    assert ledger.flush(sync=True, attempts=3) and c.committed_offsets == {0: 2}


def _assigned(consumer: FakeConsumer, committed: dict[int, int]) -> FakeConsumer:
    from confluent_kafka import TopicPartition

    consumer.assigned = [TopicPartition("docs", p) for p in (0, 1)]
    consumer.committed_offsets.update(committed)
    return consumer


def test_membership_is_proven_by_recommitting_what_is_committed():
    c = _assigned(FakeConsumer({}), {0: 40})  # partition 1 has nothing committed yet: left alone
    assert OffsetLedger(c, 0).prove()
    assert c.explicit_commits == 1 and c.committed_offsets == {0: 40}


class EvictedConsumer(FakeConsumer):
    """The coordinator refuses its commits: it is no member of the current generation."""

    def commit(self, offsets=None, asynchronous=True):
        raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))


def test_a_refused_commit_is_no_proof(caplog):
    c = _assigned(EvictedConsumer({}), {0: 40, 1: 3})
    assert OffsetLedger(c, 0).prove() is False
    assert "membership not proven" in caplog.text


def test_nothing_assigned_or_committed_needs_no_proof():
    assert OffsetLedger(EvictedConsumer({}), 0).prove()
    assert _ledger(_assigned(EvictedConsumer({}), {})).prove()


def test_a_partition_committed_past_this_members_offsets_was_taken_over(caplog):
    """A broker that accepts any commit (the local Tansu) still shows the takeover: the new owner
    committed further than this member ever stored."""
    c = _assigned(FakeConsumer({}), {})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0), ("docs", 1)}
    ledger.store({("docs", 0): 40, ("docs", 1): 12})
    ledger.flush(sync=True)
    assert ledger.prove()
    c.committed_offsets[1] = 90  # the member that took partition 1 over committed meanwhile
    assert ledger.prove() is False
    assert "1@90" in caplog.text
    ledger.revoked({("docs", 1)})  # the revoke was served: partition 1 is no longer ours to judge
    c.assigned = [tp for tp in c.assigned if tp.partition != 1]
    assert ledger.prove()


def test_a_rebalance_this_member_took_part_in_says_what_it_owns():
    c = _assigned(FakeConsumer({}), {})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 40})
    c.committed_offsets[0] = 90
    assert ledger.prove() is False
    ledger.assigned({("docs", 0)})  # an assign callback: the group gave partition 0 (back) to it
    assert ledger.prove()
    c.committed_offsets[0] = 95  # and after that rebalance, a commit past the line is a takeover again
    assert ledger.prove() is False


def test_a_rebalance_before_any_offset_was_stored_sets_the_line():
    """The freeze may land right after an assignment, before this member stored anything."""
    c = _assigned(FakeConsumer({}), {0: 40})
    ledger = OffsetLedger(c, 0)
    ledger.assigned({("docs", 0), ("docs", 1)})
    assert ledger.prove()
    c.committed_offsets[0] = 60
    assert ledger.prove() is False


class _ModeConsumer(FakeConsumer):
    """Records whether each commit was synchronous."""

    def __init__(self) -> None:
        super().__init__({})
        self.modes: list[str] = []

    def commit(self, offsets=None, asynchronous=True):
        self.modes.append("async" if asynchronous else "sync")
        super().commit(offsets, asynchronous)


def test_interval_0_commits_synchronously_after_every_batch_and_an_interval_asynchronously():
    c = _ModeConsumer()
    every_batch = OffsetLedger(c, 0)
    every_batch.owned = {("docs", 0)}
    every_batch.store({("docs", 0): 3})
    every_batch.tick()
    assert c.modes == ["sync"] and c.committed_offsets == {0: 3}
    c2, clock = _ModeConsumer(), Clock()
    timed = OffsetLedger(c2, 1.0, clock=clock)
    timed.owned = {("docs", 0)}
    timed.store({("docs", 0): 4})
    clock.now = 1.0  # exactly the interval: due
    timed.tick()
    assert c2.modes == ["async"]
    timed.owned = {("docs", 0)}
    timed.store({("docs", 0): 5})
    assert timed.flush(sync=True) and c2.modes == ["async", "sync"]  # the shutdown's commit waits for its answer


def test_the_interval_counts_from_the_last_commit_forced_or_not():
    c, clock = FakeConsumer({}), Clock()
    ledger = OffsetLedger(c, 1.0, clock=clock)
    clock.now = 5.0
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 1})
    ledger.flush(sync=True)  # forced at 5.0
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 2})
    clock.now = 5.5
    ledger.tick()
    assert c.committed_offsets == {0: 1}, "committed again before the interval since the forced commit"
    clock.now = 6.0
    ledger.tick()
    assert c.committed_offsets == {0: 2}


def test_a_partition_committed_elsewhere_is_known_up_to_the_highest_offset():
    c = FakeConsumer({})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 7})
    ledger._saw({("docs", 0): 5, ("docs", 1): 4})
    # at what it knows: not behind; a partition it knows nothing of is behind even at offset 0
    assert ledger.behind({("docs", 0): 7, ("docs", 1): 4, ("docs", 2): 0}) == {("docs", 2): 0}
    assert ledger.behind({("docs", 0): 8, ("docs", 1): 5}) == {("docs", 0): 8, ("docs", 1): 5}


class _TimedConsumer(FakeConsumer):
    """Records the timeout of each ``committed`` read and the mode of each commit."""

    def __init__(self) -> None:
        super().__init__({})
        self.timeouts: list = []
        self.commit_kwargs: list[dict] = []

    def committed(self, partitions, timeout=None):
        self.timeouts.append(timeout)
        return super().committed(partitions, timeout)

    def commit(self, offsets=None, asynchronous=True):
        self.commit_kwargs.append({"offsets": offsets, "asynchronous": asynchronous})
        super().commit(offsets, asynchronous)


def test_reads_of_the_committed_offsets_are_bounded_by_the_timeout_given():
    """A coordinator that does not answer must not block the polling thread for good."""
    c = _assigned(_TimedConsumer(), {0: 40})
    ledger = OffsetLedger(c, 0)
    ledger.assigned({("docs", 0)}, timeout=3.0)
    assert ledger.prove(timeout=4.0)
    assert c.timeouts == [3.0, 4.0]


def test_the_proof_recommits_synchronously_even_an_offset_of_0():
    c = _assigned(_TimedConsumer(), {0: 0})
    assert OffsetLedger(c, 0).prove()
    [proof] = [kw for kw in c.commit_kwargs if kw["offsets"] is not None]
    assert proof["asynchronous"] is False and [(p.partition, p.offset) for p in proof["offsets"]] == [(0, 0)]


def test_a_partition_committed_at_0_when_assigned_and_then_further_by_another_member_was_taken_over():
    c = _assigned(FakeConsumer({}), {0: 0})
    ledger = OffsetLedger(c, 0)
    ledger.assigned({("docs", 0)})
    assert ledger.prove()
    c.committed_offsets[0] = 1
    assert ledger.prove() is False


def test_a_rebalance_keeps_what_this_member_stored_past_the_committed_offset():
    """Stored at 100, committed only to 90 when the group assigns the partition again: the line stays
    at 100 (an end of 95 is not behind, and a commit of 100 by this member is no takeover)."""
    c = _assigned(FakeConsumer({}), {0: 90})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 100})
    ledger.assigned({("docs", 0)})
    assert ledger.behind({("docs", 0): 95}) == {}
    c.committed_offsets[0] = 100
    assert ledger.prove()


def test_a_forgotten_partition_is_behind_again_whatever_was_stored():
    c = FakeConsumer({})
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 100})
    ledger.revoked([("docs", 0)])
    assert ledger.behind({("docs", 0): 50}) == {("docs", 0): 50}  # a re-created topic starts at 0


def test_an_assignment_reads_the_generation_again():
    told = []
    c = FakeConsumer({})
    ledger = OffsetLedger(c, 0)
    ledger.refresh = lambda: told.append(c)  # type: ignore[method-assign]
    ledger.assigned(set())
    assert told == [c]


def test_commit_attempts_are_half_a_second_apart_and_the_last_failure_is_an_error(monkeypatch, caplog):
    import logging

    import worker.core.ledger.base as offsets

    sleeps: list[float] = []
    monkeypatch.setattr(offsets.time, "sleep", sleeps.append)
    c = FlakyConsumer(failures=3)
    ledger = OffsetLedger(c, 0)
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 2})
    with caplog.at_level(logging.WARNING, logger="worker.core.ledger.base"):
        assert ledger.flush(sync=True, attempts=3) is False
    assert sleeps == [0.5, 0.5]  # between attempts, not after the last
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "ERROR"]
    assert caplog.records[-1].getMessage().endswith("; the next commit retries it")
    assert all(r.getMessage().endswith("; retrying") for r in caplog.records[:-1])
    c.failures = 1
    sleeps.clear()
    assert ledger.flush(sync=True, attempts=3) and sleeps == [0.5]


def test_at_least_once_commits_only_what_was_stored_since_the_last_commit_and_the_proof_waits():
    c = _TimedConsumer()
    ledger = OffsetLedger(c, 0, owned={("docs", 0)})
    assert ledger.flush(sync=True) and c.commit_kwargs == []  # nothing stored: no request at all
    ledger.store({("docs", 0): 3})
    assert ledger.flush(sync=True) and ledger.flush(sync=True)
    assert c.commit_kwargs == [{"offsets": None, "asynchronous": False}]  # once, and synchronously
    ledger.store({("docs", 0): 4})
    assert ledger.flush(sync=False) and c.commit_kwargs[-1] == {"offsets": None, "asynchronous": True}
    ledger._recommit([TopicPartition("docs", 0, 4)])
    assert c.commit_kwargs[-1]["asynchronous"] is False  # a proof must hear the coordinator's answer


def test_an_offset_of_0_stored_or_committed_here_is_the_line_a_commit_of_1_elsewhere_crosses():
    """An empty partition's end 0, stored by this member (or committed by its own transaction), is
    what it knows: another member's commit of 1 after a takeover is a takeover."""
    for learn in ("store", "transaction"):
        c = _assigned(FakeConsumer({}), {})
        ledger = OffsetLedger(c, 0)
        if learn == "store":
            ledger.owned = {("docs", 0)}
            ledger.store({("docs", 0): 0})
        else:
            ledger._saw({("docs", 0): 0})
        c.committed_offsets[0] = 1
        assert ledger.prove() is False, learn


def test_what_this_member_knows_is_the_highest_offset_whatever_the_order_it_learns_them_in():
    """Under exactly-once the sink's transaction can commit further than the polling thread has
    stored yet: a smaller store after it must not make the member's own commit read as a takeover."""
    c = _assigned(FakeConsumer({}), {})
    ledger = OffsetLedger(c, 0)
    ledger._saw({("docs", 0): 7})
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 5})
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 9})
    ledger.owned = {("docs", 0)}
    ledger.store({("docs", 0): 8})
    c.committed_offsets[0] = 9  # its own
    assert ledger.prove()
    ledger._saw({("docs", 0): 6})
    assert ledger.prove()
    assert ledger.behind({("docs", 0): 9}) == {} and ledger.behind({("docs", 0): 10}) == {("docs", 0): 10}


def test_the_reads_the_loop_makes_for_a_rebalance_and_a_proof_wait_ten_seconds_at_most():
    """The loop calls both without a timeout of its own: a coordinator that does not answer holds the
    polling thread (and its heartbeats' partner, the poll) ten seconds at most, within librdkafka's
    max.poll.interval.ms."""
    c = _assigned(_TimedConsumer(), {0: 40})
    ledger = OffsetLedger(c, 0)
    ledger.assigned({("docs", 0)})
    assert ledger.prove()
    assert c.timeouts == [10.0, 10.0]


def test_a_failed_commit_is_an_error_only_when_it_was_retried_and_the_retries_ran_out(monkeypatch, caplog):
    """One attempt alone (the async commits between batches) failing is a warning; the last of several
    (the synchronous commits) is an error."""
    import logging

    import worker.core.ledger.base as offsets

    monkeypatch.setattr(offsets.time, "sleep", lambda s: None)
    for attempts, levels in ((1, ["WARNING"]), (2, ["WARNING", "ERROR"])):
        caplog.clear()
        c = FlakyConsumer(failures=attempts)
        ledger = OffsetLedger(c, 0)
        ledger.owned = {("docs", 0)}
        ledger.store({("docs", 0): 2})
        with caplog.at_level(logging.WARNING, logger="worker.core.ledger.base"):
            assert ledger.flush(sync=True, attempts=attempts) is False
        assert [r.levelname for r in caplog.records] == levels, attempts


def test_a_finished_batch_stores_its_written_offsets_of_partitions_still_owned():
    """What the loop hands the ledger: a batch's next offsets, less a partition the sink left
    unwritten (fenced) and one no longer owned (revoked while the batch was in flight)."""
    from worker.core.records import Batch, Written

    c = FakeConsumer({})
    ledger = OffsetLedger(c, 0, owned={("docs", 0), ("docs", 1)})
    batch = Batch(offsets={("docs", 0): 5, ("docs", 1): 9, ("docs", 2): 4})
    # nothing goes back to the group: a consumer group re-reads
    assert ledger.finished(batch, Written(fenced=frozenset({("docs", 1)}))) == 0
    assert ledger.flush(sync=True) and c.committed_offsets == {0: 5}
