"""The validator: every record becomes exactly one entry, with the contract's DLQ reason when bad."""

from __future__ import annotations

import pytest

from schemas.codec import Document, encode_document
from worker.core.records import DeadLetter, Delete, Item
from worker.steps.polling.validate import Validator

from .fakes import FakeMessage


@pytest.mark.parametrize(("key", "value", "reason"), [
    (b"a", encode_document(Document("a", "   ")), "empty_text"),
    (b"a", encode_document(Document("a", "hi", model="other-model")), "unknown_model"),
    (b"a", b"x" * 2000, "text_too_long"),
    (b"a", b'{"id": "a", "text": "\xc3\x28"}', "invalid_utf8"),
    (None, b'{"id": "\\udfff", "text": "hi"}', "invalid_utf8"),  # a lone surrogate: no id to hash or write
    (b"a", b"\x02\x04", "decode_error"),
    (b"a" * 600, encode_document(Document("a" * 600, "hi")), "id_too_long"),
    (b"k1", encode_document(Document("v1", "hi")), "id_mismatch"),
])
def test_validator_reasons(key, value, reason):
    v = Validator(1000, lambda m: "" if m in (None, "m") else None)
    entry = v.validate(FakeMessage(key, value))
    assert isinstance(entry, DeadLetter) and entry.reason == reason and entry.value == value


def test_validator_good_record_and_tombstone():
    v = Validator(1000, lambda m: "" if m in (None, "m") else None)
    it = v.validate(FakeMessage(b"a", encode_document(Document("a", "  Cafe\u0301  ", "m")), 3, 41))
    assert isinstance(it, Item) and it.text == "Caf\u00e9" and it.source.offset == 41 and it.source.partition == 3
    assert isinstance(v.validate(FakeMessage(b"gone", None)), Delete)
