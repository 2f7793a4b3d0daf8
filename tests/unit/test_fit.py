"""A dead letter always fits its topic: cut where it must be, with what was cut said in headers."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.records import DeadLetter, Source
from worker.steps.writing.fit import TopicLimits, dead_letter_record, output_room, record_size

CONTRACT = ("embedstream.error.reason", "embedstream.error.message", "embedstream.source.topic",
            "embedstream.source.partition", "embedstream.source.offset")


def _dead(key, value, headers=None, message="why") -> DeadLetter:
    return DeadLetter(Source("docs", 4, 99), key, value, headers, "decode_error", message)


def test_a_dead_letter_that_fits_is_its_original_record_with_the_contract_headers():
    key, value, headers = dead_letter_record(_dead(b"k", b"v", [("trace", b"1")]), 1_000_000)
    assert (key, value) == (b"k", b"v")
    assert [n for n, _ in headers] == ["trace", *CONTRACT]


def test_a_producers_own_embedstream_headers_never_pass_for_the_workers():
    """A producer that writes ``embedstream.error.reason`` (or a replay of a dead letter, which carries the
    worker's earlier headers) cannot put its values ahead of the worker's: they are renamed."""
    forged = [("embedstream.error.reason", b"empty_text"), ("EmbedStream.Source.Offset", b"0"), ("trace", b"1")]
    _, _, headers = dead_letter_record(_dead(b"k", b"v", forged), 1_000_000)
    assert [n for n, _ in headers] == ["embedstream.original.error.reason", "embedstream.original.Source.Offset",
                                       "trace", *CONTRACT]
    assert [v for n, v in headers if n == "embedstream.error.reason"] == [b"decode_error"]


def test_a_one_megabyte_key_and_two_megabyte_value_fit_the_default_limit():
    big_key, big_value = b"K" * 1_000_000, b"V" * 2_000_000
    key, value, headers = dead_letter_record(_dead(big_key, big_value), 1_000_000)
    assert record_size(key, value, headers) <= 1_000_000
    h = dict(headers)
    assert h["embedstream.error.truncated"] == b"key,value"
    assert h["embedstream.error.original_key_size"] == b"1000000"
    assert h["embedstream.error.original_value_size"] == b"2000000"
    assert h["embedstream.error.original_key_sha256"] == hashlib.sha256(big_key).hexdigest().encode()
    assert h["embedstream.error.original_value_sha256"] == hashlib.sha256(big_value).hexdigest().encode()
    assert big_key.startswith(key) and big_value.startswith(value)
    assert len(key) >= 200_000 and len(value) >= 500_000  # most of the room is used


def test_a_small_value_leaves_its_room_to_a_large_key():
    key, value, _ = dead_letter_record(_dead(b"K" * 1_000_000, b"v"), 1_000_000)
    assert value == b"v" and len(key) > 900_000


def test_a_tombstone_dead_letter_stays_a_tombstone():
    key, value, headers = dead_letter_record(_dead(b"K" * 2_000_000, None), 1_000_000)
    assert value is None and dict(headers)["embedstream.error.truncated"] == b"key"


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(st.none(), st.integers(0, 300_000)), value=st.one_of(st.none(), st.integers(0, 300_000)),
       header_sizes=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60_000)), max_size=8),
       message=st.text(max_size=6000), limit=st.integers(16_384, 400_000))
def test_any_dead_letter_fits_any_limit_and_keeps_its_reason(key, value, header_sizes, message, limit):
    headers = [(f"h{i}" + "x" * n, b"y" * size) for i, (n, size) in enumerate(header_sizes)]
    d = _dead(None if key is None else b"k" * key, None if value is None else b"v" * value, headers, message)
    out_key, out_value, out_headers = dead_letter_record(d, limit)
    assert record_size(out_key, out_value, out_headers) <= limit
    h = dict(out_headers)
    assert all(name in h for name in CONTRACT) and h["embedstream.error.reason"] == b"decode_error"
    assert (out_key is None) == (d.key is None) and (out_value is None) == (d.value is None)
    assert (d.key or b"").startswith(out_key or b"") and (d.value or b"").startswith(out_value or b"")
    cut = "embedstream.error.truncated" in h
    assert cut == (record_size(d.key, d.value, [*headers, *dead_letter_record(d, 10**9)[2][len(headers):]]) > limit)
    if cut:
        parts = set(h["embedstream.error.truncated"].decode().split(","))
        assert ("key" in parts) == (out_key != d.key) and ("value" in parts) == (out_value != d.value)
        assert h["embedstream.error.original_value_size"] == str(len(d.value or b"")).encode()


def test_limits_are_the_smaller_of_the_producer_and_the_topic():
    assert TopicLimits.of(1_000_000, 4_194_304, None) == TopicLimits(output=1_000_000, dlq=1_000_000)
    assert TopicLimits.of(5_000_000, 4_194_304, 100_000) == TopicLimits(output=4_194_304, dlq=100_000)


def test_output_room_leaves_space_for_the_vector_in_any_format():
    assert output_room(384, 1_000_000) > 100_000
    assert output_room(4096, 50_000) == 0
    with pytest.raises(ValueError):
        dead_letter_record(_dead(b"k" * 10_000, b"v"), 900)  # not even the headers fit
