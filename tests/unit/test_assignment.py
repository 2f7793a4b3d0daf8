"""The assignment: partition ends, when the input counts as drained, and the pause state."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.core.assignment import Assignment

from .fakes import Clock, EofMessage, FakeConsumer, FakeMessage


def test_drained_once_every_owned_partition_is_at_its_end():
    a = Assignment(pause_after=1, join_grace=10, clock=Clock())
    a.add(FakeConsumer({}), [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert a.records([EofMessage(None, None, 0, topic="t")]) == []
    assert not a.drained()
    a.at_end(("t", 1), True)
    assert a.drained()
    record = FakeMessage(b"k", b"v", 1, topic="t")  # a new record arrived
    assert a.records([record]) == [record]
    assert not a.drained()


def test_ends_reached_lists_the_partitions_at_their_end_with_the_end_offset():
    a = Assignment(pause_after=1, join_grace=10, clock=Clock())
    a.add(FakeConsumer({}), [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert a.ends_reached() == {}
    a.records([EofMessage(None, None, 0, 40, topic="t"), EofMessage(None, None, 1, 7, topic="t")])
    assert a.ends_reached() == {("t", 0): 40, ("t", 1): 7}
    a.records([FakeMessage(b"k", b"v", 1, 7, topic="t")])  # partition 1 is being read again
    assert a.ends_reached() == {("t", 0): 40}
    a.records([EofMessage(None, None, 1, 9, topic="t")])
    assert a.ends_reached() == {("t", 0): 40, ("t", 1): 9}


def test_a_fatal_consumer_error_is_raised_and_others_are_only_logged():
    a = Assignment(pause_after=1, join_grace=10, clock=Clock())
    transport = FakeMessage(None, None)
    transport.error = lambda: KafkaError(KafkaError._TRANSPORT)
    assert a.records([transport]) == []
    fatal = FakeMessage(None, None)
    fatal.error = lambda: KafkaError(KafkaError._FATAL, fatal=True)
    with pytest.raises(KafkaException):
        a.records([fatal])
    # As librdkafka hands it out (Apache Kafka 4.2, a static member fenced by another with its
    # group.instance.id): the code says fatal, the flag does not. Only logged, it left the worker
    # running with a dead consumer.
    fenced = FakeMessage(None, None)
    fenced.error = lambda: KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other "
                                      "consumer with same group.instance.id")
    with pytest.raises(KafkaException):
        a.records([fenced])


def test_idle_only_when_quiet_drained_and_no_recent_cluster_error_for_the_whole_time():
    clock = Clock()
    a = Assignment(pause_after=1, join_grace=0, clock=clock)
    clock.now = 1
    assert not a.idle_for(3, quiet=True, last_error=-100)  # the clock starts
    clock.now = 3.5
    assert not a.idle_for(3, quiet=False, last_error=-100)  # busy again: the clock restarts
    clock.now = 4
    assert not a.idle_for(3, quiet=True, last_error=3)  # a broker error a second ago
    clock.now = 6
    assert not a.idle_for(3, quiet=True, last_error=3)  # the error is 3 s old: the clock starts again
    clock.now = 8.5
    assert not a.idle_for(3, quiet=True, last_error=3)
    clock.now = 9
    assert a.idle_for(3, quiet=True, last_error=3)


def test_without_partitions_drained_only_after_the_join_grace_and_never_right_after_a_loss():
    clock = Clock()
    a = Assignment(pause_after=1, join_grace=10, clock=clock)
    clock.now = 5
    assert not a.drained()
    clock.now = 11
    assert a.drained()
    a.add(FakeConsumer({}), [TopicPartition("t", 0)])
    a.remove([("t", 0)], lost=True)
    clock.now = 100
    assert not a.drained(), "lost partitions come back through a rejoin"
    a.remove([], lost=False)
    clock.now = 111
    assert a.drained()


def test_after_a_rebalance_not_drained_until_the_join_grace_passed():
    """Members that leave can leave their partitions unowned for a while: a member whose own
    partitions are drained waits out the grace after any rebalance (not after the first assignment)."""
    clock = Clock()
    a = Assignment(pause_after=1, join_grace=10, clock=clock)
    a.add(FakeConsumer({}), [TopicPartition("t", 0), TopicPartition("t", 1)])
    a.at_end(("t", 0), True)
    a.at_end(("t", 1), True)
    assert a.drained()  # the first assignment starts no grace
    clock.now = 20
    a.remove([("t", 1)], lost=False)  # a member joined and took partition 1
    a.add(FakeConsumer({}), [])
    clock.now = 29
    assert not a.drained()
    clock.now = 30.5
    assert a.drained()


def test_pauses_after_being_full_for_a_while_resumes_and_reapplies_after_assign():
    clock, consumer = Clock(), FakeConsumer({0: [], 1: []})
    consumer.assigned = [TopicPartition("t", 0), TopicPartition("t", 1)]
    a = Assignment(pause_after=2, join_grace=10, clock=clock)
    a.update_pause(consumer, full=True)
    assert not a.paused and consumer.paused == set()
    clock.now = 2.5
    a.update_pause(consumer, full=True)
    assert a.paused and consumer.paused == {0, 1} and a.pauses == 1
    a.update_pause(consumer, full=False)
    assert not a.paused and consumer.paused == set()
    consumer.paused = {1}  # librdkafka kept an old pause on a partition that came back
    a.add(consumer, [TopicPartition("t", 1)])
    a.update_pause(consumer, full=False)
    assert consumer.paused == set()


def test_a_member_that_rejoined_under_a_new_id_owns_nothing_it_believes_it_owns():
    a, consumer = Assignment(pause_after=1, join_grace=10), FakeConsumer({})
    assert a.same_member(consumer)  # owns nothing: nothing to write
    consumer.member = "m-1"
    a.add(consumer, [TopicPartition("t", 0)])
    assert a.same_member(consumer)
    consumer.member = "m-2"  # evicted while frozen, rejoined: its new assignment is not served yet
    assert not a.same_member(consumer)
    a.remove({("t", 0)}, lost=True)
    a.add(consumer, [])  # the rejoin's (empty) assignment
    assert a.same_member(consumer)
