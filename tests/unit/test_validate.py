"""The validator: every record becomes exactly one entry, with the contract's DLQ reason when bad."""

from __future__ import annotations

import pytest

from schemas.codec import Document, encode_document
from worker.core.records import DeadLetter, Delete, Item, Source, content_hash
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


class _NoTimestamp(FakeMessage):
    def timestamp(self):
        return (0, -1)  # TIMESTAMP_NOT_AVAILABLE


def _validator(**kw) -> Validator:
    return Validator(1000, lambda m: "served-m" if m in (None, "m") else None, **kw)


def test_the_size_limit_and_the_id_limit_take_a_record_at_exactly_the_limit():
    limit_doc = encode_document(Document("a", "x" * 50))
    v = Validator(len(limit_doc), lambda m: "served-m")
    assert isinstance(v.validate(FakeMessage(b"a", limit_doc)), Item)
    v = Validator(len(limit_doc) - 1, lambda m: "served-m")
    assert v.validate(FakeMessage(b"a", limit_doc)).reason == "text_too_long"
    at_limit, over = "i" * 512, "i" * 513
    assert isinstance(_validator().validate(FakeMessage(at_limit.encode(), encode_document(Document(at_limit, "hi")))),
                      Item)
    assert _validator().validate(FakeMessage(over.encode(), encode_document(Document(over, "hi")))).reason == \
        "id_too_long"


@pytest.mark.parametrize(("key", "value", "says"), [
    (b"a", b"x" * 2000, "EMBEDSTREAM_MAX_TEXT_BYTES"),
    (b"a", b"\x02\x04", ""),
    (b"a" * 600, encode_document(Document("a" * 600, "hi")), "512 bytes"),
    (b"a", encode_document(Document("a", "hi", model="other-model")), "'other-model'"),
    (b"a", encode_document(Document("a", "   ")), "empty"),
])
def test_every_entry_carries_its_source_and_a_dead_letter_says_why(key, value, says):
    dead = _validator().validate(FakeMessage(key, value, 4, 77, topic="in", headers=[("h", b"1")], ts=1234))
    assert isinstance(dead, DeadLetter)
    assert dead.source == Source("in", 4, 77, 1234)
    assert (dead.key, dead.value, dead.headers) == (key, value, [("h", b"1")])
    assert isinstance(dead.message, str) and dead.message and says in dead.message


def test_a_tombstone_and_an_item_carry_their_source_id_and_fields():
    gone = _validator().validate(FakeMessage(b"gone", None, 2, 9, topic="in", ts=55))
    assert isinstance(gone, Delete) and gone.id == "gone" and gone.source == Source("in", 2, 9, 55)
    it = _validator().validate(FakeMessage(b"a", encode_document(Document("a", " hello ", "m", {"k": "v"})), 1, 5,
                                           topic="in", ts=99))
    assert isinstance(it, Item)
    assert (it.source, it.id, it.text, it.hash, it.tokens, it.metadata, it.model) == \
        (Source("in", 1, 5, 99), "a", "hello", content_hash("hello"), 0, {"k": "v"}, "served-m")
    # any item may still be dead-lettered whole (Milvus may refuse it): it keeps the bytes that came
    assert it.original == (b"a", encode_document(Document("a", " hello ", "m", {"k": "v"})), None)
    assert not it.large


def test_a_message_without_a_timestamp_has_none():
    it = _validator().validate(_NoTimestamp(b"a", encode_document(Document("a", "hi"))))
    assert it.source.timestamp_ms is None
    zero = _validator().validate(FakeMessage(b"a", encode_document(Document("a", "hi")), ts=0))
    assert zero.source.timestamp_ms is None
    one = _validator().validate(FakeMessage(b"a", encode_document(Document("a", "hi")), ts=1))
    assert one.source.timestamp_ms == 1


def test_a_structured_key_names_the_document_by_its_key_field():
    v = _validator(key_field="id")
    it = v.validate(FakeMessage(b'{"id": 7}', b'{"text": "hello"}'))
    assert isinstance(it, Item) and it.id == "7"
    gone = v.validate(FakeMessage(b'{"id": 7}', None))
    assert isinstance(gone, Delete) and gone.id == "7"


def test_every_item_keeps_its_original_record_and_only_a_large_one_is_marked_for_measuring():
    value = encode_document(Document("a", "a text of some length"))
    msg = FakeMessage(b"a", value, headers=[("h", b"1")])
    item = _validator().validate(msg)
    assert item.original == (b"a", value, [("h", b"1")]) and not item.large
    assert _validator(keep_original=lambda chars: chars > 10).validate(msg).large
    assert not _validator(keep_original=lambda chars: chars > 100).validate(msg).large
    size = len(value) + 1  # value and key
    assert not _validator(keep_large=size).validate(msg).large
    assert _validator(keep_large=size - 1).validate(msg).large


def test_framed_records_are_read_through_the_registry_which_is_asked_for_their_ids_only(tmp_path):
    import threading

    from confluent_kafka.schema_registry import SchemaRegistryClient

    from connectors.registry import SchemaRegistry, client_conf
    from schemas.codec import DOCUMENT_SCHEMA_TEXT
    from tests.helpers import registry_serializer
    from tools.registry import make_server

    server = make_server(0, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        framed = registry_serializer(SchemaRegistryClient({"url": url}), DOCUMENT_SCHEMA_TEXT, "docs")(
            {"id": "f", "text": "framed by the registry", "model": None, "metadata": {}, "event_time": None})
        registry = SchemaRegistry(client_conf(url, {}), DOCUMENT_SCHEMA_TEXT)
        v = _validator(registry=registry)
        msgs = [FakeMessage(b"f", framed), FakeMessage(b"p", encode_document(Document("p", "plain Avro")))]
        server.requests.clear()
        v.resolve_schemas(msgs)
        asked = {k: n for k, n in server.requests.items() if k.startswith("GET /schemas/ids")}
        assert asked == {"GET /schemas/ids/{n}": 1}  # the framed record's id, once, before any is validated
        framed_item, plain = (v.validate(m) for m in msgs)
        assert {k: n for k, n in server.requests.items() if k.startswith("GET /schemas/ids")} == asked  # no wait
        assert isinstance(framed_item, Item) and (framed_item.id, framed_item.text) == ("f", "framed by the registry")
        assert isinstance(plain, Item) and plain.id == "p"
        # without the registry the frame is not a document
        assert _validator().validate(msgs[0]).reason == "decode_error"
    finally:
        server.shutdown()


class _LogAppendTime(FakeMessage):
    def timestamp(self):
        return (2, 1_700_000_009_999)  # TIMESTAMP_LOG_APPEND_TIME: the broker's clock


TRACE = [("TraceParent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), ("other", b"x"),
         ("baggage", None), ("tracestate", b"vendor=1")]


def test_forwarded_headers_are_the_named_ones_in_their_order_whatever_their_case():
    v = _validator(forward=["traceparent", "TRACESTATE", "baggage"])
    it = v.validate(FakeMessage(b"a", encode_document(Document("a", "hi")), headers=TRACE))
    assert isinstance(it, Item) and it.headers == [TRACE[0], TRACE[3]]  # a header without a value is not copied
    gone = v.validate(FakeMessage(b"a", None, headers=TRACE))
    assert isinstance(gone, Delete) and gone.headers == [TRACE[0], TRACE[3]]
    hi = encode_document(Document("a", "hi"))
    assert v.validate(FakeMessage(b"a", hi, headers=[("other", b"x")])).headers is None
    assert _validator().validate(FakeMessage(b"a", hi, headers=TRACE)).headers is None
    # a dead letter keeps every header, whatever is forwarded
    assert v.validate(FakeMessage(b"a", b"\x02\x04", headers=TRACE)).headers == TRACE


def test_event_time_is_the_documents_else_the_producers_timestamp_never_the_brokers():
    v = _validator()
    own = v.validate(FakeMessage(b"a", encode_document(Document("a", "hi", event_time=1_600_000_000_000))))
    assert own.event_time == 1_600_000_000_000
    assert v.validate(FakeMessage(b"a", encode_document(Document("a", "hi")), ts=1_700_000_000_123)).event_time == \
        1_700_000_000_123  # CreateTime
    assert v.validate(_LogAppendTime(b"a", encode_document(Document("a", "hi")))).event_time is None
    assert v.validate(_NoTimestamp(b"a", encode_document(Document("a", "hi")))).event_time is None


def test_forwarded_headers_count_toward_marking_a_record_that_might_not_fit():
    """A small record with a large forwarded header may make an output record over the output topic's
    limit: the item is marked large, so the sink measures it (and can dead-letter it whole)."""
    value = encode_document(Document("a", "hi"))
    big = [("baggage", b"k=" + b"v" * 5000)]
    v = _validator(forward=["baggage"], keep_large=1000)
    item = v.validate(FakeMessage(b"a", value, headers=big))
    assert item.large and item.original == (b"a", value, big)
    assert not v.validate(FakeMessage(b"a", value, headers=[("baggage", b"k=v")])).large


class _TimestampOf(FakeMessage):
    def __init__(self, *args, ts_type: int, **kw) -> None:
        super().__init__(*args, **kw)
        self._ts_type = ts_type

    def timestamp(self):
        return (self._ts_type, self._ts)


def _raising(error: Exception):
    def resolve(model):
        raise error
    return resolve


def test_a_record_whose_reading_raises_anything_else_is_a_decode_error_that_names_it_and_keeps_the_record():
    """The last guard: an error no decoder foresaw (here the model look-up's) dead-letters the record
    with its own source and bytes, the exception's type and its text cut at 200 characters."""
    value = encode_document(Document("a", "hi", "m"))
    msg = FakeMessage(b"a", value, 3, 41, topic="in", headers=[("h", b"1")], ts=1234)
    dead = Validator(1000, _raising(ValueError("z" * 250))).validate(msg)
    assert isinstance(dead, DeadLetter) and dead.reason == "decode_error"
    assert dead.source == Source("in", 3, 41, 1234)
    assert (dead.key, dead.value, dead.headers) == (b"a", value, [("h", b"1")])
    assert dead.message == f"the record could not be read (ValueError: {'z' * 200}…)"
    at_limit = Validator(1000, _raising(KeyError("y" * 198))).validate(msg)  # str() adds the quotes: 200
    assert at_limit.message == f"the record could not be read (KeyError: '{'y' * 198}')"
    one_over = Validator(1000, _raising(ValueError("w" * 201))).validate(msg)
    assert one_over.message == f"the record could not be read (ValueError: {'w' * 200}…)"
    # its time as the guard reads it: the producer's, when there is one above 0
    for ts_type, ts, kept in ((1, 1, 1), (1, 0, None), (0, 5, None), (2, 7, 7)):
        odd = _TimestampOf(b"a", value, ts=ts, ts_type=ts_type)
        assert Validator(1000, _raising(ValueError("x"))).validate(odd).source.timestamp_ms == kept


def test_metadata_over_what_milvus_takes_is_a_dead_letter_with_its_source_and_size():
    from connectors.milvus.schema import METADATA_MAX_BYTES

    doc = Document("a", "hi", "m", {"blob": "b" * METADATA_MAX_BYTES})
    value = encode_document(doc)
    dead = Validator(10 * len(value), lambda m: "served-m").validate(
        FakeMessage(b"a", value, 2, 8, topic="in", headers=[("h", b"1")], ts=99))
    assert isinstance(dead, DeadLetter) and dead.reason == "metadata_too_large"
    assert dead.source == Source("in", 2, 8, 99)
    assert (dead.key, dead.value, dead.headers) == (b"a", value, [("h", b"1")])
    assert dead.message.startswith(f"its metadata is {METADATA_MAX_BYTES + 11:,} bytes as JSON, over the "
                                   f"{METADATA_MAX_BYTES:,} that Milvus takes")


def test_a_record_delivered_past_the_limit_keeps_its_source_in_the_dead_letter():
    dead = _validator(max_deliveries=1).validate(FakeMessage(b"a", encode_document(Document("a", "hi")), 5, 6,
                                                             topic="in", ts=7, deliveries=2))
    assert dead.reason == "delivery_count_exceeded" and dead.source == Source("in", 5, 6, 7)
