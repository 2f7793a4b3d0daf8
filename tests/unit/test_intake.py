"""Intake: every record becomes one entry in a batch, items get token estimates, the breaker sees
each outcome before its entry joins a batch."""

from __future__ import annotations

import pytest

from schemas.codec import Document, encode_document
from worker.core.records import Batch, DeadLetter, Item
from worker.steps.polling.batcher import Batcher
from worker.steps.polling.dlq_limit import DlqLimit, DlqLimitExceeded
from worker.steps.polling.intake import Intake
from worker.steps.polling.validate import Validator

from .fakes import FakeMessage


def _intake(out: list[Batch], size: int = 3, run: int = 100) -> Intake:
    return Intake(Validator(1000, lambda m: "" if m is None else None, max_deliveries=5),
                  lambda texts, _model: [len(t) for t in texts],
                  DlqLimit(run, 1.0, 100), Batcher(size, 10_000, 60, max_bytes=1 << 20), out.append)


def _msg(o: int, text: str = "hello") -> FakeMessage:
    return FakeMessage(b"k%d" % o, encode_document(Document(f"k{o}", text)), 0, o)


def test_batches_close_by_count_and_items_carry_estimates():
    out: list[Batch] = []
    intake = _intake(out)
    intake.add([_msg(0, "ab"), _msg(1, "abcd"), _msg(2, "x"), _msg(3)])
    assert len(out) == 1 and len(intake) == 1
    assert [e.tokens for e in out[0].entries if isinstance(e, Item)] == [2, 4, 1]
    assert out[0].offsets == {("docs", 0): 3}
    intake.flush()
    assert len(out) == 2 and out[1].offsets == {("docs", 0): 4} and len(intake) == 0


def test_bad_records_become_dead_letters_in_the_batch():
    out: list[Batch] = []
    intake = _intake(out)
    intake.add([_msg(0), FakeMessage(b"bad", b"\x02\x04", 0, 1), _msg(2)])
    [batch] = out
    assert [type(e) for e in batch.entries] == [Item, DeadLetter, Item]


def test_a_trip_keeps_every_batch_closed_before_it():
    """Records the share group delivered too often point at the workers (they crashed or stalled on
    them): a run of them trips the breaker, and the batches closed before the trip are kept."""
    out: list[Batch] = []
    intake = _intake(out, size=2, run=3)
    good = [_msg(o) for o in range(4)]
    bad = [FakeMessage(b"b%d" % o, b"\x02\x04", 0, o, deliveries=9) for o in range(4, 10)]
    with pytest.raises(DlqLimitExceeded):
        intake.add(good + bad)
    # offsets 0-3 in two batches, then one batch of dead letters (4, 5); the trip at offset 6
    assert [b.offsets[("docs", 0)] for b in out] == [2, 4, 6]


def test_a_producers_garbage_never_trips_the_breaker():
    out: list[Batch] = []
    intake = _intake(out, size=2, run=3)
    bad = [FakeMessage(b"b%d" % o, b"\x02\x04", 0, o) for o in range(1000)]
    intake.add(bad)
    intake.flush()
    assert sum(len(b.entries) for b in out) == 1000 and out[-1].offsets[("docs", 0)] == 1000


def test_drop_forgets_what_is_batching_for_revoked_partitions():
    out: list[Batch] = []
    intake = _intake(out, size=10)
    intake.add([_msg(0), FakeMessage(b"x", encode_document(Document("x", "t")), 1, 0)])
    assert intake.drop([("docs", 1)]) == 1 and len(intake) == 1
