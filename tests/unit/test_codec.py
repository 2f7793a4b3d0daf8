"""Codec: round trips for both schemas, and every kind of bad input raises DecodeError with a reason."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import (
    SCHEMA_DIR,
    DecodeError,
    Document,
    Tombstone,
    decode_document,
    decode_embedding,
    encode_document,
    encode_embedding,
)
from tests.helpers import avro_long

texts = st.text(max_size=300)
maps = st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=5)
millis = st.integers(min_value=0, max_value=4_102_444_800_000)

documents = st.builds(
    Document,
    id=st.text(min_size=1, max_size=60),
    text=texts,
    model=st.one_of(st.none(), st.text(max_size=40)),
    metadata=maps,
    event_time=st.one_of(st.none(), millis),
)


@given(documents)
@settings(max_examples=200)
def test_document_avro_round_trip(doc):
    assert decode_document(doc.id.encode(), encode_document(doc)) == doc


@given(documents)
@settings(max_examples=100)
def test_document_json_round_trip(doc):
    raw = json.dumps({"id": doc.id, "text": doc.text, "model": doc.model, "metadata": doc.metadata,
                      "event_time": doc.event_time}).encode()
    assert decode_document(None, raw) == doc


embeddings = st.fixed_dictionaries({
    "id": st.text(min_size=1, max_size=40),
    "model": st.text(max_size=40),
    "dim": st.integers(1, 2048),
    "vector": st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=64),
    "content_hash": st.text(max_size=64),
    "cached": st.booleans(),
    "source_topic": st.text(max_size=30),
    "source_partition": st.integers(0, 2**31 - 1),
    "source_offset": st.integers(0, 2**63 - 1),
    "metadata": maps,
    "embedded_at": millis,
    "chunk_index": st.integers(0, 511),
    "chunk_count": st.integers(1, 512),
    "span_start": st.integers(0, 2**31 - 1),
    "span_end": st.integers(-1, 2**31 - 1),
    "event_time": st.one_of(st.none(), millis),
})


#: A learned sparse vector (EMBEDSTREAM_SPARSE): none, or (dimension, weight) pairs.
sparse_pairs = st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**31 - 1),
                                                      st.floats(width=32, allow_nan=False, allow_infinity=False)),
                                            max_size=20))


@given(embeddings, sparse_pairs)
@settings(max_examples=200)
def test_embedding_round_trip(rec, pairs):
    rec = {**rec, "sparse_indices": None if pairs is None else [i for i, _ in pairs],
           "sparse_values": None if pairs is None else [v for _, v in pairs]}
    assert decode_embedding(encode_embedding(rec)) == rec


def test_avro_longs_are_fastavros_bytes_at_the_edges_of_the_table():
    """``_long`` looks small values up in a table and builds the others: both are Avro's bytes."""
    import fastavro

    from schemas.codec import _long

    edges = [0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, -8193, 2**31, -(2**31), 2**63 - 1, -(2**63)]
    for n in edges + list(range(-9000, 9000, 7)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, "long", n)
        assert _long(n) == buf.getvalue(), n


def test_large_varints_built_from_tables_are_the_byte_by_byte_ones():
    """Varints past the small table are built 14 bits at a time: the same bytes, up to 64 bits."""
    import random

    from schemas.codec import _varint, _varint_bytes

    rng = random.Random(7)
    edges = [(1 << b) + d for b in (14, 21, 28, 35, 42, 49, 56, 63) for d in (-1, 0, 1)] + [2**64 - 1]
    for z in edges + list(range(0, 40_000, 3)) + [rng.getrandbits(rng.randint(1, 64)) for _ in range(20_000)]:
        assert _varint(z) == _varint_bytes(z), z


@given(embeddings, st.integers(1, 4), st.sampled_from(["<f4", ">f4", "<f8"]))
@settings(max_examples=200)
def test_the_sinks_writer_writes_the_bytes_of_encode_embedding(rec, chunks, dtype):
    """``EmbeddingWriter`` (a document's parts once, its chunks' around them) writes each record's
    bytes exactly as ``encode_embedding`` does from a dict, whatever the vector's dtype or layout."""
    import numpy as np

    from schemas.codec import EmbeddingWriter

    writer = EmbeddingWriter(rec["model"], rec["dim"])
    doc = writer.document(rec["id"], rec["source_topic"], rec["source_partition"], rec["source_offset"],
                          rec["metadata"], rec["embedded_at"], rec["chunk_count"], rec["event_time"])
    vectors = np.array([rec["vector"]] * chunks, dtype=np.float32).astype(dtype)
    if chunks > 1:
        vectors = np.asfortranarray(vectors)  # rows that are not contiguous
    for k in range(chunks):
        want = encode_embedding({**rec, "vector": np.asarray(rec["vector"], dtype=np.float32), "chunk_index": k,
                                 "cached": bool(k % 2)})
        got = writer.chunk(doc, vectors[k], rec["content_hash"], bool(k % 2), k, rec["span_start"],
                           rec["span_end"])
        assert got == want


def test_a_record_from_before_chunking_reads_as_one_whole_chunk():
    """The schema evolved compatibly: bytes written with the old schema resolve against the new one
    (the chunk fields take their defaults), and old readers skip the new fields."""
    import fastavro

    from schemas.codec import EMBEDDING_SCHEMA

    old_json = json.loads((SCHEMA_DIR / "embedding.avsc").read_text())
    old_json["fields"] = old_json["fields"][:11]  # the fields before chunking
    old = fastavro.parse_schema(old_json)
    rec = {"id": "a", "model": "m", "dim": 2, "vector": [0.6, 0.8], "content_hash": "h", "cached": False,
           "source_topic": "t", "source_partition": 0, "source_offset": 5, "metadata": {}, "embedded_at": 1000}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old, rec)
    got = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), old, EMBEDDING_SCHEMA)
    assert (got["chunk_index"], got["chunk_count"], got["span_start"], got["span_end"]) == (0, 1, 0, -1)
    new = encode_embedding({**rec, "chunk_index": 2, "chunk_count": 3, "span_start": 10, "span_end": 90})
    assert fastavro.schemaless_reader(io.BytesIO(new), old)["source_offset"] == 5


def test_sparse_fields_evolve_compatibly_both_ways():
    """The sparse fields (a learned sparse model's output) were added with null defaults, at the end:
    a record from before them reads with nulls, and a reader of the schema before them reads a new
    record with sparse vectors (its fields resolved, the new ones skipped)."""
    import fastavro

    from schemas.codec import EMBEDDING_SCHEMA

    before_json = json.loads((SCHEMA_DIR / "embedding.avsc").read_text())
    before_json["fields"] = before_json["fields"][:15]  # the fields before the sparse ones
    before = fastavro.parse_schema(before_json)
    rec = {"id": "a", "model": "m", "dim": 2, "vector": [0.6, 0.8], "content_hash": "h", "cached": False,
           "source_topic": "t", "source_partition": 0, "source_offset": 5, "metadata": {}, "embedded_at": 1000,
           "chunk_index": 1, "chunk_count": 2, "span_start": 3, "span_end": 9}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, before, rec)
    got = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), before, EMBEDDING_SCHEMA)
    assert (got["sparse_indices"], got["sparse_values"], got["span_end"]) == (None, None, 9)
    new = encode_embedding({**rec, "sparse_indices": [3, 70_000], "sparse_values": [0.5, 1.25]})
    assert decode_embedding(new)["sparse_indices"] == [3, 70_000]
    old_view = fastavro.schemaless_reader(io.BytesIO(new), EMBEDDING_SCHEMA, before)
    assert "sparse_indices" not in old_view and old_view["span_end"] == 9
    assert old_view["vector"] == pytest.approx([0.6, 0.8])


def test_event_time_evolves_compatibly_and_the_schema_header_names_the_writer():
    """``event_time`` was appended with a null default. A record an older release wrote (no
    ``embedstream.schema`` header) reads with it null, whichever of the older schemas wrote it; the
    header names the schema that wrote a record; a fingerprint no release wrote is a decode error."""
    import fastavro

    from schemas.codec import EMBEDDING_FIELD_HISTORY, EMBEDDING_FINGERPRINT, SCHEMA_HEADER

    full = json.loads((SCHEMA_DIR / "embedding.avsc").read_text())
    assert len(full["fields"]) == EMBEDDING_FIELD_HISTORY[-1] and full["fields"][-1]["name"] == "event_time"
    rec = {"id": "a", "model": "m", "dim": 2, "vector": [0.5, 0.25], "content_hash": "h", "cached": True,
           "source_topic": "t", "source_partition": 1, "source_offset": 5, "metadata": {"k": "v"},
           "embedded_at": 1000, "chunk_index": 1, "chunk_count": 2, "span_start": 3, "span_end": 9,
           "sparse_indices": None, "sparse_values": None}
    defaults = {"chunk_index": 0, "chunk_count": 1, "span_start": 0, "span_end": -1}
    for n in EMBEDDING_FIELD_HISTORY[:-1]:
        older = {**full, "fields": full["fields"][:n]}
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(older), rec)
        got = decode_embedding(buf.getvalue())
        kept = {f["name"] for f in older["fields"]}
        want = {**{k: v if k in kept else defaults.get(k) for k, v in rec.items()}, "event_time": None}
        assert got == want, n
        named = fastavro.schema.fingerprint(fastavro.schema.to_parsing_canonical_form(older), "CRC-64-AVRO")
        assert decode_embedding(buf.getvalue(), [(SCHEMA_HEADER, named.encode())]) == want
    new = encode_embedding({**rec, "event_time": 1_795_000_000_123})
    assert decode_embedding(new, [(SCHEMA_HEADER, EMBEDDING_FINGERPRINT.encode())])["event_time"] == 1_795_000_000_123
    # the hand-written bytes are fastavro's, the event time included
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(full), {**rec, "event_time": 1_795_000_000_123})
    assert new == buf.getvalue()
    with pytest.raises(DecodeError, match="upgrade the reader"):
        decode_embedding(new, [(SCHEMA_HEADER, b"0123456789abcdef")])


def test_tombstone():
    assert decode_document(b"doc-1", None) == Tombstone("doc-1")


def test_json_key_fills_missing_id_and_metadata_scalars_become_strings():
    doc = decode_document(b"k1", b'{"text": "hi", "metadata": {"n": 3, "ok": true, "s": "x"}}')
    assert doc == Document("k1", "hi", None, {"n": "3", "ok": "true", "s": "x"})


GOOD = encode_document(Document("a", "some text", None, {"k": "v"}, 1000))


@pytest.mark.parametrize(
    ("key", "value", "reason", "fragment"),
    [
        (b"a", GOOD[:-3], "decode_error", "truncated"),
        (b"a", GOOD + b"\x00\x01", "decode_error", "trailing"),
        (b"a", b"", "decode_error", "truncated"),
        (b"a", b'{"id": "a", "text": 5}', "decode_error", "'text' must be a string"),
        (b"a", b'{"id": [7], "text": "x"}', "decode_error", "'id'"),
        (b"a", b'{"id": 7, "text": "x"}', "id_mismatch", "key says id 'a'"),
        (b"k1", GOOD, "id_mismatch", "value says 'a'"),
        (b"a", b'{"id": "a", "text": "x", "metadata": [1]}', "decode_error", "metadata"),
        (b"a", b'{"id": "a", "text": "x", "event_time": "yesterday"}', "decode_error", "event_time"),
        (b"a", b'{"id": "a", "text": "\xff\xfe"}', "invalid_utf8", "UTF-8"),
        (None, b'{"id": "\\ud800x", "text": "t"}', "invalid_utf8", "lone surrogate"),
        (b"a", b'{"id": "a", "text": "x\\uDFFF"}', "invalid_utf8", "lone surrogate"),
        (b"a", b'{"id": "a", "text": "x", "metadata": {"k": "\\udc00"}}', "invalid_utf8", "lone surrogate"),
        (b"a", b"{not json", "decode_error", "not valid JSON"),
        (b"a", b'{"id": "a"', "decode_error", "not valid JSON"),
        (None, None, "decode_error", "without a key"),
        (b"\xff", None, "invalid_utf8", "key"),
    ],
)
def test_bad_inputs_raise_decode_error_with_reason(key, value, reason, fragment):
    with pytest.raises(DecodeError) as info:
        decode_document(key, value)
    assert info.value.reason == reason
    assert fragment in str(info.value)


def test_json_surrogate_pairs_and_escaped_backslashes_are_text():
    """Only a lone surrogate escape is refused (a str with one cannot be encoded to UTF-8, for the
    hash, the cache key or any write); a pair is one character, and ``\\\\ud800`` is a backslash."""
    assert decode_document(b"a", b'{"text": "\\ud83d\\ude00 ok"}').text == "\U0001F600 ok"
    assert decode_document(b"a", b'{"text": "\\\\ud800"}').text == "\\ud800"
    with pytest.raises(DecodeError) as info:
        decode_document(b'{"id": "\\ud800"}', b'{"text": "t"}', key_field="id")
    assert info.value.reason == "invalid_utf8" and "record key" in info.value.message


def test_non_object_json_is_rejected():
    # A JSON array starts with "[", so it is read as Avro and fails there; an object-looking
    # value that holds a list is rejected by the JSON path.
    for raw in (b"[1, 2]", b'"text"', b"42"):
        with pytest.raises(DecodeError) as info:
            decode_document(b"a", raw)
        assert info.value.reason == "decode_error"


def test_invalid_utf8_inside_avro_string():
    bad = encode_document(Document("a", "xy")).replace(b"xy", b"\xff\xfe")
    with pytest.raises(DecodeError) as info:
        decode_document(b"a", bad)
    assert info.value.reason == "invalid_utf8"


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_arbitrary_bytes_never_raise_anything_but_decode_error(raw):
    try:
        decode_document(b"k", raw)
    except DecodeError as exc:
        assert exc.reason in ("decode_error", "invalid_utf8") and str(exc)


@given(embeddings)
@settings(max_examples=200)
def test_hand_written_embedding_encoder_matches_fastavro(rec):
    import io

    import fastavro

    from schemas.codec import EMBEDDING_SCHEMA

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, EMBEDDING_SCHEMA, rec)
    assert encode_embedding(rec) == buf.getvalue()


# -- the hand-written document reader: the same fields as fastavro, or no answer at all -----------

def _fastavro_fields(value: bytes):
    """fastavro's reading of ``value`` as the reader's field tuple, or None where it refuses."""
    import fastavro

    from schemas.codec import _DOCUMENT_READER

    buf = io.BytesIO(value)
    try:
        rec = fastavro.schemaless_reader(buf, _DOCUMENT_READER)
    except Exception:
        return None
    if buf.tell() != len(value) or not isinstance(rec, dict):
        return None
    return rec["id"], rec["text"], rec["model"], dict(rec["metadata"] or {}), rec["event_time"]


any_longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(documents, any_longs)
@settings(max_examples=300)
def test_hand_reader_reads_every_valid_record_as_fastavro_does(doc, event_time):
    from schemas.document_reader import read_document

    for d in (doc, Document(doc.id, doc.text, doc.model, doc.metadata, event_time)):
        value = encode_document(d)
        assert read_document(value) == _fastavro_fields(value) == (d.id, d.text, d.model, d.metadata, d.event_time)


@given(documents, st.data())
@settings(max_examples=400)
def test_hand_reader_accepts_no_damaged_record_that_fastavro_refuses(doc, data):
    from schemas.document_reader import read_document

    value = bytearray(encode_document(doc))
    how = data.draw(st.sampled_from(["cut", "flip", "append"]))
    if how == "cut":
        value = value[: data.draw(st.integers(0, len(value) - 1))]
    elif how == "flip":
        value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.integers(0, 255))
    else:
        value += data.draw(st.binary(min_size=1, max_size=8))
    from schemas.document_reader import MetadataTooLarge

    try:
        mine = read_document(bytes(value))
    except MetadataTooLarge:  # a count past any valid row's: refused before its entries are read
        return
    assert mine is None or mine == _fastavro_fields(bytes(value))


def test_hand_reader_reads_a_map_written_in_sized_blocks():
    from schemas.codec import _long, _string
    from schemas.document_reader import read_document

    # id, text, model null, a map block of -2 entries with its byte size, a block of 1, end, no time
    entries = _string("a") + _string("1") + _string("b") + _string("2")
    value = (_string("doc") + _string("text") + _long(0) + _long(-2) + _long(len(entries)) + entries
             + _long(1) + _string("c") + _string("3") + _long(0) + _long(0))
    want = ("doc", "text", None, {"a": "1", "b": "2", "c": "3"}, None)
    assert read_document(value) == _fastavro_fields(value) == want
    assert read_document(value + b"\x00") is None
    no_branch_2 = _string("doc") + _string("text") + _long(2)  # the model union has branches 0 and 1
    assert read_document(no_branch_2) is None


def test_json_nesting_is_bounded_the_same_on_every_stack():
    """Past ``MAX_JSON_DEPTH`` levels a JSON value or key is ``decode_error`` whatever the caller's
    stack depth (Python's parser is recursive: its own limit depends on it); brackets inside strings
    do not count."""
    from schemas.codec import MAX_JSON_DEPTH

    def nested(levels: int) -> bytes:  # the value's object and its metadata are two of the levels
        inner = b"[" * (levels - 2) + b"]" * (levels - 2)
        return b'{"id": "k", "text": "[[[[ {{{{ in a string", "metadata": {"m": ' + inner + b"}}"

    assert decode_document(b"k", nested(MAX_JSON_DEPTH)).metadata["m"].count("[") == MAX_JSON_DEPTH - 2
    for levels in (MAX_JSON_DEPTH + 1, 10_000):
        with pytest.raises(DecodeError) as info:
            decode_document(b"k", nested(levels))
        assert info.value.reason == "decode_error" and f"over {MAX_JSON_DEPTH} levels" in info.value.message
    with pytest.raises(DecodeError) as key:
        decode_document(b'{"id": ' + b"[" * 200 + b"]" * 200 + b"}", b'{"text": "t"}', key_field="id")
    assert key.value.reason == "decode_error"


def test_a_schemaless_record_of_a_million_empty_map_entries_is_refused_before_they_are_read():
    """1 MB of empty metadata entries (2 bytes each: one key in the end) cost the polling thread 20
    times the same JSON: past ``MAX_METADATA_ENTRIES`` the record is ``metadata_too_large`` at once."""
    from schemas.document_reader import MAX_METADATA_ENTRIES

    def record(entries: int, blocked: bool = False) -> bytes:
        count = avro_long(-entries if blocked else entries)
        size = avro_long(2 * entries) if blocked else b""
        return b"\x02a\x02t\x00" + count + size + b"\x00\x00" * entries + b"\x00\x00"

    for blocked in (False, True):  # before: read whole, one entry in the end, a valid document
        with pytest.raises(DecodeError) as refused:
            decode_document(b"a", record(500_000, blocked))
        assert refused.value.reason == "metadata_too_large"
    doc = decode_document(b"a", record(MAX_METADATA_ENTRIES))
    assert doc.metadata == {"": ""}


