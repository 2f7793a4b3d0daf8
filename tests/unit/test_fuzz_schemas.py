"""Fuzzing the writer schemas: whatever a registry answers for an id, the validator stays cheap and whole.

A producer chooses the writer schema its records are read with, so a registry's answer is input like
a record's bytes. The contract under test: with a registry that stores any schema it is given (a lax
one, as a registry that checks nothing would be), :meth:`Validator.resolve_schemas` raises nothing but
``TransientError``, :meth:`Validator.validate` returns an entry, and a record under 100 bytes costs
at most a few milliseconds of the polling thread's CPU, whatever the schema: deep, recursive, names
that clash across namespaces, aliases, unions, logical types, references, other schema types.
"""

from __future__ import annotations

import gc
import io
import json
import threading
import time
import urllib.request
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from connectors.registry import SchemaRegistry, client_conf, frame
from schemas.codec import DOCUMENT_SCHEMA_TEXT
from tests.helpers import avro_long
from tools.memory_source import MemoryMessage
from tools.registry import make_server
from worker.core.records import DeadLetter, Delete, Item
from worker.steps.polling.dlq_limit import HINTS
from worker.steps.polling.validate import Validator

REASONS = set(HINTS)
#: A schema the guard misses holds the validator for ever: a hang is a failure here, soon.
pytestmark = pytest.mark.timeout(120)
#: CPU seconds the polling thread may spend validating one record under 100 bytes (a schema already
#: fetched and parsed; the least of three tries): stepping through a million zero-byte items takes about
#: a quarter second, a normal record tens of microseconds.
MAX_CPU_S = 0.020
#: A count of 2^62 - 1 items, as Avro writes a long (zig-zag varint).
HUGE_COUNT = bytes([0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F])


def _avro_string(s: str) -> bytes:
    raw = s.encode()
    return avro_long(len(raw)) + raw




#: The decoy: ``inner``'s array of ``"E"`` resolves (enclosing namespace first) to the empty ``a.E``,
#: while a first-come table of short names took it for ``b.E``, which has a field.
DECOY = {"type": "record", "name": "Document", "namespace": "io.embedstream", "fields": [
    {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
    {"name": "pad", "type": {"type": "record", "name": "E", "namespace": "b",
                             "fields": [{"name": "s", "type": "string"}]}},
    {"name": "inner", "type": {"type": "record", "name": "Inner", "namespace": "a", "fields": [
        {"name": "e", "type": {"type": "record", "name": "E", "fields": []}},
        {"name": "items", "type": {"type": "array", "items": "E"}}]}}]}
#: id, text, pad.s, inner.e (no bytes), then the array's count.
DECOY_BODY = _avro_string("d1") + _avro_string("decoy") + _avro_string("p") + HUGE_COUNT + b"\x00"


def _deep_arrays(depth: int) -> str:
    """A record whose field nests ``depth`` arrays, as text (Python's JSON encoder recurses too)."""
    node = '{"type": "array", "items": ' * depth + '"string"' + "}" * depth
    return ('{"type": "record", "name": "Deep", "fields": [{"name": "id", "type": "string"}, '
            '{"name": "text", "type": "string"}, {"name": "d", "type": ' + node + "}]}")


NAMES = st.sampled_from(["E", "Inner", "Document", "R", "a.E", "b.E", "io.embedstream.Document"])
SPACES = st.none() | st.sampled_from(["a", "b", "io.embedstream", ""])
PRIMITIVES = st.sampled_from(["null", "boolean", "int", "long", "float", "double", "bytes", "string"])
LOGICAL = st.sampled_from([{"type": "long", "logicalType": "timestamp-millis"},
                           {"type": "string", "logicalType": "uuid"},
                           {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2},
                           {"type": "int", "logicalType": "date"}])


def _types(inner: st.SearchStrategy) -> st.SearchStrategy:
    field = st.fixed_dictionaries({"name": st.sampled_from(["id", "text", "x", "y", "z"]), "type": inner},
                                  optional={"aliases": st.lists(st.sampled_from(["id", "text", "body"]), max_size=2),
                                            "default": st.none()})
    record = st.fixed_dictionaries({"type": st.sampled_from(["record", "error"]), "name": NAMES,
                                    "fields": st.lists(field | st.builds(dict), max_size=4)},
                                   optional={"namespace": SPACES, "aliases": st.lists(NAMES, max_size=2)})
    return (record
            | st.builds(lambda t: {"type": "array", "items": t}, inner)
            | st.builds(lambda t: {"type": "map", "values": t}, inner)
            | st.lists(inner, min_size=1, max_size=3)  # a union
            | st.builds(lambda n, s: {"type": "fixed", "name": n, "size": s}, NAMES, st.integers(0, 2))
            | st.builds(lambda n: {"type": "enum", "name": n, "symbols": ["A", "B"]}, NAMES))


writer_types = st.recursive(PRIMITIVES | NAMES | LOGICAL, _types, max_leaves=12)
writer_schemas = st.builds(
    lambda extra, ns: {"type": "record", "name": "Document", **({"namespace": ns} if ns else {}), "fields": [
        {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
        *({"name": f"f{i}", "type": t} for i, t in enumerate(extra))]},
    st.lists(writer_types, max_size=3), SPACES) | writer_types


@pytest.fixture(scope="module")
def lax():
    """A registry that stores whatever it is given, and a function registering a schema there: its id."""
    server = make_server(0, None, lax=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def register(schema: Any, schema_type: str | None = None, subject: str = "fuzz", **extras: Any) -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body = {"schema": text, **({"schemaType": schema_type} if schema_type else {}), **extras}
        req = urllib.request.Request(f"{url}/subjects/{subject}/versions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["id"]

    yield url, register
    server.shutdown()
    server.server_close()


def _validator(url: str) -> Validator:
    return Validator(4096, lambda name: "m" if name in (None, "m") else None,
                     registry=SchemaRegistry(client_conf(url, {}), DOCUMENT_SCHEMA_TEXT))


def _honest_body(schema: Any) -> bytes | None:
    """A record fastavro writes with ``schema``, if it parses and writes (else None)."""
    try:
        parsed = fastavro.parse_schema(schema)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, next(iter(fastavro.utils.generate_many(parsed, 1))))
        return buf.getvalue()
    except Exception:
        return None


def _check(validator: Validator, value: bytes) -> DeadLetter | Item | Delete:
    msg = MemoryMessage(b"k", value)
    validator.resolve_schemas([msg])
    validator.validate(MemoryMessage(b"k", value))  # the first read of a schema parses it: not timed
    spent = float("inf")
    gc.disable()  # a collection of hypothesis' garbage is not the validator's time
    try:
        for _ in range(3):  # the least of three: a busy host's noise is not the validator's either
            t0 = time.thread_time()
            entry = validator.validate(msg)
            spent = min(spent, time.thread_time() - t0)
    finally:
        gc.enable()
    assert isinstance(entry, (Item, Delete, DeadLetter))
    if isinstance(entry, DeadLetter):
        assert entry.reason in REASONS and entry.message
        assert not entry.message.startswith("the record could not be read"), entry.message
    if len(value) < 100:
        assert spent <= MAX_CPU_S, f"{spent * 1000:.1f} ms of CPU for a {len(value)}-byte record"
    return entry


FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


@given(schema=writer_schemas, schema_type=st.none() | st.sampled_from(["AVRO", "JSON", "PROTOBUF", "avro"]),
       data=st.data())
@FUZZ
@example(schema=DECOY, schema_type=None, data=None)
@example(schema={"type": "record", "name": "J", "fields": [{"type": "string"}]}, schema_type="JSON", data=None)
@example(schema={"type": "record", "name": "J", "fields": [{"type": "string"}]}, schema_type=None, data=None)
def test_any_writer_schema_gives_entries_at_a_bounded_cost(lax, schema, schema_type, data):
    url, register = lax
    sid = register(schema, schema_type)
    validator = _validator(url)
    bodies = [DECOY_BODY, b"", b"\x02a\x02b" + HUGE_COUNT + b"\x00"]
    honest = _honest_body(schema)
    if honest is not None:
        bodies.append(honest[:95])
        for at in range(0, min(len(honest), 40), 3):  # a huge count where a count might be
            bodies.append((honest[:at] + HUGE_COUNT + honest[at + 1:])[:99])
    if data is not None:
        bodies.append(data.draw(st.binary(max_size=90)))
    for body in bodies:
        _check(validator, frame(sid) + body)


def test_the_decoy_namespace_is_resolved_as_avro_resolves_it(lax):
    url, register = lax
    dead = _check(_validator(url), frame(register(DECOY)) + DECOY_BODY)
    assert isinstance(dead, DeadLetter) and dead.reason == "incompatible_schema"
    assert "a.E" in dead.message and "2^62" in dead.message


@pytest.mark.parametrize("schema, schema_type, fragment", [
    (_deep_arrays(990), None, "nests deeper than"),
    ({"type": "record", "name": "J", "fields": [{"type": "string"}]}, "JSON", "Avro schemas only"),
    ({"type": "record", "name": "J", "fields": [{"type": "string"}]}, None, "could not be read as an Avro"),
    ("[" * 5000 + "]" * 5000, None, "nests deeper than"),
    ('{"type": "record", "name": "X", "fields": [' + '{"name": "f", "type": "string"},' * 40_000 + "]}",
     None, "characters, over the"),
    # found by the fuzzing above: a record that must hold itself, read by recursing in C without a byte
    # read, until the stack overflowed and the process died (a segfault, no exception to catch)
    ({"type": "error", "name": "Inner", "fields": [{"name": "text", "type": {
        "name": "E", "type": "record", "fields": [{"name": "text", "type": "E"}]}}]}, "AVRO", "holds itself"),
    # a linked list: each level a byte, so a record of 1 MB nests a million levels deep in C
    ({"type": "record", "name": "Document", "fields": [{"name": "id", "type": "string"},
                                                       {"name": "text", "type": "string"},
                                                       {"name": "next", "type": ["null", "Document"]}]},
     None, "holds itself"),
])
def test_a_schema_no_reader_should_walk_is_refused_once_for_its_id(lax, schema, schema_type, fragment):
    url, register = lax
    sid = register(schema, schema_type)
    validator = _validator(url)
    for _ in range(2):
        dead = _check(validator, frame(sid) + b"\x02a\x02b")
        assert isinstance(dead, DeadLetter) and dead.reason == "incompatible_schema", dead
        assert fragment in dead.message
    assert sid in validator.registry._refused  # decided once, cached


def test_references_are_followed_as_the_deserializer_follows_them_and_cycles_end(lax):
    url, register = lax
    register({"type": "record", "name": "Empty", "namespace": "r", "fields": []}, subject="refs")  # version 1
    writer = {"type": "record", "name": "Document", "fields": [
        {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
        {"name": "xs", "type": {"type": "array", "items": "r.Empty"}}]}
    sid = register(writer, references=[{"name": "r.Empty", "subject": "refs", "version": 1}])
    dead = _check(_validator(url), frame(sid) + b"\x02a\x02b" + HUGE_COUNT + b"\x00")
    assert isinstance(dead, DeadLetter) and dead.reason == "incompatible_schema" and "2^62" in dead.message
    # a reference to itself (version 1 of its own subject): fetched MAX_REFERENCES times, then refused
    me = register(writer, subject="cycle", references=[{"name": "r.Empty", "subject": "cycle", "version": 1}])
    dead = _check(_validator(url), frame(me) + b"\x02a\x02b\x00")
    assert isinstance(dead, DeadLetter) and dead.reason == "incompatible_schema"
    assert "references more than" in dead.message
    gone = register(writer, references=[{"name": "r.Empty", "subject": "nowhere", "version": 3}])
    dead = _check(_validator(url), frame(gone) + b"\x02a\x02b\x00")
    assert isinstance(dead, DeadLetter) and "does not know" in dead.message


@pytest.mark.parametrize("items", ["float", "double", {"type": "fixed", "name": "F", "size": 16},
                                   {"type": "array", "items": "float"}])
def test_a_huge_count_of_fixed_size_items_in_a_field_we_do_not_read_is_a_dead_letter_at_once(lax, items):
    """Resolving against our schema skips the writer's other fields, and fastavro skips a float (a
    double, a ``fixed``) by seeking, never looking for the end: 2^62 of them claimed in ten bytes held
    the polling thread for ever (found by this module's fuzzing). The record is read whole with its
    writer schema first, where every item takes its bytes."""
    url, register = lax
    writer = {"type": "record", "name": "Document", "fields": [
        {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
        {"name": "extra", "type": {"type": "array", "items": items}}]}
    dead = _check(_validator(url), frame(register(writer)) + b"\x02a\x02b" + HUGE_COUNT + b"\x00")
    assert isinstance(dead, DeadLetter) and dead.reason == "decode_error"
