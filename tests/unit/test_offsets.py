"""The committer: stores only owned partitions, commits on its interval, retries what failed."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from worker.offsets import OffsetCommitter

from .fakes import Clock, FakeConsumer


def test_stores_only_partitions_still_owned():
    c = FakeConsumer({})
    committer = OffsetCommitter(c, 0)
    committer.store({("docs", 0): 5, ("docs", 1): 9}, owned={("docs", 0)})
    committer.tick()
    assert c.committed_offsets == {0: 5}


def test_commits_at_most_every_interval_and_when_forced():
    c, clock = FakeConsumer({}), Clock()
    committer = OffsetCommitter(c, interval=1.0, clock=clock)
    committer.store({("docs", 0): 3}, owned={("docs", 0)})
    clock.now = 0.5
    committer.tick()
    assert c.committed_offsets == {}
    clock.now = 1.1
    committer.tick()
    assert c.committed_offsets == {0: 3}
    committer.store({("docs", 0): 4}, owned={("docs", 0)})
    assert committer.commit(sync=True) and c.committed_offsets == {0: 4}


class FlakyConsumer(FakeConsumer):
    def __init__(self, failures: int) -> None:
        super().__init__({})
        self.failures = failures

    def commit(self, asynchronous=True):
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
        super().commit(asynchronous)


def test_a_failed_commit_keeps_the_offsets_for_the_next_one():
    c = FlakyConsumer(failures=1)
    committer = OffsetCommitter(c, 0)
    committer.store({("docs", 0): 7}, owned={("docs", 0)})
    assert committer.commit(sync=True) is False and c.committed_offsets == {}
    assert committer.commit(sync=True) is True and c.committed_offsets == {0: 7}


def test_shutdown_commit_retries_within_its_attempts():
    c = FlakyConsumer(failures=2)
    committer = OffsetCommitter(c, 0)
    committer.store({("docs", 0): 2}, owned={("docs", 0)})
    assert committer.commit(sync=True, attempts=3) and c.committed_offsets == {0: 2}
