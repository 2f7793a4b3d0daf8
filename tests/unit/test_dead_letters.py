"""``worker.commands.dead_letters``: what a dead letter says, which ones a selection takes, what a replay
restores and what it refuses, and the reasons table against the reasons the worker gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.commands import dead_letters as dl
from worker.commands.dead_letters import REASONS, DeadLetter, Selection, parse_offsets
from worker.steps.polling.dlq_limit import HINTS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _letter(offset=3, reason="text_too_long", key=b"k", headers=(), ts=1000) -> DeadLetter:
    own = (("embedstream.error.reason", reason.encode()), ("embedstream.error.message", b"too long"),
           ("embedstream.source.topic", b"docs"), ("embedstream.source.partition", b"1"),
           ("embedstream.source.offset", b"42"))
    return DeadLetter(0, offset, ts, key, b'{"id": "k"}', (*headers, *own))


def test_a_dead_letter_names_its_reason_source_and_the_producers_headers():
    d = _letter(headers=(("traceparent", b"00-1"), ("embedstream.original.team", b"search"),
                         ("EMBEDSTREAM.original.replayed", b"old")))
    assert (d.reason, d.message, d.source) == ("text_too_long", "too long", ("docs", 1, 42))
    # the worker's headers dropped, a renamed one given its name back, an earlier marker dropped
    assert d.original_headers() == [("traceparent", b"00-1"), ("embedstream.team", b"search")]
    assert d.marker("dlq") == "dlq:0:3"
    assert _letter(headers=(("embedstream.original.replayed", b"dlq:0:1"),)).replay_of == "dlq:0:1"
    assert _letter().replay_of is None


def test_a_selection_takes_reasons_keys_and_an_offset_range():
    d = _letter(offset=10)
    assert Selection()(d)
    assert Selection(reasons=frozenset({"text_too_long"}))(d) and not Selection(reasons=frozenset({"x"}))(d)
    assert Selection(keys=frozenset({"k"}))(d) and not Selection(keys=frozenset({"j"}))(d)
    assert Selection(first=10, last=10)(d) and not Selection(first=11)(d) and not Selection(last=9)(d)
    assert not Selection(partition=1)(d)
    assert parse_offsets("5-9") == (5, 9) and parse_offsets("5-") == (5, None) and parse_offsets("-9") == (None, 9)
    assert parse_offsets("7") == (7, 7)
    with pytest.raises(ValueError, match="A-B"):
        parse_offsets("x-y")


def test_a_replay_skips_what_was_replayed_refuses_what_cannot_pass_unless_forced(monkeypatch):
    from worker.settings import Settings

    s = Settings(kafka_bootstrap_servers="x:1", dlq_topic="dlq")
    done = _letter(offset=1)
    fixable, never, again = _letter(offset=2), _letter(offset=3, reason="invalid_utf8"), \
        _letter(offset=4, headers=(("embedstream.original.replayed", b"dlq:0:0"),))
    updated = _letter(offset=5, key=b"u")  # its key has a later record in partition 1 than offset 42
    scan = dl.InputScan({"dlq:0:1"}, {(1, b"u"): 43, (1, b"k"): 42})
    monkeypatch.setattr(dl, "scan_input", lambda _s, letters: scan)
    s = s.model_copy(update={"input_topic": "docs"})
    plan = dl.plan_replay(s, [done, fixable, never, again, updated])
    assert (plan.send, plan.already, plan.never, plan.failed_again, plan.superseded) == \
        ([fixable], [done], [never], [again], [updated])
    forced = dl.plan_replay(s, [done, fixable, never, again, updated], force=True)
    # never one already replayed, nor one that would put an older version on top
    assert forced.send == [fixable, never, again] and forced.already == [done] and forced.superseded == [updated]


def test_the_reasons_table_covers_every_reason_the_worker_gives_and_the_docs_say_the_same():
    assert set(REASONS) == set(HINTS)
    page = (DOCS / "operations.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \|.*\| (after the fix|no: the record itself) \|$", page, re.M))
    assert rows == {r: "after the fix" if v.replay else "no: the record itself" for r, v in REASONS.items()}


def test_bytes_are_shown_as_text_where_they_are_text():
    assert dl.as_text(b"caf\xc3\xa9") == "café"
    assert dl.as_text(b"caf\xe9").startswith("(4 bytes, not UTF-8) 636166e9")
    assert dl.as_text(None) == "(none)" and dl.as_text(b"x" * 10, limit=4) == "xxxx… (10 characters)"


def test_a_value_is_shown_as_the_document_it_reads_as_or_not_at_all():
    from schemas.codec import Document, encode_document

    assert dl.as_document(b"d", encode_document(Document("d", "hello"))) == {
        "id": "d", "text": "hello", "model": None, "metadata": {}}
    assert dl.as_document(b"d", b"\x00\x00\x00\x00\x01garbage") is None and dl.as_document(b"d", None) is None
