"""Schema registry support without a stack: the development registry's REST subset and compatibility
checks (driven by confluent-kafka's own client), the connector's error classes, keys as the identity,
and the loop holding records while the registry is out."""

from __future__ import annotations

import json
import threading

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from connectors.registry import SchemaRegistry, client_conf, frame, schema_id, without_userinfo
from schemas.codec import (
    DOCUMENT_SCHEMA_TEXT,
    DecodeError,
    Document,
    Tombstone,
    decode_document,
    embedding_json,
    encode_document,
    key_id,
)
from schemas.errors import TransientError
from tests.helpers import document_schema_with, registry_serializer
from tools.registry import compatible, make_server
from worker.commands.wire import embedding_decoder

from .fakes import FakeConsumer, FakeMessage
from .test_loop import _worker


@pytest.fixture
def registry_url(tmp_path):
    server = make_server(0, tmp_path / "registry.json")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


V2 = document_schema_with(name="lang", type=["null", "string"], default=None)


# -- the development registry ---------------------------------------------------------------------
def test_backward_compatibility_is_checked_with_fastavro_resolution():
    required = document_schema_with(name="lang", type="string")  # no default: old data cannot fill it
    assert compatible("BACKWARD", V2, [DOCUMENT_SCHEMA_TEXT])
    assert not compatible("BACKWARD", required, [DOCUMENT_SCHEMA_TEXT])
    assert compatible("NONE", required, [DOCUMENT_SCHEMA_TEXT])
    # FORWARD: old readers read new data; a removed field without a default breaks that
    dropped = json.loads(DOCUMENT_SCHEMA_TEXT)
    dropped["fields"] = [f for f in dropped["fields"] if f["name"] != "text"]
    assert compatible("BACKWARD", json.dumps(dropped), [DOCUMENT_SCHEMA_TEXT])
    assert not compatible("FORWARD", json.dumps(dropped), [DOCUMENT_SCHEMA_TEXT])


def test_the_client_registers_looks_up_and_fetches_through_the_rest_subset(registry_url, tmp_path):
    client = SchemaRegistryClient({"url": registry_url})
    v1 = client.register_schema("docs-value", Schema(DOCUMENT_SCHEMA_TEXT, "AVRO"))
    assert client.register_schema("docs-value", Schema(DOCUMENT_SCHEMA_TEXT, "AVRO")) == v1
    v2 = client.register_schema("docs-value", Schema(V2, "AVRO"))
    assert v2 != v1 and client.get_latest_version("docs-value").schema_id == v2
    assert client.lookup_schema("docs-value", Schema(DOCUMENT_SCHEMA_TEXT, "AVRO")).version == 1
    # the same schema under another subject keeps its global id
    assert client.register_schema("other-value", Schema(DOCUMENT_SCHEMA_TEXT, "AVRO")) == v1
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("docs-value", Schema(document_schema_with(name="lang2", type="string"), "AVRO"))
    assert refused.value.http_status_code == 409
    with pytest.raises(SchemaRegistryError) as missing:
        SchemaRegistryClient({"url": registry_url}).get_schema(999)
    assert missing.value.http_status_code == 404
    assert sorted(client.get_subjects()) == ["docs-value", "other-value"]
    # ids survive a restart (kept in the data file)
    again = make_server(0, tmp_path / "registry.json")
    try:
        threading.Thread(target=again.serve_forever, daemon=True).start()
        fresh = SchemaRegistryClient({"url": f"http://127.0.0.1:{again.server_address[1]}"})
        assert json.loads(fresh.get_schema(v2).schema_str) == json.loads(V2)
    finally:
        again.shutdown()
        again.server_close()


# -- the connector ----------------------------------------------------------------------------------
def _framed(client: SchemaRegistryClient, schema: str, record: dict, topic: str = "docs") -> bytes:
    return registry_serializer(client, schema, topic)(record)


def test_framed_values_resolve_against_our_schema_and_fail_with_precise_reasons(registry_url):
    producer_side = SchemaRegistryClient({"url": registry_url})
    v1 = _framed(producer_side, DOCUMENT_SCHEMA_TEXT, {"id": "a", "text": "one", "model": None, "metadata": {},
                                                       "event_time": 1000})
    v2 = _framed(producer_side, V2, {"id": "b", "text": "two", "lang": "en"})
    renamed_schema = json.loads(V2)
    renamed_schema["fields"][1] = {"name": "body", "type": "string", "aliases": ["text"]}  # text → body
    renamed = _framed(producer_side, json.dumps(renamed_schema), {"id": "r", "body": "renamed", "lang": "de"})
    v0_schema = {"type": "record", "name": "Document", "namespace": "io.embedstream",
                 "fields": [{"name": "id", "type": "string"}, {"name": "text", "type": "string"}]}
    v0 = _framed(producer_side, json.dumps(v0_schema), {"id": "o", "text": "older"}, topic="legacy")
    wrong = json.loads(DOCUMENT_SCHEMA_TEXT)
    wrong["fields"][1]["type"] = "int"  # text as a number: registered elsewhere, produced to our topic
    incompatible = _framed(producer_side, json.dumps(wrong), {"id": "c", "text": 3}, topic="elsewhere")
    unknown = frame(4242) + v1[5:]

    reg = SchemaRegistry(client_conf(registry_url, {}), DOCUMENT_SCHEMA_TEXT)
    reg.resolve({schema_id(v) for v in (v1, v2, renamed, v0, incompatible, unknown)})  # type: ignore[misc]
    assert decode_document(b"a", v1, framed=reg) == Document("a", "one", None, {}, 1000)
    assert decode_document(None, v2, framed=reg) == Document("b", "two")
    assert decode_document(b"r", renamed, framed=reg) == Document("r", "renamed")
    assert decode_document(b"o", v0, framed=reg) == Document("o", "older")  # optional fields missing: defaults
    for value, reason in ((incompatible, "incompatible_schema"), (unknown, "unknown_schema")):
        with pytest.raises(DecodeError) as info:
            decode_document(b"c", value, framed=reg)
        assert info.value.reason == reason, info.value
    # a schemaless record whose id is left to the key starts with byte 0 too: still read as one
    empty_id = encode_document(Document("", "keyed elsewhere " * 3))
    assert schema_id(empty_id) is not None
    reg.resolve([schema_id(empty_id)])  # type: ignore[list-item]
    assert decode_document(b"k", empty_id, framed=reg) == Document("k", "keyed elsewhere " * 3)


def test_a_registry_that_does_not_answer_is_an_outage_not_a_bad_record():
    reg = SchemaRegistry(client_conf("http://127.0.0.1:9", {"timeout": "1"}), DOCUMENT_SCHEMA_TEXT)
    with pytest.raises(TransientError):
        reg.resolve([1])
    with pytest.raises(TransientError):
        decode_document(b"a", frame(1) + b"\x02a\x02x", framed=reg)


def test_credentials_never_show_in_urls():
    assert without_userinfo("https://user:pw@sr.example:8081/x,http://h:1") == "https://***@sr.example:8081/x,http://h:1"
    reg = SchemaRegistry(client_conf("http://user:pw@127.0.0.1:9", {"timeout": "1"}), DOCUMENT_SCHEMA_TEXT)
    with pytest.raises(TransientError) as info:
        reg.resolve([1])
    assert "pw" not in str(info.value)


# -- keys are the identity --------------------------------------------------------------------------
class _Keys:
    """A FramedReader whose framed keys decode to fixed objects (the registry's part is tested above)."""

    def __init__(self, key_obj):
        self.key_obj = key_obj

    def read_key(self, key):
        return self.key_obj

    def read_document(self, value):
        raise AssertionError("no framed values here")


@pytest.mark.parametrize(("key", "field", "framed", "expected"), [
    (b"doc-1", None, None, "doc-1"),
    (b'{"id": 42}', "id", None, "42"),                                              # Debezium JSON key
    (b'{"schema": {"type": "struct"}, "payload": {"id": 42}}', "id", None, "42"),   # ... with its envelope
    (b"{not json but a plain id}", None, None, "{not json but a plain id}"),        # no field: the key as is
    (frame(7) + b"\x54", "id", _Keys({"id": 42, "tenant": "t"}), "42"),             # registry Avro struct key
    (frame(7) + b"\x54", None, _Keys({"id": 42}), "42"),                            # one field: that one
    (frame(7) + b"\x02k", None, _Keys("k"), "k"),                                   # a framed string key
    (b"", None, None, None),
])
def test_key_id(key, field, framed, expected):
    assert key_id(key, field, framed) == expected


@pytest.mark.parametrize(("key", "field", "framed", "fragment"), [
    (b'{"pk": 1}', "id", None, "no field 'id'"),
    (frame(7) + b"\x00", None, _Keys({"id": 1, "tenant": "t"}), "set EMBEDSTREAM_KEY_FIELD"),
    (b'{"id": true}', "id", None, "non-empty string or an integer"),
])
def test_bad_structured_keys_are_dead_lettered(key, field, framed, fragment):
    with pytest.raises(DecodeError) as info:
        key_id(key, field, framed)
    assert info.value.reason == "decode_error" and fragment in info.value.message


def test_upserts_and_deletes_use_the_same_identity():
    value = encode_document(Document("", "an update"))
    assert decode_document(b'{"id": 42}', value, key_field="id") == Document("42", "an update")
    assert decode_document(b'{"id": 42}', None, key_field="id") == Tombstone("42")
    with pytest.raises(DecodeError) as info:
        decode_document(b"k1", encode_document(Document("v1", "text")))
    assert info.value.reason == "id_mismatch"
    # no key: the value's id
    assert decode_document(None, encode_document(Document("v1", "text"))).id == "v1"
    assert decode_document(b'{"id": 42}', b'{"id": 42, "text": "cdc row"}', key_field="id").id == "42"


# -- output formats -------------------------------------------------------------------------------
def test_json_output_carries_the_schema_fields_and_exact_float32_vectors():
    import numpy as np

    vec = np.array([0.1, -0.5, 0.25], dtype=np.float32)
    rec = {"id": "d", "model": "m", "dim": 3, "vector": vec, "content_hash": "h", "cached": False,
           "source_topic": "docs", "source_partition": 1, "source_offset": 9, "metadata": {"k": "v"},
           "embedded_at": 1234}
    out = embedding_decoder("json", None)(embedding_json(rec))  # type: ignore[arg-type]
    assert np.array_equal(np.asarray(out.pop("vector"), dtype=np.float32), vec)
    assert out == {**{k: v for k, v in rec.items() if k != "vector"}, "chunk_index": 0, "chunk_count": 1,
                   "span_start": 0, "span_end": -1, "sparse_indices": None, "sparse_values": None, "event_time": None}


# -- the loop holds records while the registry is out --------------------------------------------------
class _FlakyRegistry:
    """Out for the first ``down`` look-ups; framed values are ``frame(1)`` + a schemaless document."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls = 0

    def resolve(self, ids) -> None:
        if ids:
            self.calls += 1
            if self.calls <= self.down:
                raise TransientError("schema registry", "connection refused")

    def read_document(self, value: bytes) -> dict:
        from schemas.codec import _DOCUMENT_READER, _read_avro

        return _read_avro(value[5:], _DOCUMENT_READER, "document.avsc")

    def read_key(self, key: bytes):
        raise AssertionError("plain keys here")


def test_an_outage_of_the_registry_holds_the_records_then_takes_them_all_in_order():
    msgs = [FakeMessage(f"d{o}".encode(), frame(1) + encode_document(Document(f"d{o}", f"text {o}")), 0, o)
            for o in range(30)]
    consumer = FakeConsumer({0: msgs})
    seen: list[str] = []
    worker = _worker(consumer, sink=lambda group: seen.extend(e.id for b in group for e in b.entries))
    flaky = _FlakyRegistry(down=3)
    worker.chain.intake.validator.registry = flaky  # type: ignore[assignment]
    worker.held.backoff_max = 0.05
    stats = worker.run(stop_when_idle=0.2)
    assert flaky.calls > 3
    assert stats.embedded == 30 and stats.dead_lettered == 0
    assert seen == [f"d{o}" for o in range(30)] and consumer.committed_offsets == {0: 30}


def test_missing_schema_ids_are_remembered_for_a_while_and_never_without_bound(registry_url, monkeypatch):
    """A topic of garbage whose first bytes spell frames names a new schema id with nearly every
    record: each is asked once, remembered at most ``MISSING_MAX`` of them, and asked again once its
    ``MISSING_TTL_S`` is past (the schema may have been registered since)."""
    import connectors.registry as registry_module

    monkeypatch.setattr(registry_module, "MISSING_MAX", 50)
    clock = [0.0]
    reg = SchemaRegistry(client_conf(registry_url, {}), DOCUMENT_SCHEMA_TEXT, clock=lambda: clock[0])
    asked: list[int] = []
    real_get = reg.client.get_schema
    reg.client.get_schema = lambda sid: asked.append(sid) or real_get(sid)  # type: ignore[method-assign]
    reg.resolve(range(10_000, 10_200))
    assert len(asked) == 200 and len(reg._missing) == 50  # the newest 50 kept
    reg.resolve(range(10_150, 10_200))
    assert len(asked) == 200  # remembered: not asked again
    clock[0] = registry_module.MISSING_TTL_S + 1
    reg.resolve([10_199])
    assert asked[-1] == 10_199 and len(asked) == 201  # past its time: asked again


def test_lookups_of_unknown_ids_are_bounded_by_a_budget_not_by_the_records(registry_url, monkeypatch):
    """Past ``MISSING_LOOKUPS`` "unknown" answers within ``MISSING_TTL_S``, a new id is taken as
    unknown without asking (its record's message says so); ids the registry knows still decode; the
    budget comes back as the answers age out."""
    import connectors.registry as registry_module

    monkeypatch.setattr(registry_module, "MISSING_LOOKUPS", 20)
    clock = [0.0]
    reg = SchemaRegistry(client_conf(registry_url, {}), DOCUMENT_SCHEMA_TEXT, clock=lambda: clock[0])
    good = registry_serializer(reg.client, DOCUMENT_SCHEMA_TEXT, "docs")({"id": "a", "text": "known"})
    # the look-ups resolve sends (the deserializer calls it too, with more arguments: not counted)
    looked_up: list[int] = []
    real_get = reg.client.get_schema
    reg.client.get_schema = (  # type: ignore[method-assign]
        lambda sid, *more: (None if more else looked_up.append(sid)) or real_get(sid, *more))
    assert len(looked_up) == 0
    reg.resolve([schema_id(good)])
    assert len(looked_up) == 1
    reg.resolve(range(50_000, 50_100))
    assert len(looked_up) == 1 + 20  # 20 asked, 80 taken as unknown unasked
    with pytest.raises(DecodeError) as unasked:
        decode_document(b"x", frame(50_099) + b"\x02x\x02y", framed=reg)
    assert unasked.value.reason == "unknown_schema" and "was not asked" in unasked.value.message
    with pytest.raises(DecodeError) as asked:
        decode_document(b"x", frame(50_000) + b"\x02x\x02y", framed=reg)
    assert asked.value.reason == "unknown_schema" and "does not know" in asked.value.message
    assert decode_document(b"a", good, framed=reg) == Document("a", "known")
    clock[0] = registry_module.MISSING_TTL_S + 1  # the answers age out: the registry is asked again
    reg.resolve([60_000])
    assert len(looked_up) == 22 and reg.missing(60_000) and reg._missing[60_000][1]  # asked this time
