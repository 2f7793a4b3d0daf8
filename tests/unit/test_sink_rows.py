"""What one sink write leaves behind, exactly: the rows a shrunk or deleted document loses, the cache
it fills, the headers of cached and fresh chunks, the output limit at its boundary, and the
timestamps and deadlines it passes on. Each test pins a behaviour a mutant of the sink changed
without the older tests noticing (docs/mutation.md)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from schemas.errors import TransientError
from schemas.sparse import BM25, MAX_ACTIVE_DIMS, SparseMode
from worker.core.records import Batch, Chunk, DeadLetter, Delete, Item, Source
from worker.steps.writing.fit import TopicLimits, output_room, record_size
from worker.steps.writing.sink import SinkStep
from worker.steps.writing.targets import ModelTarget, chunk_rows
from worker.steps.writing.versions import VersionGuard

from .fakes import RecordingMilvusClient, RecordingProducer, at_least_once
from .test_sink import _big_metadata_item, _item, _owned, _sink, _store


def _rows_of(client: RecordingMilvusClient, doc: str, count: int, offset: int) -> None:
    """Milvus holds ``doc`` as ``count`` chunks written from offset ``offset`` of docs[0]."""
    for k in range(count):
        client.rows[f"{doc}#{k}"] = {"id": f"{doc}#{k}", "doc_id": doc, "chunk_index": k, "chunk_count": count,
                                     "source": "T1:0", "source_offset": offset}


def _chunks(doc_id: str, o: int, n: int) -> Item:
    text = " ".join(f"w{k}" for k in range(n))
    item = Item(Source("docs", 0, o), doc_id, text, f"h{o}", n, {})
    item.chunks = [Chunk(k, 0, 2, f"w{k}", f"h{o}.{k}", np.full(4, 0.1, np.float32)) for k in range(n)]
    return item


def test_a_shrunk_document_loses_its_last_chunks_and_a_deleted_one_all_of_them_chunk_0_last():
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _rows_of(client, "a", 3, 1)
    _rows_of(client, "b", 4, 2)
    _rows_of(client, "c", 2, 3)
    batch = Batch()
    for e in (_chunks("a", 5, 1), Delete(Source("docs", 0, 6), "b"), _chunks("c", 7, 3)):
        batch.add(e)
    _sink(client, producer).process([batch])
    deletes = [ids for kind, ids in client.calls if kind == "delete"]
    # a shrank from 3 to 1 (its chunks 1, 2 go); b's chunks past 0 go first, chunk 0 (which names
    # the others) after them; c grew, so nothing of it is stale
    assert deletes == [["a#1", "a#2", "b#1", "b#2", "b#3"], ["b#0"]]
    assert sorted(client.rows) == ["a#0", "c#0", "c#1", "c#2"]
    assert client.rows["a#0"]["chunk_count"] == 1 and client.rows["c#2"]["source_offset"] == 7


def test_a_delete_is_recorded_with_its_version_and_the_writes_time():
    client, producer = RecordingMilvusClient(), RecordingProducer()
    _rows_of(client, "b", 1, 2)
    batch = Batch()
    batch.add(Delete(Source("docs", 0, 6), "b"))
    before = int(time.time() * 1000)
    _sink(client, producer).process([batch])
    after = int(time.time() * 1000)
    marker = client.deleted["b"]
    assert (marker["source"], marker["source_offset"]) == ("T1:0", 6)
    assert before <= marker["updated_at"] <= after


def test_the_output_and_the_rows_are_stamped_with_the_writes_time_in_milliseconds():
    from schemas.codec import decode_embedding

    client, producer = RecordingMilvusClient(), RecordingProducer()
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    before = int(time.time() * 1000)
    _sink(client, producer).process([batch])
    after = int(time.time() * 1000)
    [(_, _, value, headers)] = producer.records
    assert before <= decode_embedding(value, headers)["embedded_at"] <= after
    assert before <= client.rows["a#0"]["updated_at"] <= after


def test_a_cached_chunk_says_so_in_its_header_and_a_fresh_one_too():
    item = _chunks("a", 0, 2)
    item.chunks[0].cached = True
    batch = Batch()
    batch.add(item)
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer).process([batch])
    assert [dict(h)["embedstream.cached"] for _, _, _, h in producer.records] == [b"true", b"false"]


class _RecordingCache:
    def __init__(self) -> None:
        self.filled: list[dict] = []

    def set_many(self, vectors: dict) -> None:
        self.filled.append(dict(vectors))


def test_the_cache_is_filled_with_each_models_fresh_vectors_of_the_whole_group_once():
    small_cache, big_cache = _RecordingCache(), _RecordingCache()
    targets = {"small": ModelTarget(_store(RecordingMilvusClient()), "org/small", 4, cache=small_cache),
               "big": ModelTarget(_store(RecordingMilvusClient()), "org/big", 4, cache=big_cache),
               "none": ModelTarget(_store(RecordingMilvusClient()), "org/none", 4)}
    sink = SinkStep(targets, at_least_once(producer=RecordingProducer()), fence=_owned(0),
                    guard=VersionGuard({"docs": "T1"}), output_topic="embeddings", dlq_topic="documents.dlq",
                    delivery_timeout_s=5)
    v1, v2, v3 = (np.full(4, x, np.float32) for x in (0.1, 0.2, 0.3))
    first, second = Batch(), Batch()
    for b, o in ((first, 0), (second, 1)):
        it = _item(f"d{o}", o, 0.1)
        it.model = "small"
        b.add(it)
    # what the embed stage handed on with each batch: its fresh vectors by model
    sink.process([first, second], [{"small": {"h1": v1}, "none": {"hx": v3}}, {"small": {"h2": v2}}])
    assert len(small_cache.filled) == 1 and set(small_cache.filled[0]) == {"h1", "h2"}
    assert small_cache.filled[0]["h2"] is v2
    assert big_cache.filled == []  # nothing fresh for it: no call at all


class _ErasingCache(_RecordingCache):
    """Records what is deleted, and which rows Milvus still held at that moment."""

    def __init__(self, client: RecordingMilvusClient, fails: bool = False) -> None:
        super().__init__()
        self.client, self.fails = client, fails
        self.deleted: list[tuple[set[str], set[str]]] = []

    def delete_many(self, hashes) -> bool:
        self.deleted.append((set(hashes), set(self.client.rows)))
        return not self.fails


def _cached_sink(client: RecordingMilvusClient, cache) -> SinkStep:
    return SinkStep({"": ModelTarget(_store(client), "m", 4, cache=cache)}, at_least_once(producer=RecordingProducer()),
                    fence=_owned(0), guard=VersionGuard({"docs": "T1"}), output_topic="embeddings",
                    dlq_topic="documents.dlq", delivery_timeout_s=5)


def test_a_tombstone_removes_each_of_its_documents_cached_texts_before_its_rows():
    client = RecordingMilvusClient()
    _rows_of(client, "b", 3, 2)
    for k, h in enumerate(("hb0", "hb1", "hb2")):
        client.rows[f"b#{k}"]["content_hash"] = h
    _rows_of(client, "keep", 1, 3)
    client.rows["keep#0"]["content_hash"] = "hk"
    cache = _ErasingCache(client)
    batch = Batch()
    batch.add(Delete(Source("docs", 0, 6), "b"))
    _cached_sink(client, cache).process([batch])
    # every chunk's text, and no other document's; the rows were still there, so a redo finds them again
    assert cache.deleted == [({"hb0", "hb1", "hb2"}, {"b#0", "b#1", "b#2", "keep#0"})]
    assert sorted(client.rows) == ["keep#0"]


def test_a_document_written_and_deleted_in_one_group_leaves_nothing_in_the_cache():
    client = RecordingMilvusClient()
    cache = _ErasingCache(client)
    batch = Batch()
    item = _chunks("x", 0, 2)
    batch.add(item)
    batch.add(Delete(Source("docs", 0, 1), "x"))
    other = _chunks("y", 2, 1)
    other.chunks[0].hash = "hy"
    batch.add(other)
    fresh = {h: np.full(4, x, np.float32) for h, x in (("h0.0", 0.1), ("h0.1", 0.2), ("hy", 0.3))}
    _cached_sink(client, cache).process([batch], [{"": fresh}])
    assert [set(f) for f in cache.filled] == [{"hy"}]  # the deleted document's fresh texts are never cached
    assert [hashes for hashes, _ in cache.deleted] == [{"h0.0", "h0.1"}]  # nor left from an earlier attempt
    assert sorted(client.rows) == ["y#0"]


def test_a_cache_that_fails_the_erasure_is_warned_of_and_the_delete_goes_on(caplog):
    client = RecordingMilvusClient()
    _rows_of(client, "b", 1, 2)
    client.rows["b#0"]["content_hash"] = "hb0"
    batch = Batch()
    batch.add(Delete(Source("docs", 0, 6), "b"))
    _cached_sink(client, _ErasingCache(client, fails=True)).process([batch])
    assert client.rows == {} and "could not be removed" in caplog.text and "CACHE_TTL_SECONDS" in caplog.text


def test_each_write_waits_for_the_records_as_long_as_the_delivery_timeout():
    class TimedProducer(RecordingProducer):
        waited: list = []

        def flush(self, timeout=None):
            self.waited.append(timeout)
            return super().flush(timeout)

    producer = TimedProducer()
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    sink = SinkStep({"": ModelTarget(_store(RecordingMilvusClient()), "m", 4)}, at_least_once(producer=producer),
                    fence=_owned(0), guard=VersionGuard({"docs": "T1"}), output_topic="embeddings",
                    dlq_topic="documents.dlq", delivery_timeout_s=7.5)
    sink.process([batch])
    assert producer.waited and producer.waited[0] == 7.5


def test_milvus_is_written_on_the_sinks_own_writer_thread():
    class ThreadNoting(RecordingMilvusClient):
        threads: list[str] = []

        def upsert(self, collection, data, upsert_param=None, schema=None, timeout=None):
            self.threads.append(threading.current_thread().name)
            return super().upsert(collection, data, upsert_param, schema, timeout)

    client = ThreadNoting()
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    _sink(client, RecordingProducer()).process([batch])
    # the bench's CPU table attributes this thread's time by its name
    assert client.threads and all(t.startswith("milvus-write") for t in client.threads)


def test_a_tombstone_goes_to_the_output_topic_naming_every_model():
    targets = {"small": ModelTarget(_store(RecordingMilvusClient()), "org/small", 4),
               "big": ModelTarget(_store(RecordingMilvusClient()), "org/big", 4)}
    producer = RecordingProducer()
    sink = SinkStep(targets, at_least_once(producer=producer), fence=_owned(0), guard=VersionGuard({"docs": "T1"}),
                    output_topic="embeddings", dlq_topic="documents.dlq", delivery_timeout_s=5)
    batch = Batch()
    batch.add(Delete(Source("docs", 0, 1), "gone"))
    sink.process([batch])
    assert producer.records == [("embeddings", b"gone", None, [("embedstream.model", b"org/small,org/big"),
                                                               ("embedstream.source.partition", b"0"),
                                                               ("embedstream.source.offset", b"1")])]


def test_a_bm25_collections_rows_carry_each_chunks_whole_text_through_the_sink():
    client = RecordingMilvusClient()
    sink = SinkStep({"": ModelTarget(_store(client), "m", 4, sparse=BM25)},
                    at_least_once(producer=RecordingProducer()), fence=_owned(0), guard=VersionGuard({"docs": "T1"}),
                    output_topic="embeddings", dlq_topic="documents.dlq", delivery_timeout_s=5)
    batch = Batch()
    batch.add(_chunks("a", 0, 2))
    sink.process([batch])
    [rows] = [rows for kind, rows in client.calls if kind == "upsert"]
    assert [r.get("text") for r in rows] == ["w0", "w1"]


def test_a_learned_sparse_model_leaves_less_room_for_id_and_metadata():
    limits = TopicLimits(output=100_000)
    targets = {"dense": ModelTarget(_store(RecordingMilvusClient()), "d", 4),
               "learned": ModelTarget(_store(RecordingMilvusClient()), "l", 4, sparse=SparseMode.of("org/splade"))}
    sink = SinkStep(targets, at_least_once(producer=RecordingProducer()), fence=_owned(0),
                    guard=VersionGuard({"docs": "T1"}), output_topic="embeddings", dlq_topic="documents.dlq",
                    delivery_timeout_s=5, limits=limits)
    rooms = sink.planner.output_rooms
    assert rooms == {"dense": output_room(4, 100_000), "learned": output_room(4, 100_000, MAX_ACTIVE_DIMS)}
    assert rooms["learned"] < rooms["dense"]


def _measured(item: Item) -> int:
    """The size of ``item``'s largest output record, as the sink must measure it (key, value, and
    the headers of a fresh chunk: the larger ones), stamped now (a timestamp's encoded size
    depends on its value)."""
    sink = _sink(RecordingMilvusClient(), RecordingProducer())
    sink.output.ready()
    headers = [*sink._headers[""][False], *(item.headers or ())]
    now = int(time.time() * 1000)
    return max(record_size(item.id.encode(), v, headers) for v in sink.output.values(item, "m", 4, now))


@pytest.mark.parametrize("over", [0, 1])
def test_an_output_record_at_exactly_the_limit_is_written_and_one_byte_over_is_dead_lettered(over):
    size = _measured(_big_metadata_item("big", 1, 20_000))
    told: list[tuple[str, str]] = []
    batch = Batch()
    batch.add(_big_metadata_item("big", 1, 20_000))
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer, limits=TopicLimits(output=size - over),
          dead_lettered=lambda *dead: told.append(dead)).process([batch])
    [(topic, key, _, _)] = producer.records
    if over:
        assert topic == "documents.dlq" and [r for r, _ in told] == ["output_too_large"]
        assert f"{size:,} bytes" in told[0][1]  # the breaker's halting line can quote it
    else:
        assert topic == "embeddings" and told == []


def test_every_oversized_document_of_a_batch_is_measured_not_only_the_first():
    small = _big_metadata_item("small", 0, 10)  # kept its original too, but far under the room
    batch = Batch()
    for e in (small, _big_metadata_item("big", 1, 40_000)):
        batch.add(e)
    producer = RecordingProducer()
    _sink(RecordingMilvusClient(), producer, limits=TopicLimits(output=32_768)).process([batch])
    assert [(t, k) for t, k, _, _ in producer.records] == [("embeddings", b"small"), ("documents.dlq", b"big")]


def test_the_topic_id_is_not_looked_up_again_while_nothing_looks_superseded():
    looked: list[int] = []

    def lookup():
        looked.append(1)
        return {"docs": "T1"}

    client, producer = RecordingMilvusClient(), RecordingProducer()
    sink = _sink(client, producer)
    sink.planner.guard = VersionGuard({"docs": "T1"}, lookup=lookup)
    for o in (1, 2):
        batch = Batch()
        batch.add(_item("a", o, 0.1))
        batch.add(DeadLetter(Source("docs", 0, 100 + o), b"k", b"bad", None, "decode_error", "x"))  # no version
        sink.process([batch])
    assert looked == []
    stale = Batch()
    stale.add(_item("a", 0, 0.1))
    sink.process([stale])
    assert looked == [1]  # once, for the record that looked superseded


def test_a_partition_lost_during_a_transaction_is_a_fence_error_to_retry():
    fence = _owned(0, 1)
    batch = Batch()
    batch.add(_item("a", 0, 0.1))
    fence.stamp(batch)
    sink = _sink(RecordingMilvusClient(), RecordingProducer(), fence)
    planned = sink.plan([batch])
    fence.publish({("docs", 1)})
    with pytest.raises(TransientError) as err:
        sink.owned_offsets(planned)
    assert err.value.system == "fence" and "[0]" in str(err.value)


def test_a_chunk_without_a_vector_is_named_as_the_embed_steps_bug():
    it = _chunks("a", 0, 1)
    it.chunks[0].vector = None
    with pytest.raises(RuntimeError, match="without a vector"):
        chunk_rows([it], str)


def test_at_least_once_closes_within_its_timeout_and_drops_a_broken_producer_without_waiting():
    from worker.core.delivery import AtLeastOnce

    class Noting(RecordingProducer):
        def __init__(self):
            super().__init__()
            self.flushes: list = []
            self.closed = False

        def flush(self, timeout=None):
            self.flushes.append(timeout)
            return super().flush(timeout)

        def close(self):
            self.closed = True

    made = [Noting(), Noting()]
    delivery = AtLeastOnce(lambda: made.pop(0), 6.0)
    old = delivery.producer
    delivery._replace_producer()
    assert old.purged and old.flushes == [0]  # what it held is dropped: nothing waited for
    new = delivery.producer
    delivery.close()
    assert new.flushes == [6.0] and new.closed


def test_an_at_least_once_write_times_its_output_and_milvus_sides_and_counts_each_models_documents():
    from prometheus_client import REGISTRY

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    sides = ("output", "milvus")
    before = {side: (value("embedstream_sink_seconds_count", sink=side),
                     value("embedstream_sink_seconds_sum", sink=side)) for side in sides}
    documents = value("embedstream_model_documents_total", model="m")
    batch = Batch()
    for e in (_item("a", 0, 0.1), _item("b", 1, 0.2)):
        batch.add(e)
    _sink(RecordingMilvusClient(), RecordingProducer()).process([batch])
    for side in sides:
        assert value("embedstream_sink_seconds_count", sink=side) - before[side][0] == 1, side
        assert 0 <= value("embedstream_sink_seconds_sum", sink=side) - before[side][1] < 60, side  # seconds
    assert value("embedstream_model_documents_total", model="m") - documents == 2


def test_closing_the_sink_waits_for_a_milvus_write_still_running():
    import threading

    sink = _sink(RecordingMilvusClient(), RecordingProducer())
    release, finished = threading.Event(), []
    sink._milvus.submit(lambda: (release.wait(5), finished.append(True)))
    threading.Timer(0.2, release.set).start()
    sink.close()
    assert finished == [True]
