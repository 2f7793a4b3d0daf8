"""Fuzzing the decoders: whatever the bytes, each decoder returns a value or a dead letter.

The contract under test: ``decode_document`` and ``key_id`` raise :class:`DecodeError` (a reason
from the contract, and a message) and nothing else; :meth:`Validator.validate` never raises and
returns an entry, a dead letter carrying one of the contract's reasons. Inputs are built to reach
past the first check: valid documents with a byte flipped or cut, JSON of every shape (nested deep,
lone surrogates, wrong types), registry frames with known and random schema ids, CDC key envelopes
with fields missing or extra.

The cases hypothesis found are kept as ``@example`` beside each test (what each one broke is said
there), so they run every time whatever the example database holds.
"""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from connectors.registry import SchemaRegistry, client_conf, frame
from schemas.codec import (
    DOCUMENT_SCHEMA_TEXT,
    DecodeError,
    Document,
    Tombstone,
    decode_document,
    encode_document,
    key_id,
)
from tests.helpers import registry_serializer
from tools.memory_source import MemoryMessage
from tools.registry import make_server
from worker.core.records import DeadLetter, Delete, Item
from worker.steps.polling.dlq_limit import HINTS
from worker.steps.polling.validate import Validator

REASONS = set(HINTS)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: JSON nested 10,000 deep: Python's parser is recursive and raised RecursionError past the decoder
#: (found first; one such record stopped the worker).
DEEP_VALUE = b'{"id": "a", "text": "t", "metadata": {"m": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}"
DEEP_KEY = b'{"schema": {}, "payload": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
#: An integer of 5,000 digits: Python's parser raises ValueError past 4,300 digits, which was caught by
#: nobody (only JSONDecodeError was): the worker exited, restarted, read the same record, exited again.
HUGE_INT = b'{"id": "k", "text": "t", "event_time": ' + b"9" * 5_000 + b"}"
#: Escaped quotes, then brackets: the nesting check's backtracking pattern was tried again from every
#: quote (96 KB of this held the polling thread for a minute).
BACKTRACKING = b'{"id": "k", "text": "' + b'\\"' * 48_000 + b"[" * 101
#: An event time Avro's long cannot carry.
WIDE_TIME = b'{"id": "k", "text": "t", "event_time": ' + str(2**70).encode() + b"}"

json_leaves = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
field_values = json_values | st.sampled_from(["\ud800", "a\udfffb", "", " \n\t"])  # lone surrogates, blanks


@st.composite
def json_documents(draw) -> bytes:
    """A JSON object with some of the document's fields, each of the right type or not, maybe more."""
    obj = {}
    for name, right in (("id", st.just("k") | st.text(max_size=30)), ("text", st.text(max_size=60)),
                        ("model", st.none() | st.text(max_size=10)), ("event_time", st.integers(0, 2**41)),
                        ("metadata", st.dictionaries(st.text(max_size=5), json_values, max_size=3))):
        if draw(st.integers(0, 3)):  # mostly present, mostly of the right type: to reach past the first check
            obj[name] = draw(right if draw(st.integers(0, 3)) else field_values)
    obj.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    depth = draw(st.sampled_from([0, 0, 0, 50, 2_000, 10_000]))
    if depth:
        text = text[:-1] + (", " if len(obj) else "") + '"deep": ' + "[" * depth + "]" * depth + "}"
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw, base: bytes) -> bytes:
    """``base`` with a few bytes flipped, cut short or extended."""
    data = bytearray(base)
    for _ in range(draw(st.integers(0, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=8))


avro_documents = st.builds(lambda i, t, m: encode_document(Document(i, t, None, m)),
                           st.text(max_size=20), st.text(min_size=1, max_size=40),
                           st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
values = (st.none() | st.binary(max_size=300) | json_documents()
          | avro_documents.flatmap(mutated) | json_documents().flatmap(mutated)
          | st.binary(max_size=200).map(lambda b: b"\x00" + b))
key_objects = st.dictionaries(st.sampled_from(["id", "schema", "payload", "x"]), json_values, max_size=3)
keys = (st.just(b"k") | st.just(b"k") | st.none() | st.binary(max_size=60) | st.text(max_size=40).map(str.encode)
        | st.builds(lambda obj: json.dumps(obj).encode(), key_objects)
        | st.builds(lambda payload, schema: json.dumps({"schema": schema, "payload": payload}).encode(),
                    st.dictionaries(st.sampled_from(["id", "other"]), json_values, max_size=2), json_values))


@given(key=keys, value=values, key_field=st.sampled_from([None, "id"]))
@FUZZ
@example(key=b"k", value=DEEP_VALUE, key_field=None)
@example(key=DEEP_KEY, value=b'{"text": "t"}', key_field="id")
@example(key=b"k", value=b'{"id": "k", "text": "\\ud800"}', key_field=None)  # a lone surrogate: invalid_utf8
@example(key=b"k", value=HUGE_INT, key_field=None)
@example(key=HUGE_INT, value=b'{"text": "t"}', key_field="id")
@example(key=b"k", value=BACKTRACKING, key_field=None)
@example(key=b"k", value=WIDE_TIME, key_field=None)
def test_decode_document_returns_a_document_or_raises_decode_error(key, value, key_field):
    try:
        doc = decode_document(key, value, key_field=key_field)
    except DecodeError as exc:
        assert exc.reason in REASONS and exc.message
        event(exc.reason)
        return
    event(type(doc).__name__)
    assert isinstance(doc, (Document, Tombstone)) and doc.id
    if isinstance(doc, Document):
        assert isinstance(doc.text, str)
        doc.id.encode("utf-8"), doc.text.encode("utf-8")  # no lone surrogates got through  # noqa: B018


@given(key=keys, key_field=st.sampled_from([None, "id"]))
@FUZZ
@example(key=DEEP_KEY, key_field="id")
def test_key_id_returns_an_id_or_raises_decode_error(key, key_field):
    try:
        kid = key_id(key, key_field)
    except DecodeError as exc:
        assert exc.reason in REASONS and exc.message
        return
    assert kid is None or (isinstance(kid, str) and kid)


# -- through the registry and the validator: what the polling thread runs --------------------------
#: A writer schema whose array holds items of no bytes: a few bytes claim 2^62 of them (fastavro stepped
#: through them on the polling thread, its memory growing without end).
EMPTY_ITEMS = json.dumps({"type": "record", "name": "Doc", "fields": [
    {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
    {"name": "pad", "type": {"type": "array", "items": "null"}, "default": []}]})


@pytest.fixture(scope="module")
def registry():
    """The development registry in a thread, with our document schema registered as id ``known``, and
    the frame of a record written with :data:`EMPTY_ITEMS` whose array claims 2^62 nulls."""
    server = make_server(0, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reg = SchemaRegistry(client_conf(f"http://127.0.0.1:{server.server_address[1]}", {}), DOCUMENT_SCHEMA_TEXT)
    framed = registry_serializer(reg.client, DOCUMENT_SCHEMA_TEXT, "docs")({"id": "a", "text": "framed text"})
    honest = registry_serializer(reg.client, EMPTY_ITEMS, "docs-empty")({"id": "a", "text": "t", "pad": []})
    # the array's count, zig-zag encoded, in place of the empty array's single 0 byte
    huge = honest[:-1] + bytes([0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]) + b"\x00"
    REGISTRY_SEEDS[:] = [huge]
    yield reg, framed
    server.shutdown()
    server.server_close()


#: Frames built by the ``registry`` fixture to hurt (filled when it starts).
REGISTRY_SEEDS: list[bytes] = []


@st.composite
def framed_values(draw, known: bytes) -> bytes:
    """A registry frame: the known schema's record mutated, a seed built to hurt, or a random id with a
    random body."""
    if REGISTRY_SEEDS and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(REGISTRY_SEEDS))
    if draw(st.booleans()):
        return draw(mutated(known))
    return frame(draw(st.integers(0, 2**32 - 1))) + draw(st.binary(max_size=60))


@given(data=st.data(), key_field=st.sampled_from([None, "id"]))
@FUZZ
def test_the_validator_turns_any_record_into_an_entry(registry, data, key_field):
    reg, known = registry
    value = data.draw(values | framed_values(known))
    key = data.draw(keys | framed_values(known))
    headers = data.draw(st.none() | st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=40)),
                                             max_size=3))
    validator = Validator(4096, lambda name: "m" if name in (None, "m") else None, registry=reg, key_field=key_field)
    msg = MemoryMessage(key, value, headers=headers)
    validator.resolve_schemas([msg])
    entry = validator.validate(msg)
    assert isinstance(entry, (Item, Delete, DeadLetter))
    event(entry.reason if isinstance(entry, DeadLetter) else type(entry).__name__)  # --hypothesis-show-statistics
    if isinstance(entry, DeadLetter):
        assert entry.reason in REASONS and entry.message
        assert (entry.key, entry.value, entry.headers) == (key, value, headers)  # kept as it came
        # the decoders name every failure themselves: the validator's last guard is never what caught it
        assert not entry.message.startswith("the record could not be read"), entry.message


def test_a_writer_schema_whose_arrays_hold_items_of_no_bytes_is_refused_before_any_record_is_read(registry):
    reg, _ = registry
    [huge] = REGISTRY_SEEDS
    validator = Validator(4096, lambda name: "m", registry=reg)
    msg = MemoryMessage(b"a", huge)
    validator.resolve_schemas([msg])
    dead = validator.validate(msg)
    assert isinstance(dead, DeadLetter) and dead.reason == "incompatible_schema"
    assert "array of null" in dead.message and "2^62" in dead.message


@pytest.mark.parametrize("value", [HUGE_INT, BACKTRACKING, WIDE_TIME, DEEP_VALUE])
def test_each_record_built_to_hurt_the_polling_thread_is_a_decode_error(value):
    dead = Validator(1_000_000, lambda name: "m").validate(MemoryMessage(b"k", value))
    assert isinstance(dead, DeadLetter) and dead.reason == "decode_error", dead


def test_a_failure_no_decoder_names_is_still_a_dead_letter_naming_its_type(monkeypatch):
    """The last guard: whatever a decoder's gap raises (here a RuntimeError from deep inside), the
    record is dead-lettered ``decode_error`` with the exception's type, and the worker goes on."""
    import worker.steps.polling.validate as validate

    def broken(*_args, **_kw):
        raise RuntimeError("a gap")

    monkeypatch.setattr(validate, "decode_document", broken)
    dead = Validator(4096, lambda name: "m").validate(MemoryMessage(b"k", b'{"text": "t"}'))
    assert isinstance(dead, DeadLetter) and dead.reason == "decode_error" and "RuntimeError: a gap" in dead.message


csv_cells = (st.text(max_size=30) | st.sampled_from(['"', '""', '"a,b"', "\r\n", "x" * 300, "é"])
             | st.binary(max_size=20).map(lambda b: b.decode("latin-1")))


@given(rows=st.lists(st.lists(csv_cells, min_size=0, max_size=5), max_size=6), junk=st.binary(max_size=40),
       limit=st.sampled_from([100, 1_000_000]))
@FUZZ
def test_produce_reads_any_csv_as_documents_or_bad_lines(tmp_path_factory, rows, junk, limit):
    """A CSV file of any cells (quotes, line breaks, fields over the limit, bytes that are not UTF-8)
    gives documents and skipped lines, never an exception past the header."""
    from worker.commands.produce import BadLine, read_documents

    body = "id,text,meta\n" + "\n".join(",".join(r) for r in rows)
    path = tmp_path_factory.mktemp("csv") / "docs.csv"
    path.write_bytes(body.encode("utf-8", "surrogatepass") + junk)
    for _, got in read_documents(path, field_limit=limit):
        assert isinstance(got, (Document, BadLine))
        if isinstance(got, Document):
            got.id.encode("utf-8"), got.text.encode("utf-8")  # noqa: B018
