"""Milvus sink: upsert (never insert) with in-batch dedupe; DLQ headers; validation reasons."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.exceptions import TransientError
from connectors.milvus import MilvusStore
from schemas.codec import Document, encode_document
from worker.records import Batch, DeadLetter, Delete, Item, Source
from worker.settings import Settings
from worker.steps.sink import SinkStep, final_operations
from worker.steps.validate import Validator

from .fakes import FakeMessage, RecordingMilvusClient, RecordingProducer


def _item(doc_id: str, o: int, v: float) -> Item:
    return Item(Source("docs", 0, o), doc_id, f"text {o}", f"h{o}", 3, {"o": str(o)}, np.full(4, v, np.float32))


def _store(client) -> MilvusStore:
    store = MilvusStore.__new__(MilvusStore)
    store._client, store.collection, store.timeout, store.uri = client, "c", 5.0, "fake"
    return store


def _sink(client, producer) -> SinkStep:
    s = Settings(kafka_bootstrap_servers="x:1", milvus_uri="fake")
    return SinkStep(s, _store(client), producer, "m", 4, cache=None)


def test_sink_upserts_never_inserts_and_dedupes_last_wins():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2), _item("a", 2, 0.3), Delete(Source("docs", 0, 3), "b"),
              _item("c", 4, 0.4), Delete(Source("docs", 0, 5), "c"), _item("c", 6, 0.5)):
        batch.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _sink(client, producer).process([batch])
    kinds = [k for k, _ in client.calls]
    assert "insert" not in kinds and kinds == ["upsert", "delete"]
    rows = client.calls[0][1]
    assert sorted(r["id"] for r in rows) == ["a", "c"]  # each id once
    by_id = {r["id"]: r for r in rows}
    assert by_id["a"]["content_hash"] == "h2" and by_id["c"]["content_hash"] == "h6"  # last wins
    assert client.calls[1][1] == ["b"]
    # the output topic still sees every record, in order: 5 embeddings, 2 tombstones
    assert [v is None for _, _, v, _ in producer.records] == [False, False, False, True, False, True, False]


def test_final_operations_order():
    batch = Batch()
    batch.add(Delete(Source("d", 0, 0), "x"))
    batch.add(_item("x", 1, 0.1))
    ups, dels = final_operations([batch])
    assert list(ups) == ["x"] and dels == []


def test_a_group_is_one_upsert_and_the_last_operation_across_batches_wins():
    first, second = Batch(), Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2)):
        first.add(e)
    for e in (Delete(Source("docs", 0, 2), "a"), _item("b", 3, 0.3), _item("d", 4, 0.4)):
        second.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _sink(client, producer).process([first, second])
    assert [k for k, _ in client.calls] == ["upsert", "delete"]
    rows = {r["id"]: r for r in client.calls[0][1]}
    assert sorted(rows) == ["b", "d"] and rows["b"]["content_hash"] == "h3"
    assert client.calls[1][1] == ["a"]
    # every record of both batches reaches the output topic, in consumption order
    assert [k for _, k, _, _ in producer.records] == [b"a", b"b", b"a", b"b", b"d"]


def test_a_retry_after_a_milvus_failure_does_not_produce_the_records_again():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2)):
        batch.add(e)
    client, producer = RecordingMilvusClient(fail_upserts=2), RecordingProducer()
    sink = _sink(client, producer)
    for _ in range(2):
        with pytest.raises(TransientError):
            sink.process([batch])
    sink.process([batch])
    assert [k for k, _ in client.calls] == ["upsert"] * 3  # Milvus is written at every attempt
    assert [k for _, k, _, _ in producer.records] == [b"a", b"b"]  # the output only once


def test_failed_delivery_fails_the_batch():
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    with pytest.raises(TransientError):
        _sink(RecordingMilvusClient(), RecordingProducer(fail=True)).process([batch])


def test_dead_letters_keep_original_bytes_and_get_contract_headers():
    batch = Batch()
    batch.add(DeadLetter(Source("docs", 2, 9), b"k", b"\x00bad", [("trace", b"1")], "decode_error", "boom"))
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer).process([batch])
    [(topic, key, value, headers)] = producer.records
    h = dict(headers)
    assert topic == "documents.dlq" and key == b"k" and value == b"\x00bad"
    assert h["trace"] == b"1" and h["embedstream.error.reason"] == b"decode_error"
    assert h["embedstream.error.message"] == b"boom" and h["embedstream.source.topic"] == b"docs"
    assert h["embedstream.source.partition"] == b"2" and h["embedstream.source.offset"] == b"9"


@pytest.mark.parametrize(("key", "value", "reason"), [
    (b"a", encode_document(Document("a", "   ")), "empty_text"),
    (b"a", encode_document(Document("a", "hi", model="other-model")), "unknown_model"),
    (b"a", b"x" * 2000, "text_too_long"),
    (b"a", b'{"id": "a", "text": "\xc3\x28"}', "invalid_utf8"),
    (b"a", b"\x02\x04", "decode_error"),
    (b"a", encode_document(Document("a" * 600, "hi")), "id_too_long"),
])
def test_validator_reasons(key, value, reason):
    v = Validator(1000, lambda m: m in (None, "m"))
    entry = v.validate(FakeMessage(key, value))
    assert isinstance(entry, DeadLetter) and entry.reason == reason and entry.value == value


def test_validator_good_record_and_tombstone():
    v = Validator(1000, lambda m: m in (None, "m"))
    it = v.validate(FakeMessage(b"a", encode_document(Document("a", "  Cafe\u0301  ", "m")), 3, 41))
    assert isinstance(it, Item) and it.text == "Caf\u00e9" and it.source.offset == 41 and it.source.partition == 3
    assert isinstance(v.validate(FakeMessage(b"gone", None)), Delete)


def test_dead_letter_over_the_broker_limit_keeps_its_head_and_says_so():
    from worker.steps.sink import dlq_headers

    d = DeadLetter(Source("docs", 0, 1), b"k", b"x" * 5000, None, "text_too_long", "too long")
    value, headers = dlq_headers(d, max_value=1000)
    assert value == b"x" * 1000 and dict(headers)["embedstream.error.original_size"] == b"5000"
