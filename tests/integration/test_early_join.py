"""The member joins its group while its model loads (``worker.core.early_join``), on the real broker:
inside the model's load the broker already lists the member with the topic's partitions assigned,
and the worker then embeds everything with the loop's own call-backs in place. Without a broker:
the stand-in's relay of call-backs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, TopicPartition

from connectors.kafka import make_admin
from tests.helpers import fresh_settings
from tools.fake_embedder import FakeEmbedder
from worker.core.early_join import EarlyJoin


class _SlowLoad(FakeEmbedder):
    """A model whose load (its warm-up, the last step of loading) waits until the broker says this
    member holds partitions, and records what the broker said."""

    def __init__(self, settings) -> None:
        super().__init__(8)
        self.settings = settings
        self.seen: list[TopicPartition] = []

    def warmup(self) -> None:
        admin = make_admin(self.settings.kafka_common())
        group = self.settings.group_id
        deadline = time.monotonic() + 30
        while not self.seen and time.monotonic() < deadline:
            try:
                found = admin.describe_consumer_groups([group])[group].result(timeout=10)
            except KafkaException:  # a fresh broker's coordinator still loading
                found = None
            self.seen = [tp for m in found.members for tp in m.assignment.topic_partitions] if found else []
            time.sleep(0.2)


@pytest.mark.integration
def test_the_member_holds_its_partitions_before_its_model_has_loaded(stack):
    from schemas.codec import Document
    from worker.assembly.runner import build_worker
    from worker.commands.produce import document_record, produce_records

    s = fresh_settings(stack, partitions=2)
    produce_records(s.kafka_common(), s.input_topic,
                    [document_record(Document(f"early-{i}", f"text {i}", None, {})) for i in range(20)])
    model = _SlowLoad(s)
    worker = build_worker(s, embedder=model)
    assert sorted(tp.partition for tp in model.seen if tp.topic == s.input_topic) == [0, 1]
    stats = worker.run(stop_when_idle=2)
    assert stats.embedded == 20  # the loop's call-backs took the assignment over


class _Consumer:
    def __init__(self) -> None:
        self.subscribed: list = []

    def subscribe(self, topics, **callbacks) -> None:
        self.subscribed.append((topics, callbacks))

    def poll(self, timeout: float) -> str:
        return f"polled {timeout}"


def test_the_stand_in_subscribes_once_relays_the_loops_call_backs_and_passes_the_rest_on():
    consumer = _Consumer()
    early = EarlyJoin(consumer, "docs")  # type: ignore[arg-type]
    [(topics, relays)] = consumer.subscribed
    assert topics == ["docs"] and sorted(relays) == ["on_assign", "on_lost", "on_revoke"]
    relays["on_assign"](consumer, ["p0"])  # before the loop's subscribe (a close on a failed start): nothing
    got = []
    early.subscribe(["docs"], on_assign=lambda c, p: got.append(("assign", p)),
                    on_revoke=lambda c, p: got.append(("revoke", p)), on_lost=lambda c, p: got.append(("lost", p)))
    assert len(consumer.subscribed) == 1  # not subscribed again
    relays["on_assign"](consumer, ["p0"])
    relays["on_revoke"](consumer, ["p0"])
    relays["on_lost"](consumer, ["p1"])
    assert got == [("assign", ["p0"]), ("revoke", ["p0"]), ("lost", ["p1"])]
    assert early.poll(1.0) == "polled 1.0"
    with pytest.raises(ValueError, match="subscribed early"):
        early.subscribe(["other"], on_assign=print, on_revoke=print, on_lost=print)
