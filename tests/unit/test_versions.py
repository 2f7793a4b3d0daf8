"""The version guard: which sources compare, what a topic re-created (a new id) or an old row named by
its topic's name means, reading the ids again, and the warning that tells a skipped record."""

from __future__ import annotations

import logging

from worker.core.records import Delete, Item, Source
from worker.steps.writing.versions import VersionGuard


def _item(doc_id: str, offset: int, partition: int = 0, topic: str = "docs") -> Item:
    return Item(Source(topic, partition, offset), doc_id, "t", "h", 1, {})


def test_a_name_source_row_never_supersedes_an_id_source_record():
    """Rows written while sources were topic names (``docs:0``) meet records named by the topic's id:
    a different kind of source is another source, so the record is written, whatever its offset."""
    guard = VersionGuard({"docs": "T1"})
    assert guard.source(Source("docs", 0, 5)) == "T1:0"
    assert not guard.superseded(_item("a", 0), {"a": ("docs:0", 299)})
    # and once the row carries the id-source, the zombie protection holds for it
    assert guard.superseded(_item("a", 3), {"a": ("T1:0", 4)})
    assert not guard.superseded(_item("a", 4), {"a": ("T1:0", 4)})  # the same record again: a replay


def test_an_id_source_row_never_supersedes_a_name_source_record():
    """A broker that gives no ids (the guard falls back to names) writes over rows of an id-source."""
    guard = VersionGuard({})
    assert guard.source(Source("docs", 2, 5)) == "docs:2"
    assert not guard.superseded(_item("a", 1, 2), {"a": ("T1:2", 299)})
    assert guard.superseded(_item("a", 1, 2), {"a": ("docs:2", 299)})  # what a re-created topic costs there


def test_a_tombstone_is_guarded_like_an_upsert():
    guard = VersionGuard({"docs": "T1"})
    assert guard.superseded(Delete(Source("docs", 0, 2), "a"), {"a": ("T1:0", 9)})
    assert not guard.superseded(Delete(Source("docs", 0, 2), "a"), {"a": ("T0:0", 9)})


def test_refresh_makes_a_recreated_topic_a_new_source(caplog):
    ids = {"docs": "T1"}
    guard = VersionGuard({"docs": "T1"}, lookup=lambda: dict(ids))
    stored = {"x": ("T1:0", 299)}
    assert guard.superseded(_item("x", 0), stored)
    assert guard.refresh() is False  # the same id: nothing changed
    ids["docs"] = "T2"  # deleted and re-created
    with caplog.at_level(logging.WARNING, logger="worker.steps.writing.versions"):
        assert guard.refresh() is True
    assert "topic 'docs' has a new id (T2, was T1)" in caplog.text
    assert guard.topic_ids == {"docs": "T2"}
    assert not guard.superseded(_item("x", 0), stored)


def test_a_refresh_that_finds_nothing_keeps_the_ids_known():
    guard = VersionGuard({"docs": "T1"}, lookup=dict)
    assert guard.refresh() is False
    assert guard.topic_ids == {"docs": "T1"}
    assert VersionGuard({"docs": "T1"}).refresh() is False  # no look-up: nothing to do


def test_a_superseded_record_is_told_once_a_minute_per_partition(caplog):
    now = [5_000.0]  # a monotonic clock far from 0, as a host's is
    guard = VersionGuard({"docs": "T1"}, clock=lambda: now[0])  # the default: once a minute
    with caplog.at_level(logging.WARNING, logger="worker.steps.writing.versions"):
        for offset in range(5):
            now[0] += 1.0
            guard.tell(Source("docs", 0, offset), 299)
        guard.tell(Source("docs", 1, 7), 50)
        now[0] = 5_061.0  # a minute after the first warning, to the second
        guard.tell(Source("docs", 0, 9), 299)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("partition docs[0]: 1 record(s)") and "offset 0, Milvus holds offset 299" in lines[0]
    assert lines[1].startswith("partition docs[1]: 1 record(s)") and "offset 7, Milvus holds offset 50" in lines[1]
    # the minute's other four, and this one
    assert lines[2].startswith("partition docs[0]: 5 record(s)") and "offset 9" in lines[2]


def test_start_up_says_when_the_broker_gives_no_topic_id(monkeypatch, caplog):
    from worker.assembly import runner
    from worker.settings import Settings

    s = Settings(kafka_bootstrap_servers="127.0.0.1:1", input_topic="docs")
    monkeypatch.setattr(runner, "topic_ids", lambda common, topics: {})
    with caplog.at_level(logging.INFO, logger="worker.assembly.runner"):
        assert runner.input_topic_ids(s) == {}
    assert "gave no id for topic 'docs'" in caplog.text and "re-created" in caplog.text
    caplog.clear()
    monkeypatch.setattr(runner, "topic_ids", lambda common, topics: {"docs": "T9"})
    with caplog.at_level(logging.INFO, logger="worker.assembly.runner"):
        assert runner.input_topic_ids(s) == {"docs": "T9"}
    assert "gave no id" not in caplog.text and "has id T9" in caplog.text
