"""Join the group while the models load: the consumer subscribes before the worker exists.

A consumer's join (finding the coordinator, JoinGroup and SyncGroup, or KIP-848's heartbeats) runs
on librdkafka's own thread once it has subscribed; only the rebalance call-backs wait for a ``poll``.
So ``build_worker`` subscribes first and loads the models meanwhile, and when the loop first polls,
its partitions are usually there already: the join no longer adds to the start (a group's first
rebalance delay, the other members' rejoin).

:class:`EarlyJoin` stands in for the consumer until then. The loop's own ``subscribe`` hands it the
call-backs instead of subscribing again; everything else goes to the consumer. A call-back that comes
before the loop has handed its own (only ``close`` on a failed start can make one) is left to
confluent-kafka, which assigns or unassigns by itself when a call-back does not.

While the models load, a rebalance the group starts waits for this member's first poll (as it would
for any member busy between polls), at most the load's few seconds.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

Callback = Callable[[Consumer, list[TopicPartition]], None]


class EarlyJoin:
    """``consumer``, subscribed to ``topic`` now; the loop's call-backs taken at its ``subscribe``."""

    def __init__(self, consumer: Consumer, topic: str) -> None:
        self.consumer = consumer
        self.topic = topic
        self._callbacks: dict[str, Callback] = {}
        consumer.subscribe([topic], on_assign=self._relay("on_assign"), on_revoke=self._relay("on_revoke"),
                           on_lost=self._relay("on_lost"))

    def _relay(self, name: str) -> Callback:
        def call(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            target = self._callbacks.get(name)
            if target is not None:
                target(consumer, partitions)
        return call

    def subscribe(self, topics: list[str], *, on_assign: Callback, on_revoke: Callback, on_lost: Callback) -> None:
        """The loop's subscribe: the same topic, already joined; keep its call-backs."""
        if list(topics) != [self.topic]:
            raise ValueError(f"subscribed early to {self.topic!r}; the loop asked for {topics!r}")
        self._callbacks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}

    def __getattr__(self, name: str):
        return getattr(self.consumer, name)
