"""The group type and the delivery, asked once (``worker.assembly.groups``): each pair the settings
allow has one row, and each row assembles the delivery, the ledger and the member that go together."""

from __future__ import annotations

import pytest

from worker.assembly import groups
from worker.core.delivery import AtLeastOnce
from worker.core.ledger import OffsetLedger, ShareLedger
from worker.core.loop import Worker
from worker.core.share_loop import ShareWorker
from worker.process.metrics import Health
from worker.settings import Settings

from .fakes import FakeConsumer, RecordingProducer


def _settings(**kw) -> Settings:
    return Settings(kafka_bootstrap_servers="127.0.0.1:9", milvus_uri="http://127.0.0.1:9", **kw)


def test_every_pair_the_settings_allow_has_a_row_and_no_other():
    allowed = set()
    for group_type in ("consumer", "share"):
        for delivery in ("at-least-once", "exactly-once"):
            try:
                _settings(group_type=group_type, delivery=delivery)
                allowed.add((group_type, delivery))
            except ValueError:
                pass
    assert allowed == set(groups.KINDS) and len(allowed) == 3


def test_a_consumer_group_joins_at_once_and_its_ledger_commits_offsets(monkeypatch):
    subscribed = []

    class Joining(FakeConsumer):
        def subscribe(self, topics, **callbacks):
            subscribed.append(topics)

    monkeypatch.setattr(groups, "open_consumer", lambda s, health: Joining({}))
    monkeypatch.setattr(groups, "make_output_producer", lambda *a, **kw: RecordingProducer())
    s = _settings(delivery="at-least-once")
    side = groups.join(s, Health())
    assert isinstance(side, groups.ConsumerGroup) and subscribed == [[s.input_topic]]  # before the models load
    assert side.max_deliveries is None  # a consumer group's records carry no delivery count
    delivery = side.durability(s, 4, 5.0)
    assert isinstance(delivery, AtLeastOnce) and type(side.ledger) is OffsetLedger
    member = side.member(s, None, groups.MemberParts(Health(), 4, 45.0, None, None, None))  # type: ignore[arg-type]
    assert isinstance(member, Worker) and member.ledger is side.ledger and side.ledger.owned is member.assignment


def test_exactly_once_makes_the_transactions_ledger_on_the_sinks_transactions(monkeypatch):
    made = []
    monkeypatch.setattr(groups, "open_consumer", lambda s, health: FakeConsumer({}))
    monkeypatch.setattr(groups, "open_transactions", lambda s: made.append(object()) or made[-1])
    s = _settings(delivery="exactly-once")
    side = groups.join(s, Health())
    delivery = side.durability(s, 4, 5.0)
    assert delivery.txn is made[0] and side.ledger.txn is made[0]  # type: ignore[attr-defined,union-attr]


def test_a_share_group_acknowledges_records_and_joins_at_its_first_poll(monkeypatch):
    monkeypatch.setattr(groups, "prepare_share_group", lambda conf, group: 30.0)
    monkeypatch.setattr(groups, "make_share_consumer", lambda conf, group, **kw: FakeConsumer({}))
    monkeypatch.setattr(groups, "make_output_producer", lambda *a, **kw: RecordingProducer())
    monkeypatch.setattr(groups, "input_partitions", lambda s: [(s.input_topic, 0)])
    s = _settings(group_type="share")
    side = groups.join(s, Health())
    assert isinstance(side, groups.ShareGroup) and side.consumer is None  # nothing opened yet
    assert side.max_deliveries == s.share_max_deliveries == 4
    assert isinstance(side.durability(s, 4, 5.0), AtLeastOnce) and type(side.ledger) is ShareLedger
    member = side.member(s, None, groups.MemberParts(Health(), 4, 45.0, None, None, None))  # type: ignore[arg-type]
    assert isinstance(member, ShareWorker) and member.lock_s == 30.0 and member.ledger is side.ledger


def test_a_pair_without_a_row_is_refused_with_what_to_choose():
    s = _settings()
    object.__setattr__(s, "delivery", "exactly-twice")
    from schemas.errors import ConfigError

    with pytest.raises(ConfigError, match="choose one of"):
        groups.join(s, Health())
