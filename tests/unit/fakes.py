"""Small fakes for unit tests: Kafka messages, a consumer, a Milvus client, a producer."""

from __future__ import annotations

import json

import numpy as np
from pymilvus.grpc_gen import schema_pb2

from tools.memory_source import EndOfPartition, MemoryMessage, MemorySource
from worker.core.delivery import AtLeastOnce
from worker.core.records import Batch, Share, split_by_model


class Clock:
    """A clock a test moves by hand (``clock.now = …``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


#: The in-memory message and end-of-partition event of the bench's instant source.
FakeMessage = MemoryMessage
EofMessage = EndOfPartition


def rows_of(request) -> list[dict]:
    """The rows of a pymilvus ``UpsertRequest``, read back column by column (what the server sees)."""
    columns: dict[str, list] = {}
    for f in request.fields_data:
        if f.type == schema_pb2.FloatVector:
            flat, dim = list(f.vectors.float_vector.data), f.vectors.dim
            columns[f.field_name] = [flat[i:i + dim] for i in range(0, len(flat), dim)]
        elif f.type == schema_pb2.SparseFloatVector:
            pairs = np.dtype([("index", "<u4"), ("value", "<f4")])
            columns[f.field_name] = [{int(i): float(v) for i, v in np.frombuffer(raw, pairs).tolist()}
                                     for raw in f.vectors.sparse_float_vector.contents]
        elif f.type == schema_pb2.JSON:
            columns[f.field_name] = [json.loads(raw) for raw in f.scalars.json_data.data]
        elif f.type == schema_pb2.Int64:
            columns[f.field_name] = list(f.scalars.long_data.data)
        else:
            assert f.type == schema_pb2.VarChar, f.field_name
            columns[f.field_name] = list(f.scalars.string_data.data)
    assert all(len(c) == request.num_rows for c in columns.values()), "columns of unequal length"
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def ids_named(expression: str, field: str = "id") -> list[str]:
    """The values of ``<field> in [<string>, …]``, read by milvus-lite's own tokenizer (a Milvus filter
    parser of its own, not this project's code): anything else in the expression fails the test."""
    from milvus_lite.search.filter.tokens import TokenKind, tokenize

    tokens = [t for t in tokenize(expression) if t.kind is not TokenKind.EOF]
    assert [t.kind.name for t in tokens[:3]] == ["IDENT", "IN", "LBRACKET"] and tokens[0].text == field, expression
    assert tokens[-1].kind.name == "RBRACKET", expression
    body = tokens[3:-1]
    assert all(t.kind is (TokenKind.STRING if k % 2 == 0 else TokenKind.COMMA) for k, t in enumerate(body)), expression
    return [t.value for t in body[::2]]


class RecordingMilvusClient:
    """A stand-in for pymilvus' ``MilvusClient`` that records every call and keeps the rows.

    Upserts arrive as the prepared protobuf request (through ``_get_connection``, as in pymilvus),
    so the request the worker builds is what the fake decodes. ``insert`` is recorded, never used."""

    def __init__(self, fail_upserts: int = 0, refuse=None, refuse_reads=None):
        self.calls: list[tuple[str, object]] = []
        self.rows: dict[str, dict] = {}
        #: the companion collection of deletes (``<collection>_deleted``)
        self.deleted: dict[str, dict] = {}
        #: the companion collection of a share group's claims (``<collection>_claims``)
        self.claims: dict[str, dict] = {}
        self.fail_upserts = fail_upserts  # the first N upserts time out, as a frozen server's would
        #: ``refuse(row) -> bool``: an upsert holding such a row is refused whole, as Milvus refuses an
        #: invalid parameter (nothing of it written)
        self.refuse = refuse
        #: ``refuse_reads(id) -> bool``: a read naming such an id is refused whole
        self.refuse_reads = refuse_reads

    def _get_connection(self):
        return self

    def _generate_call_context(self, **kwargs):
        from pymilvus.client.call_context import CallContext

        return CallContext(db_name="")

    def _table(self, collection: str) -> dict[str, dict]:
        return self.deleted if collection.endswith("_deleted") else self.rows

    def upsert(self, collection, data, upsert_param=None, schema=None, timeout=None, context=None):
        assert timeout is not None, "every Milvus call needs a timeout"
        rows = rows_of(upsert_param) if upsert_param is not None else data
        if collection.endswith("_claims"):
            self.calls.append(("claim", rows))
            self.claims.update({r["id"]: dict(r) for r in rows})
            return
        if collection.endswith("_deleted"):
            self.calls.append(("tombstones", rows))
            self.deleted.update({r["id"]: r for r in rows})
            return
        self.calls.append(("upsert", rows))
        bad = [r["id"] for r in rows if self.refuse is not None and self.refuse(r)]
        if bad:
            from pymilvus.exceptions import MilvusException

            raise MilvusException(1100, f"invalid parameter: row {bad[0]!r} refused", is_input_error=True)
        if self.fail_upserts:
            self.fail_upserts -= 1
            raise TimeoutError("deadline exceeded")
        self.rows.update({r["id"]: r for r in rows})

    def insert(self, collection, rows, timeout=None):
        self.calls.append(("insert", rows))

    def query(self, collection, filter, output_fields, timeout=None, consistency_level=None, limit=None):
        assert timeout is not None and consistency_level == "Strong"
        if collection.endswith("_claims"):
            docs = ids_named(filter, "doc_id")
            self.calls.append(("claims", docs))
            return [{f: r[f] for f in output_fields} for r in self.claims.values() if r["doc_id"] in docs]
        table = self._table(collection)
        ids = ids_named(filter)
        if self.refuse_reads is not None and any(self.refuse_reads(i) for i in ids):
            from pymilvus.exceptions import MilvusException

            raise MilvusException(1100, "invalid parameter: expression refused", is_input_error=True)
        return [{"id": i, **{f: table[i].get(f) for f in output_fields}} for i in ids if i in table]

    def delete(self, collection, filter, timeout=None):
        assert timeout is not None
        ids = ids_named(filter)
        if collection.endswith("_claims"):
            self.calls.append(("unclaim", ids))
            for i in ids:
                self.claims.pop(i, None)
            return
        self.calls.append(("delete", ids))
        for i in ids:
            self.rows.pop(i, None)

    def query_iterator(self, collection, batch_size, filter, output_fields, consistency_level, timeout):
        assert timeout is not None
        pages = [[{f: r[f] for f in output_fields} for r in self.rows.values()], []]
        return type("It", (), {"next": lambda self: pages.pop(0), "close": lambda self: None})()


class RecordingProducer:
    """Records what is produced; ``flush`` delivers it, failing every record with ``fail`` (an error
    string or ``KafkaError``) when set."""

    def __init__(self, fail: object = None):
        self.records: list[tuple[str, object, object, object]] = []
        self._callbacks = []
        self.fail = fail
        self.purged = False

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self.records.append((topic, key, value, headers))
        self._callbacks.append(on_delivery)

    def poll(self, _t=0):
        return 0

    def flush(self, _t=None):
        for cb in self._callbacks:
            cb(self.fail, None)
        self._callbacks.clear()
        return 0

    def purge(self):
        self.purged = True
        self._callbacks.clear()

    def close(self):
        self.closed = True


class FakeConsumer(MemorySource):
    """The bench's in-memory consumer (``tools.memory_source``), plus what the loop's tests
    inject and count: ``revoke_next`` / ``lose_next`` make the next ``consume`` call the rebalance
    callback first, as librdkafka does; pauses, resumes and explicit commits are counted."""

    def __init__(self, records: dict[int, list], topic: str = "docs", ends: dict[int, int] | None = None) -> None:
        super().__init__(records, topic, ends)
        self.pause_calls = self.resume_calls = 0
        self._rebalance: tuple[str, list[int]] | None = None

    #: The group's generation as ``consumer_group_metadata`` tells it (bytes, as librdkafka's).
    generation = 1

    def consumer_group_metadata(self) -> bytes:
        return b"generation %d" % self.generation

    def revoke_next(self, partitions: list[int]) -> None:
        self._rebalance = ("revoke", partitions)

    def lose_next(self, partitions: list[int]) -> None:
        self._rebalance = ("lost", partitions)

    def consume(self, num_messages=1, timeout=-1):
        self._assign_once()
        if self._rebalance is not None:
            kind, parts = self._rebalance
            self._rebalance = None
            gone = [tp for tp in self.assigned if tp.partition in parts]
            self._callbacks[kind](self, gone)
            self.assigned = [tp for tp in self.assigned if tp.partition not in parts]
        return self._serve(num_messages, timeout)

    def pause(self, parts):
        self.pause_calls += 1
        super().pause(parts)

    def resume(self, parts):
        self.resume_calls += 1
        super().resume(parts)

    def commit(self, offsets=None, asynchronous=True):
        if offsets is not None:
            self.explicit_commits = getattr(self, "explicit_commits", 0) + 1
        super().commit(offsets, asynchronous)


class TransactionalProducer(RecordingProducer):
    """A transactional producer: ``visible`` holds what read_committed readers would see (records of
    committed transactions), ``offsets`` the offsets committed with them. ``errors[method]`` lists
    ``KafkaError``s that the next calls of that method raise, in turn."""

    def __init__(self, errors: dict[str, list] | None = None):
        super().__init__()
        self.errors = errors or {}
        self.calls: list[str] = []
        self.visible: list[tuple[str, object, object, object]] = []
        self.offsets: dict[tuple[str, int], int] = {}
        #: The group metadata each ``send_offsets_to_transaction`` was given.
        self.offsets_metadata: list[object] = []
        self._open: list = []
        self._open_offsets: dict[tuple[str, int], int] = {}
        #: Whether a transaction is begun and not yet ended (librdkafka refuses a commit without one).
        self.in_transaction = False

    def _call(self, name: str) -> None:
        self.calls.append(name)
        pending = self.errors.get(name)
        if pending:
            from confluent_kafka import KafkaException

            raise KafkaException(pending.pop(0))

    def init_transactions(self, timeout=None):
        self._call("init_transactions")

    def begin_transaction(self):
        self._call("begin_transaction")
        self._open, self._open_offsets = [], {}
        self.in_transaction = True

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        super().produce(topic, value, key, headers, on_delivery)
        self._open.append((topic, key, value, headers))

    def send_offsets_to_transaction(self, positions, group_metadata, timeout=None):
        self._call("send_offsets_to_transaction")
        self.offsets_metadata.append(group_metadata)
        self._open_offsets.update({(tp.topic, tp.partition): tp.offset for tp in positions})

    def commit_transaction(self, timeout=None):
        self.flush()
        self._call("commit_transaction")
        if not self.in_transaction:  # what librdkafka answers a commit after the transaction ended
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(KafkaError(KafkaError._STATE, "Operation not valid in state Ready"))
        self.in_transaction = False
        self.visible += self._open
        self.offsets.update(self._open_offsets)
        self._open, self._open_offsets = [], {}

    def abort_transaction(self, timeout=None):
        self._call("abort_transaction")
        self._open, self._open_offsets = [], {}
        self.in_transaction = False


def at_least_once(producer=None) -> AtLeastOnce:
    """The at-least-once delivery over ``producer`` (a recording one by default)."""
    return AtLeastOnce((lambda: producer) if producer is not None else RecordingProducer, 5.0)


def share_of(group: list[Batch], model: str = "") -> Share:
    """``model``'s share of ``group`` (empty when the group has no items of it)."""
    return split_by_model(group).get(model) or Share(model, group)


def prepare_and_embed(step, share: Share) -> list[dict]:
    """An ``EmbedStep``'s two halves on the calling thread (the worker runs them on two): each batch's
    fresh vectors."""
    return step.embed(share, step.prepare(share))
