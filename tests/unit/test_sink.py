"""The sink step: upsert (never insert) with dedupe across a group, the last operation wins; output and
DLQ records; a retry after a Milvus failure redoes only Milvus."""

from __future__ import annotations

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.milvus import MilvusStore
from schemas.errors import RecordRefused, TransientError
from schemas.sparse import SparseMode
from worker.core.delivery import AtLeastOnce, written_offsets
from worker.core.fence import Fence, FenceClosed
from worker.core.records import Batch, Chunk, DeadLetter, Delete, Item, Source
from worker.steps.writing.fit import TopicLimits, record_size
from worker.steps.writing.sink import SinkStep
from worker.steps.writing.targets import ModelTarget
from worker.steps.writing.versions import VersionGuard, final_operations

from .fakes import RecordingMilvusClient, RecordingProducer, at_least_once


def _item(doc_id: str, o: int, v: float, partition: int = 0) -> Item:
    """A document of one chunk, its vector filled as the embed step would."""
    text = f"text {o}"
    return Item(Source("docs", partition, o), doc_id, text, f"h{o}", 3, {"o": str(o)},
                [Chunk(0, 0, len(text), text, f"h{o}", np.full(4, v, np.float32))])


def _store(client) -> MilvusStore:
    return MilvusStore("fake", "c", timeout=5.0, client=client)


def _sink(client, producer, fence: Fence | None = None, limits: TopicLimits | None = None,
          dead_lettered=lambda reason, message: None, dead_letters: bool = True,
          output_topic: str = "embeddings") -> SinkStep:
    if fence is None:
        fence = Fence(lease_s=60)
        fence.publish({("docs", p) for p in range(4)})
    return SinkStep({"": ModelTarget(_store(client), "m", 4)}, at_least_once(producer=producer), fence=fence,
                    guard=VersionGuard({"docs": "T1"}), output_topic=output_topic, dlq_topic="documents.dlq",
                    delivery_timeout_s=5, limits=limits, dead_lettered=dead_lettered, dead_letters=dead_letters)


def test_sink_upserts_never_inserts_and_dedupes_last_wins():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2), _item("a", 2, 0.3), Delete(Source("docs", 0, 3), "b"),
              _item("c", 4, 0.4), Delete(Source("docs", 0, 5), "c"), _item("c", 6, 0.5)):
        batch.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _sink(client, producer).process([batch])
    kinds = [k for k, _ in client.calls]
    assert "insert" not in kinds and kinds == ["tombstones", "delete", "upsert"]
    rows = client.calls[2][1]
    assert sorted(r["id"] for r in rows) == ["a#0", "c#0"]  # each id once
    by_id = {r["doc_id"]: r for r in rows}
    assert by_id["a"]["content_hash"] == "h2" and by_id["c"]["content_hash"] == "h6"  # last wins
    assert (by_id["a"]["chunk_index"], by_id["a"]["chunk_count"], by_id["a"]["span_end"]) == (0, 1, 6)
    assert [(r["id"], r["source"], r["source_offset"]) for r in client.calls[0][1]] == [("b", "T1:0", 3)]
    assert client.calls[1][1] == ["b#0"]
    # the output topic still sees every record, in order: 5 embeddings, 2 tombstones
    assert [v is None for _, _, v, _ in producer.records] == [False, False, False, True, False, True, False]


def test_final_operations_order():
    batch = Batch()
    batch.add(Delete(Source("d", 0, 0), "x"))
    batch.add(_item("x", 1, 0.1))
    ups, dels = final_operations(batch.entries)
    assert list(ups) == ["x"] and dels == {}


def test_a_group_is_one_upsert_and_the_last_operation_across_batches_wins():
    first, second = Batch(), Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2)):
        first.add(e)
    for e in (Delete(Source("docs", 0, 2), "a"), _item("b", 3, 0.3), _item("d", 4, 0.4)):
        second.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _sink(client, producer).process([first, second])
    assert [k for k, _ in client.calls] == ["tombstones", "delete", "upsert"]
    rows = {r["doc_id"]: r for r in client.calls[2][1]}
    assert sorted(rows) == ["b", "d"] and rows["b"]["content_hash"] == "h3"
    assert client.calls[1][1] == ["a#0"]
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
        _sink(RecordingMilvusClient(), RecordingProducer(fail=KafkaError(KafkaError._TRANSPORT))).process([batch])


def test_a_backfill_skips_dead_letters_and_still_commits_past_them():
    """A migration's backfill re-reads what the live worker dead-lettered: it writes them nowhere
    (not a second time to the DLQ) and its offsets still move past them."""
    batch = Batch()
    for e in (_item("a", 0, 0.1), DeadLetter(Source("docs", 0, 1), b"k", b"\x00bad", None, "decode_error", "boom"),
              _item("c", 2, 0.3)):
        batch.add(e)
    producer = RecordingProducer()
    sink = _sink(RecordingMilvusClient(), producer, dead_letters=False)
    sink.process([batch])
    assert [(t, k) for t, k, _, _ in producer.records] == [("embeddings", b"a"), ("embeddings", b"c")]
    assert written_offsets([batch]) == {("docs", 0): 3}


def test_a_sink_without_an_output_topic_writes_milvus_and_dead_letters_and_publishes_nothing_else():
    """A backfill's default (``NO_OUTPUT``): its documents and tombstones reach the new collection only,
    never the output topic the live model's readers consume; its own dead letters still go out, and
    its offsets move past everything."""
    from worker.steps.writing.sink import NO_OUTPUT

    batch = Batch()
    for e in (_item("a", 0, 0.1), Delete(Source("docs", 0, 1), "b"),
              DeadLetter(Source("docs", 0, 2), b"k", b"v", None, "milvus_rejected", "refused"), _item("c", 3, 0.3)):
        batch.add(e)
    producer, client = RecordingProducer(), RecordingMilvusClient()
    _sink(client, producer, dead_letters=False, output_topic=NO_OUTPUT).process([batch])
    assert [(t, k) for t, k, _, _ in producer.records] == [("documents.dlq", b"k")]
    assert sorted(client.rows) == ["a#0", "c#0"] and [k for k, _ in client.calls] == ["tombstones", "delete", "upsert"]
    assert written_offsets([batch]) == {("docs", 0): 4}


@pytest.mark.parametrize("reason", ["milvus_rejected", "too_many_chunks", "output_too_large", "output_rejected"])
def test_a_backfill_dead_letters_what_only_its_own_collection_or_model_refused(reason):
    """The live worker wrote the document; the backfill's new collection (or model, or output) refused
    it: skipped, it would be missing after the switch without a word. It is dead-lettered."""
    batch = Batch()
    for e in (_item("a", 0, 0.1), DeadLetter(Source("docs", 0, 1), b"k", b"v", None, reason, "refused")):
        batch.add(e)
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer, dead_letters=False).process([batch])
    assert [(t, k) for t, k, _, _ in producer.records] == [("embeddings", b"a"), ("documents.dlq", b"k")]


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


def test_dead_letter_over_the_topic_limit_is_cut_to_fit_and_says_so():
    d = DeadLetter(Source("docs", 0, 1), b"k" * 40_000, b"x" * 50_000, [("trace", b"1")], "text_too_long", "too long")
    producer = RecordingProducer()
    sink = _sink(RecordingMilvusClient(), producer, limits=TopicLimits(dlq=32_768))
    batch = Batch()
    batch.add(d)
    sink.process([batch])
    [(topic, key, value, headers)] = producer.records
    assert topic == "documents.dlq" and record_size(key, value, headers) <= 32_768
    h = dict(headers)
    assert h["embedstream.error.reason"] == b"text_too_long" and h["embedstream.source.offset"] == b"1"
    assert h["embedstream.error.truncated"] == b"key,value"
    assert h["embedstream.error.original_value_size"] == b"50000" and h["embedstream.error.original_size"] == b"50000"
    assert h["embedstream.error.original_key_size"] == b"40000" and h["trace"] == b"1"
    assert key == b"k" * len(key) and value == b"x" * len(value) and len(key) > 1000


def _big_metadata_item(doc_id: str, o: int, size: int) -> Item:
    item = _item(doc_id, o, 0.5)
    item.metadata = {"blob": "m" * size}
    item.original = (doc_id.encode(), b"original value", [("h", b"v")])
    item.large = True  # the validator marks a record this large
    return item


def test_an_output_record_over_the_topic_limit_is_dead_lettered_and_written_nowhere():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _big_metadata_item("big", 1, 40_000), _item("c", 2, 0.3)):
        batch.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    told: list[tuple[str, str]] = []
    sink = _sink(client, producer, limits=TopicLimits(output=32_768), dead_lettered=lambda *dead: told.append(dead))
    sink.process([batch])
    assert [reason for reason, _ in told] == ["output_too_large"]  # the breaker hears of it, once
    sink.process([batch])  # a replay of the group: the entry is a dead letter already, not told again
    assert len(told) == 1
    assert sorted(r["doc_id"] for r in client.calls[-1][1]) == ["a", "c"]
    assert [(t, k) for t, k, _, _ in producer.records] == [("embeddings", b"a"), ("documents.dlq", b"big"),
                                                          ("embeddings", b"c")]
    _, _, value, headers = producer.records[1]
    h = dict(headers)
    assert value == b"original value" and h["h"] == b"v"
    assert h["embedstream.error.reason"] == b"output_too_large" and b"32,768" in h["embedstream.error.message"]
    assert isinstance(batch.entries[1], DeadLetter)


def test_large_metadata_that_still_fits_is_written():
    batch = Batch()
    batch.add(_big_metadata_item("big", 1, 20_000))
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _sink(client, producer, limits=TopicLimits(output=1_000_000)).process([batch])
    assert [(t, k) for t, k, _, _ in producer.records] == [("embeddings", b"big")]


@pytest.mark.parametrize("how", ["at produce", "at delivery"])
def test_a_dead_letter_refused_for_good_stops_the_sink_with_what_to_do(how):
    class RefusingProducer(RecordingProducer):
        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
            if how == "at produce":
                raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
            super().produce(topic, value, key, headers, on_delivery)

    producer = RefusingProducer(fail=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if how == "at delivery" else None)
    batch = Batch()
    batch.add(DeadLetter(Source("docs", 3, 17), b"k", b"v", None, "decode_error", "bad"))
    with pytest.raises(RecordRefused) as err:
        _sink(RecordingMilvusClient(), producer).process([batch])
    message = str(err.value)
    assert "documents.dlq" in message and "docs partition 3 offset 17" in message and "decode_error" in message
    assert "EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES" in message and "\n" not in message


def _owned(*partitions: int) -> Fence:
    fence = Fence(lease_s=60)
    fence.publish({("docs", p) for p in partitions})
    return fence


def test_entries_of_partitions_no_longer_owned_are_written_nowhere():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 5, 0.2, partition=1),
              DeadLetter(Source("docs", 1, 6), b"k", b"v", None, "decode_error", "m")):
        batch.add(e)
    client, producer = RecordingMilvusClient(), RecordingProducer()
    [written] = _sink(client, producer, _owned(0)).process([batch])
    assert [r["id"] for r in client.calls[0][1]] == ["a#0"]
    assert [k for _, k, _, _ in producer.records] == [b"a"]
    assert written.fenced == {("docs", 1)} and written.offsets(batch) == {("docs", 0): 1}


def test_an_expired_lease_stops_the_group_before_any_write():
    clock = [0.0]
    fence = Fence(lease_s=2, clock=lambda: clock[0])
    fence.publish({("docs", 0)})
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    client, producer = RecordingMilvusClient(), RecordingProducer()
    clock[0] = 3.0  # frozen past the lease
    with pytest.raises(FenceClosed):
        _sink(client, producer, fence).process([batch])
    assert client.calls == [] and producer.records == []


class _LostDuringTheRead(RecordingMilvusClient):
    """Milvus answers the first version read while the polling thread publishes that this member
    lost ``lost`` (another member takes it over, and its newer writes come after this read)."""

    def __init__(self, fence: Fence, lost: int) -> None:
        super().__init__()
        self.fence, self.lost = fence, lost

    def query(self, *args, **kwargs):
        if self.lost is not None:
            self.fence.publish(self.fence.owned_now() - {("docs", self.lost)})
            self.lost = None
        return super().query(*args, **kwargs)


def test_a_partition_lost_during_the_version_read_is_written_nowhere():
    fence = _owned(0, 1)
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 5, 0.2, partition=1)):
        batch.add(e)
    client, producer = _LostDuringTheRead(fence, 1), RecordingProducer()
    [written] = _sink(client, producer, fence).process([batch])
    # its new owner may have written a newer "b" that the read did not see: b is left to it
    assert [r["id"] for r in client.calls[-1][1]] == ["a#0"]
    assert [k for _, k, _, _ in producer.records] == [b"a"]
    assert written.fenced == {("docs", 1)}


def test_an_older_version_than_milvus_holds_is_written_nowhere_and_a_newer_one_is():
    client, producer = RecordingMilvusClient(), RecordingProducer()
    sink = _sink(client, producer)
    newer = Batch()
    newer.add(_item("a", 10, 0.9))
    newer.add(Delete(Source("docs", 0, 11), "gone"))
    sink.process([newer])  # a row for "a" at offset 10 of T1:0
    client.rows["gone#0"] = {"id": "gone#0", "doc_id": "gone", "chunk_count": 1, "source": "T1:0",
                             "source_offset": 12}  # re-created later at 12
    producer.records.clear()
    late = Batch()  # what a zombie still had in flight: older offsets of the same partition
    for e in (_item("a", 4, 0.1), _item("b", 5, 0.2), Delete(Source("docs", 0, 6), "gone"), _item("a", 12, 0.5)):
        late.add(e)
    sink.process([late])
    assert client.rows["a#0"]["source_offset"] == 12 and client.rows["a#0"]["content_hash"] == "h12"
    assert "gone#0" in client.rows, "an older tombstone deleted a newer row"
    assert [k for _, k, _, _ in producer.records] == [b"b", b"a"]  # a@4 and the old tombstone are superseded
    assert [e.superseded for e in late.entries] == [True, False, True, False]


def test_the_same_offset_again_is_rewritten_as_a_replay_should():
    client, producer = RecordingMilvusClient(), RecordingProducer()
    sink = _sink(client, producer)
    for _ in range(2):
        batch = Batch()
        batch.add(_item("a", 3, 0.3))
        sink.process([batch])
    assert len(producer.records) == 2 and not batch.entries[0].superseded


def test_another_partition_or_topic_id_is_not_compared():
    guard = VersionGuard({"docs": "T1"})
    stored = {"a": ("T1:0", 100)}
    assert guard.superseded(_item("a", 5, 0.1), stored)
    assert not guard.superseded(Item(Source("docs", 1, 5), "a", "t", "h", 1, {}), stored)
    assert not VersionGuard({"docs": "T2"}).superseded(_item("a", 5, 0.1), stored)  # topic re-created


def test_a_producer_that_was_fenced_is_replaced_and_the_group_retried_whole():
    """An idempotent producer whose id or epoch the broker rejected delivers nothing again: the sink
    swaps in a new one, and the retry produces the group's records through it."""
    fenced = RecordingProducer(fail=KafkaError(KafkaError.PRODUCER_FENCED))
    fresh = RecordingProducer()
    made = iter([fenced, fresh])
    sink = SinkStep({"": ModelTarget(_store(RecordingMilvusClient()), "m", 4)},
                    AtLeastOnce(lambda: next(made), 5.0), fence=_owned(0),
                    guard=VersionGuard({"docs": "T1"}), output_topic="embeddings", dlq_topic="documents.dlq",
                    delivery_timeout_s=5)
    batch = Batch()
    batch.add(_item("a", 1, 0.1))
    with pytest.raises(TransientError):
        sink.process([batch])
    assert fenced.purged and sink.delivery.producer is fresh
    sink.process([batch])
    assert [k for _, k, _, _ in fresh.records] == [b"a"]


def test_an_ordinary_delivery_failure_keeps_the_producer():
    producer = RecordingProducer(fail=KafkaError(KafkaError._MSG_TIMED_OUT))
    sink = _sink(RecordingMilvusClient(), producer)
    batch = Batch()
    batch.add(_item("a", 1, 0.1))
    with pytest.raises(TransientError):
        sink.process([batch])
    assert sink.delivery.producer is producer and not producer.purged


def test_a_replay_across_a_delete_neither_brings_the_row_back_nor_shows_the_old_version_again():
    """v2 then its tombstone were written; a replay (a crash before the commit, a rebalance) brings v2
    again: it is older than the delete, so it is written nowhere."""
    client, producer = RecordingMilvusClient(), RecordingProducer()
    sink = _sink(client, producer)
    first = Batch()
    first.add(_item("a", 10, 0.2))
    first.add(Delete(Source("docs", 0, 11), "a"))
    sink.process([first])
    assert "a#0" not in client.rows and client.deleted["a"]["source_offset"] == 11
    producer.records.clear()
    replay = Batch()
    replay.add(_item("a", 10, 0.2))
    sink.process([replay])
    assert "a#0" not in client.rows and producer.records == []
    assert replay.entries[0].superseded
    newer = Batch()  # the document comes back later: newer than the delete, written
    newer.add(_item("a", 12, 0.3))
    sink.process([newer])
    assert client.rows["a#0"]["source_offset"] == 12 and [k for _, k, _, _ in producer.records] == [b"a"]


def test_each_model_writes_its_collection_and_a_tombstone_deletes_from_all():
    """Two models: an item goes to its model's collection, with its model's id and dim on the output
    topic; a tombstone deletes the id from both; versions are guarded per collection."""
    small, big, producer = RecordingMilvusClient(), RecordingMilvusClient(), RecordingProducer()
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0)})
    targets = {"small": ModelTarget(_store(small), "org/small", 4), "big": ModelTarget(_store(big), "org/big", 6)}
    sink = SinkStep(targets, at_least_once(producer=producer), fence=fence, guard=VersionGuard({"docs": "T1"}),
                    output_topic="embeddings", dlq_topic="documents.dlq", delivery_timeout_s=5)
    batch = Batch()
    a, b, both = _item("a", 0, 0.1), _item("b", 1, 0.2), _item("x", 2, 0.3)
    b.model = "big"
    a.model = both.model = "small"
    x_big = _item("x", 3, 0.4)
    x_big.model = "big"  # the same id embedded by both models
    for e in (a, b, both, x_big, Delete(Source("docs", 0, 4), "a")):
        batch.add(e)
    sink.process([batch])
    assert set(small.rows) == {"x#0"} and set(big.rows) == {"b#0", "x#0"}  # a: deleted from every collection
    assert set(small.deleted) == set(big.deleted) == {"a"}
    models = [(k, dict(h)["embedstream.model"]) for _, k, _, h in producer.records]
    assert models[:4] == [(b"a", b"org/small"), (b"b", b"org/big"), (b"x", b"org/small"), (b"x", b"org/big")]
    # a replay of x for the big model only: superseded there, and nowhere written
    again = Batch()
    old = _item("x", 3, 0.9)
    old.model = "big"
    again.add(old)
    sink.process([again])
    assert old.superseded is False  # the same offset is a replay: rewritten, as for one model
    older = Batch()
    stale = _item("x", 1, 0.9)
    stale.model = "big"
    older.add(stale)
    sink.process([older])
    assert stale.superseded and big.rows["x#0"]["source_offset"] == 3


def test_rows_carry_what_the_sparse_side_needs_the_chunk_text_for_bm25_the_vector_for_a_learned_model():
    from worker.core.records import Chunk
    from worker.steps.writing.targets import chunk_rows

    it = Item(Source("docs", 0, 4), "d", "alpha beta", "h", 3, {})
    sparse = (np.array([2, 9], np.int32), np.array([0.5, 0.25], np.float32))
    it.chunks = [Chunk(0, 0, 5, "alpha", "h0", np.ones(4, np.float32), sparse=sparse),
                 Chunk(1, 6, 10, "beta", "h1", np.ones(4, np.float32), sparse=sparse)]
    plain = chunk_rows([it], str)
    assert plain.texts is None and plain.sparse is None
    assert chunk_rows([it], str, SparseMode.of("bm25")).texts == ["alpha", "beta"]  # the whole chunk, not the excerpt
    assert chunk_rows([it], str, SparseMode.of("org/splade")).sparse == [sparse, sparse]
    it.chunks[1].sparse = None
    with pytest.raises(RuntimeError, match="without its sparse vector"):
        chunk_rows([it], str, SparseMode.of("org/splade"))


def test_a_record_that_looks_superseded_is_judged_again_under_a_new_topic_id(caplog):
    """The input topic was deleted and re-created while the worker ran (the consumer only restarted at
    offset 0): the sink asks for the topic's id once, and writes the update under the new source."""
    import logging

    client, producer = RecordingMilvusClient(), RecordingProducer()
    sink = _sink(client, producer)
    first = Batch()
    first.add(_item("x", 299, 0.1))
    sink.process([first])
    assert client.rows["x#0"]["source"] == "T1:0"
    ids = {"docs": "T1"}
    sink.planner.guard = VersionGuard({"docs": "T1"}, lookup=lambda: dict(ids))
    replay = Batch()
    replay.add(_item("x", 5, 0.2))
    with caplog.at_level(logging.WARNING):
        sink.process([replay])  # the same topic: a replay, skipped and told
    assert replay.entries[0].superseded and client.rows["x#0"]["source_offset"] == 299
    assert "Milvus holds offset 299" in caplog.text
    ids["docs"] = "T2"
    update = Batch()
    update.add(_item("x", 0, 0.3))
    sink.process([update])
    assert not update.entries[0].superseded
    assert (client.rows["x#0"]["source"], client.rows["x#0"]["source_offset"]) == ("T2:0", 0)
    assert producer.records[-1][1] == b"x"


def test_output_records_carry_the_models_headers_the_schema_and_the_forwarded_ones():
    from schemas.codec import EMBEDDING_FINGERPRINT, decode_embedding

    trace = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    batch = Batch()
    traced = _item("a", 0, 0.1)
    traced.headers, traced.event_time = trace, 1_600_000_000_000
    for e in (traced, _item("b", 1, 0.2), Delete(Source("docs", 0, 2), "c", headers=trace)):
        batch.add(e)
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer).process([batch])
    (_, _, a, ha), (_, _, b, hb), (_, _, gone, hc) = producer.records
    model = [("embedstream.model", b"m"), ("embedstream.cached", b"false")]
    assert ha == [*model, ("embedstream.schema", EMBEDDING_FINGERPRINT.encode()), *trace]
    assert hb == [*model, ("embedstream.schema", EMBEDDING_FINGERPRINT.encode())]
    source = [("embedstream.source.partition", b"0"), ("embedstream.source.offset", b"2")]  # which version
    assert gone is None and hc == [("embedstream.model", b"m"), *source, *trace]
    assert decode_embedding(a, ha)["event_time"] == 1_600_000_000_000 and decode_embedding(b, hb)["event_time"] is None


def test_a_forwarded_header_that_would_make_the_output_too_large_dead_letters_the_document():
    item = _item("big", 0, 0.5)
    item.headers = [("baggage", b"k=" + b"v" * 40_000)]
    item.original = (b"big", b"original value", item.headers)
    item.large = True
    batch = Batch()
    batch.add(item)
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer, limits=TopicLimits(output=32_768)).process([batch])
    [(topic, key, _, headers)] = producer.records
    assert (topic, key) == ("documents.dlq", b"big")
    assert dict(headers)["embedstream.error.reason"] == b"output_too_large"


def test_documents_milvus_refuses_are_found_by_halves_dead_lettered_and_the_rest_written():
    """Milvus refuses the whole upsert when one row is invalid: retried as an outage, the group (and the
    worker) would stall for good. The refused documents are found alone, dead-lettered with Milvus'
    answer and their original bytes; every other document is written, and the retry of the group
    produces the dead letters."""
    batch = Batch()
    docs = [_item(f"d{o}", o, 0.1) for o in range(16)]
    for o in (3, 11):
        docs[o] = _item(f"bad{o}", o, 0.2)
        docs[o].original = (f"bad{o}".encode(), b"original %d" % o, [("h", b"v")])
    for e in docs:
        batch.add(e)
    client = RecordingMilvusClient(refuse=lambda row: row["doc_id"].startswith("bad"))
    producer, told = RecordingProducer(), []
    sink = _sink(client, producer, dead_lettered=lambda *dead: told.append(dead))
    with pytest.raises(TransientError, match="Milvus refused for good were dead-lettered"):
        sink.process([batch])
    assert sorted(client.rows) == sorted(f"d{o}#0" for o in range(16) if o not in (3, 11))
    dead = [e for e in batch.entries if isinstance(e, DeadLetter)]
    assert [(d.key, d.value, d.headers, d.reason) for d in dead] == [
        (b"bad3", b"original 3", [("h", b"v")], "milvus_rejected"), (b"bad11", b"original 11", [("h", b"v")],
                                                                     "milvus_rejected")]
    assert all("refused" in d.message and "invalid parameter" in d.message for d in dead)
    assert [reason for reason, _ in told] == ["milvus_rejected"] * 2
    upserts = sum(1 for kind, _ in client.calls if kind == "upsert")
    assert upserts <= 2 * 2 * 4 + 1  # about 2·k·log2(n) calls, not one per document
    producer.records.clear()
    sink.process([batch])  # the stage's retry: the rest again (idempotent), the two to the DLQ
    dlq = [(k, dict(h)["embedstream.error.reason"]) for t, k, _, h in producer.records if t == "documents.dlq"]
    assert dlq == [(b"bad3", b"milvus_rejected"), (b"bad11", b"milvus_rejected")]
    assert sum(1 for t, *_ in producer.records if t == "embeddings") == 14
    assert sorted(client.rows) == sorted(f"d{o}#0" for o in range(16) if o not in (3, 11))


def test_an_outage_is_never_split_into_refusals():
    """A timeout fails the group whole (retried, nothing dead-lettered), however many documents it has."""
    batch = Batch()
    for o in range(8):
        batch.add(_item(f"d{o}", o, 0.1))
    client = RecordingMilvusClient(fail_upserts=1)
    with pytest.raises(TransientError, match="deadline"):
        _sink(client, RecordingProducer()).process([batch])
    assert not any(isinstance(e, DeadLetter) for e in batch.entries)
    assert sum(1 for kind, _ in client.calls if kind == "upsert") == 1


def test_a_document_whose_version_milvus_will_not_read_is_dead_lettered_before_anything_is_written():
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("odd", 1, 0.2), _item("c", 2, 0.3), Delete(Source("docs", 0, 3), "gone")):
        batch.add(e)
    client, producer = RecordingMilvusClient(refuse_reads=lambda i: i.startswith("odd")), RecordingProducer()
    _sink(client, producer).process([batch])
    assert sorted(client.rows) == ["a#0", "c#0"]
    dead = [(t, k, dict(h)["embedstream.error.reason"]) for t, k, _, h in producer.records if t == "documents.dlq"]
    assert dead == [("documents.dlq", b"odd", b"milvus_rejected")]
    assert [k for t, k, _, _ in producer.records if t == "embeddings"] == [b"a", b"c", b"gone"]


@pytest.mark.parametrize("how", ["at produce", "at delivery"])
def test_an_output_record_refused_for_good_dead_letters_its_input_and_the_rest_go_on(how):
    """The broker refuses one output record for good (its topic's policy, its form): retrying the group
    would be refused for ever. Produced again alone and refused again, its input record is dead-lettered
    (``output_rejected``, the broker's answer, its original bytes) and the group is written again
    without it."""
    class RefusingProducer(RecordingProducer):
        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
            if key == b"bad" and topic == "embeddings":
                if how == "at produce":
                    raise KafkaException(KafkaError(KafkaError.POLICY_VIOLATION))
                self.records.append((topic, key, value, headers))
                self._callbacks.append(lambda err, msg: on_delivery(KafkaError(KafkaError.POLICY_VIOLATION), msg))
                return
            super().produce(topic, value, key, headers, on_delivery)

    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("bad", 1, 0.2), _item("c", 2, 0.3)):
        batch.add(e)
    batch.entries[1].original = (b"bad", b"its value", None)
    producer, told = RefusingProducer(), []
    sink = _sink(RecordingMilvusClient(), producer, dead_lettered=lambda *dead: told.append(dead))
    with pytest.raises(TransientError, match="producing them alone"):
        sink.process([batch])  # refused beside others: a broker refuses a request's records together
    assert not told
    with pytest.raises(TransientError, match="output topic refused for good were dead-lettered"):
        sink.process([batch])  # refused alone: its own
    producer.records.clear()
    sink.process([batch])
    out = [(t, k, dict(h or ()).get("embedstream.error.reason")) for t, k, _, h in producer.records]
    assert out == [("embeddings", b"a", None), ("documents.dlq", b"bad", b"output_rejected"),
                   ("embeddings", b"c", None)]
    dead = batch.entries[1]
    assert isinstance(dead, DeadLetter) and dead.value == b"its value" and "POLICY_VIOLATION" in dead.message
    assert "Milvus rows were written" in dead.message and [r for r, _ in told] == ["output_rejected"]


def test_records_refused_together_are_produced_alone_and_only_the_one_refused_alone_is_dead_lettered():
    """A broker refuses a request's records together (one over the limit fails its whole batch): the
    innocent ones, produced alone, go through; only the record refused alone is dead-lettered."""
    class BatchRefusingProducer(RecordingProducer):
        def flush(self, _t=None):  # everything handed over since the last flush is one request
            pending = [r for r in zip(self.records[len(self.records) - len(self._callbacks):], self._callbacks)]
            refused = any(key == b"fat" for (_, key, _, _), _ in pending)
            for (topic, *_), cb in pending:
                cb(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if refused and topic == "embeddings" else None, None)
            self._callbacks.clear()
            return 0

    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("fat", 1, 0.2), _item("c", 2, 0.3)):
        batch.add(e)
    producer, told = BatchRefusingProducer(), []
    sink = _sink(RecordingMilvusClient(), producer, dead_lettered=lambda *dead: told.append(dead))
    for _ in range(3):
        try:
            producer.records.clear()
            sink.process([batch])
            break
        except TransientError:
            continue
    else:
        pytest.fail("the group never went through")
    assert [r for r, _ in told] == ["output_too_large"]
    out = [(t, k) for t, k, _, _ in producer.records]
    assert out == [("embeddings", b"a"), ("documents.dlq", b"fat"), ("embeddings", b"c")]


def test_a_tombstone_whose_version_milvus_will_not_read_is_dead_lettered_with_milvus_answer():
    batch = Batch()
    for e in (_item("a", 0, 0.1), Delete(Source("docs", 0, 1), "oddgone", headers=[("h", b"1")])):
        batch.add(e)
    told: list = []
    client, producer = RecordingMilvusClient(refuse_reads=lambda i: i.startswith("odd")), RecordingProducer()
    _sink(client, producer, dead_lettered=lambda *dead: told.append(dead)).process([batch])
    dead = batch.entries[1]
    assert isinstance(dead, DeadLetter) and dead.reason == "milvus_rejected" and dead.source == Source("docs", 0, 1)
    assert (dead.key, dead.value, dead.headers) == (b"oddgone", None, [("h", b"1")])
    assert dead.message.startswith("Milvus refused it for good: ")
    assert [r for r, _ in told] == ["milvus_rejected"] and sorted(client.rows) == ["a#0"]


def test_a_tombstone_whose_output_record_is_refused_for_good_is_dead_lettered_itself():
    class RefusingProducer(RecordingProducer):
        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
            if key == b"gone" and topic == "embeddings":
                raise KafkaException(KafkaError(KafkaError.POLICY_VIOLATION))
            super().produce(topic, value, key, headers, on_delivery)

    batch = Batch()
    for e in (_item("a", 0, 0.1), Delete(Source("docs", 0, 1), "gone")):
        batch.add(e)
    producer = RefusingProducer()
    sink = _sink(RecordingMilvusClient(), producer)
    with pytest.raises(TransientError, match="producing them alone"):
        sink.process([batch])
    with pytest.raises(TransientError, match="output topic refused for good were dead-lettered"):
        sink.process([batch])
    producer.records.clear()
    sink.process([batch])
    out = [(t, k, dict(h or ()).get("embedstream.error.reason")) for t, k, _, h in producer.records]
    assert out == [("embeddings", b"a", None), ("documents.dlq", b"gone", b"output_rejected")]


def test_written_offsets_are_the_highest_next_offset_per_partition_whatever_the_batches_order():
    first, second, fenced = Batch(), Batch(), Batch()
    first.add(_item("a", 9, 0.1))
    second.add(_item("b", 4, 0.1))
    second.add(_item("c", 0, 0.1, partition=1))
    fenced.add(_item("d", 20, 0.1, partition=1))
    group = [first, second, fenced]
    assert written_offsets(group, [frozenset(), frozenset(), frozenset({("docs", 1)})]) == {("docs", 0): 10,
                                                                                          ("docs", 1): 1}
    assert written_offsets(group) == {("docs", 0): 10, ("docs", 1): 21}  # nothing fenced
