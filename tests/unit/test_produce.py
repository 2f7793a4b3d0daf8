"""Reading documents from JSONL, CSV and plain-text files; producing gives up within its deadline."""

from __future__ import annotations

import time

import pytest

from schemas.codec import Document
from schemas.errors import TransientError
from worker.commands.produce import BadLine, detect_format, produce_records, read_documents, text_id


def test_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "text": "one", "metadata": {"k": "v"}}\n\n{"id": "b", "text": "two"}\n')
    assert [d for _, d in read_documents(p)] == [Document("a", "one", None, {"k": "v"}), Document("b", "two")]


def test_jsonl_bad_line_has_its_number(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": 3}\n[1]\n')
    got = list(read_documents(p))
    assert isinstance(got[1][1], BadLine) and got[1][1].line == 2 and "text" in str(got[1][1])
    assert isinstance(got[2][1], BadLine) and got[2][1].line == 3


def test_csv_extra_columns_become_metadata(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text('id,text,lang\n1,"hello, world",en\n2,bonjour,fr\n')
    docs = [d for _, d in read_documents(p)]
    assert docs == [Document("1", "hello, world", None, {"lang": "en"}), Document("2", "bonjour", None, {"lang": "fr"})]


def test_csv_without_text_column_is_an_error(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("id,body\n1,x\n")
    with pytest.raises(BadLine, match="'text' column"):
        list(read_documents(p))


def test_csv_ragged_row(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("id,text\n1,a,extra\n2,b\n")
    got = list(read_documents(p))
    assert isinstance(got[0][1], BadLine) and got[1][1] == Document("2", "b")


def test_plain_text_ids_are_stable_hashes(tmp_path):
    p = tmp_path / "d.txt"
    p.write_bytes(b"first line\n\nsecond line\r\n\xff bad\n")
    got = list(read_documents(p))
    assert got[0] == (1, Document(text_id("first line"), "first line"))
    assert got[1] == (3, Document(text_id("second line"), "second line"))
    assert isinstance(got[2][1], BadLine) and got[2][1].line == 4
    assert text_id("first line") == text_id("first line") != text_id("second line")


def test_detect_format(tmp_path):
    assert [detect_format(tmp_path / n) for n in ("a.jsonl", "a.ndjson", "a.CSV", "a.txt", "a")] == [
        "jsonl", "jsonl", "csv", "text", "text"]


def test_produce_records_gives_up_within_its_deadline_when_no_broker_answers():
    t0 = time.monotonic()
    with pytest.raises(TransientError):
        produce_records({"bootstrap.servers": "127.0.0.1:1"}, "t", [("k", b"v")], delivery_timeout_s=1)
    assert time.monotonic() - t0 < 10


def test_a_csv_field_over_the_limit_or_bytes_that_are_not_utf8_skip_their_row_with_the_reason(tmp_path):
    """Python's csv module stops at a field over 131,072 characters and a text-mode read at the first
    byte that is not UTF-8: each is a skipped row with its reason, and the rows after it are read."""
    p = tmp_path / "docs.csv"
    p.write_bytes(b"id,text,lang\n"
                  b"a,first,en\n"
                  b"big," + b"x" * 300_000 + b",en\n"
                  b"bad,caf\xe9 au lait,fr\n"
                  b"c,last,en\n")
    got = list(read_documents(p, field_limit=200_000))
    docs = [d for _, d in got if not isinstance(d, BadLine)]
    bad = [d for _, d in got if isinstance(d, BadLine)]
    assert [d.id for d in docs] == ["a", "c"]
    assert len(bad) == 2 and "200,000" in str(bad[0]) and "UTF-8" in str(bad[1])
    assert [d.id for _, d in read_documents(p, field_limit=1_000_000) if not isinstance(d, BadLine)] == ["a", "big",
                                                                                                        "c"]
