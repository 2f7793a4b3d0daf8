"""Exactly-once delivery (``connectors.transactions``, the sink's transactions, the ledger's):
each failure class as librdkafka defines it, against a fake transactional producer whose
``visible`` records are what a read_committed reader sees."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from connectors.transactions import Transactions, TransactionsFailed, transactional_id
from schemas.errors import TransientError
from worker.core.delivery import ExactlyOnce
from worker.core.fence import Fence
from worker.core.ledger import TransactionLedger
from worker.core.records import Batch, DeadLetter, Source, Written
from worker.steps.writing.sink import SinkStep
from worker.steps.writing.targets import ModelTarget
from worker.steps.writing.versions import VersionGuard

from .fakes import RecordingMilvusClient, TransactionalProducer
from .test_sink import _item, _store

RETRIABLE = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
ABORTABLE = KafkaError(KafkaError._STATE, "needs an abort", txn_requires_abort=True)
FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer producer", fatal=True)


def _sink(producer, client=None, fence=None):
    if fence is None:
        fence = Fence(lease_s=60)
        fence.publish({("docs", p) for p in range(4)})
    txn = Transactions(lambda: producer, timeout=0.2, sleep=lambda _s: time.sleep(0.02))
    txn.group_metadata = "group-metadata"
    delivery = ExactlyOnce(txn, 5)
    sink = SinkStep({"": ModelTarget(_store(client or RecordingMilvusClient()), "m", 4)}, delivery,
                    fence=fence, guard=VersionGuard({"docs": "T1"}), output_topic="embeddings",
                    dlq_topic="documents.dlq", delivery_timeout_s=5)
    return sink, txn


def _group():
    first, second = Batch(), Batch()
    first.add(_item("a", 0, 0.1))
    first.add(_item("b", 0, 0.2, partition=1))
    second.add(DeadLetter(Source("docs", 0, 1), b"k", b"bad", None, "decode_error", "not Avro"))
    second.add(_item("c", 1, 0.3, partition=1))
    return [first, second]


def test_transactional_id_names_the_group_and_the_member():
    assert transactional_id("embedstream", "worker-0") == "embedstream-embedstream-worker-0"


def test_a_group_is_one_transaction_with_its_records_and_offsets():
    producer = TransactionalProducer()
    sink, _ = _sink(producer)
    group = _group()
    written = sink.process(group)
    assert producer.calls == ["init_transactions", "begin_transaction", "send_offsets_to_transaction",
                              "commit_transaction"]
    assert sorted(t for t, *_ in producer.visible) == ["documents.dlq", "embeddings", "embeddings", "embeddings"]
    # each batch is handed on with what its transaction committed, to the polling thread's ledger
    assert len(written) == 2 and all(producer.offsets == {("docs", 0): 2, ("docs", 1): 2} == w.committed
                                     for w in written)
    assert all(b.delivered for b in group)


def test_an_abortable_error_aborts_and_the_redo_is_seen_once():
    producer = TransactionalProducer({"commit_transaction": [ABORTABLE]})
    sink, _ = _sink(producer)
    group = _group()
    with pytest.raises(TransientError, match="aborted"):
        sink.process(group)
    assert producer.visible == [] and producer.offsets == {}
    assert producer.calls[-1] == "abort_transaction"
    sink.process(group)  # the pipeline's retry: a new transaction
    assert len(producer.visible) == 4 and producer.offsets == {("docs", 0): 2, ("docs", 1): 2}


def test_a_commit_that_timed_out_is_finished_never_redone():
    producer = TransactionalProducer({"commit_transaction": [RETRIABLE] * 50})
    sink, txn = _sink(producer)
    group = _group()
    with pytest.raises(TransientError, match="commit is retried"):
        sink.process(group)
    assert txn.pending and "abort_transaction" not in producer.calls
    producer.errors.clear()
    produced = len(producer.records)
    written = sink.process(group)
    assert len(producer.records) == produced  # nothing produced again
    assert len(producer.visible) == 4 and not txn.pending
    # the finished commit's offsets reach the ledger with each batch, as a commit's do
    assert [w.committed for w in written] == [{("docs", 0): 2, ("docs", 1): 2}] * 2 and all(b.delivered for b in group)


def test_a_commit_finished_at_the_retry_hands_on_what_its_plan_left_unwritten():
    """Partition 1 was no longer this member's when the group was planned: the group's transaction
    holds partition 0 only. Its commit timed out and is finished at the retry; each batch is handed on
    with what that plan left to partition 1's new owner, so the ledger stores none of its offsets."""
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0)})
    producer = TransactionalProducer({"commit_transaction": [RETRIABLE] * 50})
    sink, txn = _sink(producer, fence=fence)
    group = _group()
    with pytest.raises(TransientError, match="commit is retried"):
        sink.process(group)
    producer.errors.clear()
    written = sink.process(group)
    assert not txn.pending and [w.fenced for w in written] == [frozenset({("docs", 1)})] * 2
    assert [w.committed for w in written] == [{("docs", 0): 2}] * 2
    assert [w.offsets(b) for w, b in zip(written, group)] == [{("docs", 0): 1}, {("docs", 0): 2}]


def test_a_pending_commit_of_the_ledgers_offsets_alone_is_finished_and_the_next_group_still_written():
    """The ledger's transaction of offsets alone (a drained end past a commit marker) timed out: its
    commit is pending when the sink's next group comes. The sink finishes it, and then writes the
    group in a transaction of its own: the pending commit was not this group's, so the group is not
    taken for written (it would be lost: no record out, no row in Milvus, its offsets committed by
    the next transaction)."""
    producer = TransactionalProducer({"commit_transaction": [RETRIABLE] * 50})
    sink, txn = _sink(producer)
    with pytest.raises(TransientError, match="commit is retried"):
        txn.commit_offsets([TopicPartition("docs", 0, 0)])
    assert txn.pending
    producer.errors.clear()
    group = _group()
    written = sink.process(group)
    assert producer.calls.count("commit_transaction") > 1 and not txn.pending
    assert sorted(t for t, *_ in producer.visible) == ["documents.dlq", "embeddings", "embeddings", "embeddings"]
    assert [w.committed for w in written] == [{("docs", 0): 2, ("docs", 1): 2}] * 2


def test_a_group_whose_commit_timed_out_and_was_aborted_since_is_written_again():
    """The group's commit timed out (pending), then the transaction was aborted before the retry
    (a revoke's barrier, a stop): the retry finds its transaction ended aborted and writes the group
    anew, never taking it for committed."""
    producer = TransactionalProducer({"commit_transaction": [RETRIABLE] * 50})
    sink, txn = _sink(producer)
    group = _group()
    with pytest.raises(TransientError, match="commit is retried"):
        sink.process(group)
    txn.abort()
    producer.errors.clear()
    written = sink.process(group)
    assert len(producer.visible) == 4 and [w.committed for w in written] == [{("docs", 0): 2, ("docs", 1): 2}] * 2


def test_a_transaction_aborted_while_its_commit_was_pending_is_not_committed_again():
    """The bench's exactly-once stop saw it: a commit timed out (pending), the stop aborted the
    transaction, and the revoke's offsets then asked librdkafka to finish that commit first, which it
    refuses in its Ready state (a TransactionsFailed out of the consumer's close). An aborted
    transaction has nothing left to finish: the offsets go in a transaction of their own."""
    producer = TransactionalProducer({"commit_transaction": [RETRIABLE] * 50})
    sink, txn = _sink(producer)
    with pytest.raises(TransientError, match="commit is retried"):
        sink.process(_group())
    assert txn.pending
    txn.abort()
    assert not txn.pending and not producer.in_transaction
    producer.errors.clear()
    txn.commit_offsets([TopicPartition("docs", 0, 7)])
    assert producer.offsets[("docs", 0)] == 7 and not txn.pending


def test_retriable_errors_are_retried_in_place():
    producer = TransactionalProducer({"send_offsets_to_transaction": [RETRIABLE, RETRIABLE]})
    sink, _ = _sink(producer)
    sink.process(_group())
    assert producer.calls.count("send_offsets_to_transaction") == 3 and len(producer.visible) == 4


def test_a_fenced_producer_stops_the_worker():
    producer = TransactionalProducer({"commit_transaction": [FENCED]})
    sink, _ = _sink(producer)
    with pytest.raises(TransactionsFailed, match="fenced"):
        sink.process(_group())
    assert producer.visible == []


def test_fatal_at_start_is_reported():
    with pytest.raises(TransactionsFailed, match="initialising"):
        Transactions(lambda: TransactionalProducer({"init_transactions": [FENCED]}), timeout=0.2)


def test_a_milvus_outage_keeps_the_transaction_open_and_the_retry_writes_milvus_alone():
    producer, client = TransactionalProducer(), RecordingMilvusClient(fail_upserts=1)
    sink, txn = _sink(producer, client=client)
    group = _group()
    with pytest.raises(TransientError, match="milvus"):
        sink.process(group)
    assert txn.open and producer.visible == [] and "abort_transaction" not in producer.calls
    produced = len(producer.records)
    sink.process(group)
    assert len(producer.records) == produced  # the records were not produced again
    assert len(producer.visible) == 4 and producer.calls.count("commit_transaction") == 1
    assert sorted(client.rows) == ["a#0", "b#0", "c#0"]


def test_a_milvus_outage_longer_than_half_the_transaction_timeout_aborts_it():
    producer, client = TransactionalProducer(), RecordingMilvusClient(fail_upserts=1)
    sink, txn = _sink(producer, client=client)
    txn.keep_open_s = 0.0
    group = _group()
    with pytest.raises(TransientError):
        sink.process(group)
    assert not txn.open and producer.calls[-1] == "abort_transaction"
    sink.process(group)
    assert len(producer.visible) == 4


def _aborted_for_a_rebalance_then_redone(producer, sink, rebalance) -> None:
    """``rebalance()`` runs while the group's records are in flight: the transaction is aborted
    (nothing visible), and the redo commits the group's four records."""
    real_flush = producer.flush

    def rebalance_then_flush(t=None):
        rebalance()
        return real_flush(t)

    producer.flush = rebalance_then_flush
    group = _group()
    with pytest.raises(TransientError, match="rebalanced"):
        sink.process(group)
    assert producer.visible == [] and producer.calls[-1] == "abort_transaction"
    producer.flush = real_flush
    sink.process(group)
    assert len(producer.visible) == 4


def test_a_rebalance_during_the_transaction_aborts_it():
    producer = TransactionalProducer()
    sink, txn = _sink(producer)

    def assign_callback():  # the polling thread's assign callback sets the next generation
        txn.group_metadata = "the next generation"

    _aborted_for_a_rebalance_then_redone(producer, sink, assign_callback)


def test_a_partition_revoked_during_the_transaction_is_left_out_of_the_redo():
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0), ("docs", 1)})
    producer = TransactionalProducer()
    sink, _ = _sink(producer, fence=fence)
    real_confirm_flush = producer.flush

    def revoke_then_flush(t=None):  # the revoke lands while the records are in flight
        fence.publish({("docs", 0)})
        return real_confirm_flush(t)

    producer.flush = revoke_then_flush
    group = _group()
    with pytest.raises(TransientError, match=r"partitions \[1\] were revoked or lost"):
        sink.process(group)
    assert producer.visible == [] and producer.offsets == {}
    producer.flush = real_confirm_flush
    sink.process(group)
    assert producer.offsets == {("docs", 0): 2}
    assert sorted(k for _, k, _, _ in producer.visible) == [b"a", b"k"]  # partition 1's b and c left out


def test_a_partition_lost_and_given_back_during_the_transaction_is_left_to_its_new_reading():
    """Kafka, broker frozen past the session: the member lost every partition and was given them
    back while a group read before was in its transaction. Its records are read again from the
    committed offset; the old group may write none of them, nor commit their offsets."""
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0), ("docs", 1)})
    producer = TransactionalProducer()
    sink, _ = _sink(producer, fence=fence)
    group = [fence.stamp(batch) for batch in _group()]
    real_flush = producer.flush

    def lost_and_back_then_flush(t=None):
        fence.publish(set())  # lost
        fence.publish({("docs", 0), ("docs", 1)})  # the rejoin gives them back
        return real_flush(t)

    producer.flush = lost_and_back_then_flush
    with pytest.raises(TransientError, match=r"partitions \[0, 1\] were revoked or lost"):
        sink.process(group)
    assert producer.visible == [] and producer.offsets == {}
    producer.flush = real_flush
    written = sink.process(group)  # the redo: nothing of the old tenure is written or committed
    assert producer.offsets == {} and [k for _, k, _, _ in producer.visible] == []
    assert all(w.fenced == {("docs", 0), ("docs", 1)} and w.committed == {} for w in written)


class _Consumer:
    def __init__(self):
        self.commits = 0

    def store_offsets(self, offsets):
        raise AssertionError("exactly-once never stores offsets in the consumer")

    def commit(self, **_kw):
        self.commits += 1


def test_the_ledger_commits_only_through_transactions():
    producer = TransactionalProducer()
    txn = Transactions(lambda: producer, timeout=0.2)
    txn.group_metadata = "gm"
    consumer = _Consumer()
    ledger = TransactionLedger(consumer, 0, txn, owned={("docs", 0), ("docs", 1)})
    batch = Batch(offsets={("docs", 0): 10})
    assert ledger.finished(batch, Written(committed={("docs", 0): 10})) == 0  # the sink's transaction
    assert ledger.flush(sync=True) and producer.calls == ["init_transactions"]
    ledger.store({("docs", 0): 11, ("docs", 1): 5})  # a drained end past a commit marker
    assert ledger.flush(sync=True)
    assert producer.offsets == {("docs", 0): 11, ("docs", 1): 5} and consumer.commits == 0
    ledger.store({("docs", 1): 6})
    ledger.revoked([("docs", 1)])                    # revoked before the commit: never committed
    assert ledger.flush(sync=True) and producer.offsets[("docs", 1)] == 5


def test_a_revoke_waits_for_the_transaction_committing_now():
    producer = TransactionalProducer()
    txn = Transactions(lambda: producer, timeout=0.2)
    ledger = TransactionLedger(_Consumer(), 0, txn)
    order = []
    held = threading.Event()

    def sink_commit():  # on the sink's thread: the lock is re-entrant, so another thread must hold it
        with txn.lock:
            held.set()
            time.sleep(0.2)
            order.append("commit")

    threading.Thread(target=sink_commit).start()
    held.wait(5)
    ledger.revoked([("docs", 0)])
    order.append("revoke goes on")
    assert order == ["commit", "revoke goes on"]


def test_an_abort_that_cannot_finish_replaces_the_producer():
    """Tansu refuses the epoch bump librdkafka asks for after records timed out: the abort hangs."""
    stuck = TransactionalProducer({"commit_transaction": [ABORTABLE], "abort_transaction": [RETRIABLE] * 50})
    fresh = TransactionalProducer()
    made = iter([stuck, fresh])
    txn = Transactions(lambda: next(made), timeout=0.2, sleep=lambda _s: time.sleep(0.02))
    txn.group_metadata = "gm"
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0), ("docs", 1)})
    sink = SinkStep({"": ModelTarget(_store(RecordingMilvusClient()), "m", 4)}, ExactlyOnce(txn, 5), fence=fence,
                    guard=VersionGuard({"docs": "T1"}), output_topic="embeddings", dlq_topic="documents.dlq",
                    delivery_timeout_s=5)
    group = _group()
    with pytest.raises(TransientError):
        sink.process(group)
    assert txn.producer is fresh and fresh.calls == ["init_transactions"] and stuck.purged
    sink.process(group)
    assert stuck.visible == [] and len(fresh.visible) == 4


def test_a_generation_moved_on_without_a_callback_is_learnt_at_the_next_tick():
    """On Kafka a member joining that gives this one nothing new calls no rebalance callback, yet
    moves the group's generation on: the ledger's tick reads it again, the transaction begun
    under the old generation is aborted (Kafka would refuse its offsets), and the redo commits."""
    from .fakes import FakeConsumer

    producer, consumer = TransactionalProducer(), FakeConsumer({})
    sink, txn = _sink(producer)
    ledger = TransactionLedger(consumer, 0, txn)
    ledger.tick()
    assert txn.group_metadata == b"generation 1"

    def join():
        consumer.generation = 2  # another member joined: no callback here
        ledger.tick()  # the polling thread's next tick

    _aborted_for_a_rebalance_then_redone(producer, sink, join)
    assert txn.group_metadata == producer.offsets_metadata[-1] == b"generation 2"


def test_a_record_the_transaction_could_not_deliver_aborts_it_and_the_retry_redoes_the_group():
    """A delivery failure inside the transaction (not Milvus): aborted at once, never kept open, the
    error counted as Kafka's (the retries metric's label), and the redo seen once."""
    producer = TransactionalProducer()
    producer.fail = KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out")
    sink, txn = _sink(producer)
    group = _group()
    with pytest.raises(TransientError) as failed:
        sink.process(group)
    assert failed.value.system == "kafka"
    assert producer.calls[-1] == "abort_transaction" and not txn.open and producer.visible == []
    producer.fail = None
    sink.process(group)  # a new transaction: every record produced again, seen once
    assert producer.calls.count("begin_transaction") == 2 and len(producer.visible) == 4


class _RefusingProducer(TransactionalProducer):
    """Its first produce is refused by the transaction's state (librdkafka raises at once)."""

    refuse = 1

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        if self.refuse:
            self.refuse -= 1
            raise KafkaException(KafkaError(KafkaError._STATE, "operation not valid in state Ready"))
        super().produce(topic, value, key, headers, on_delivery)


def test_a_produce_the_transaction_refuses_is_kafkas_retriable_error_and_aborts():
    producer = _RefusingProducer()
    sink, txn = _sink(producer)
    group = _group()
    with pytest.raises(TransientError, match="the transaction was aborted, its batches are redone") as failed:
        sink.process(group)
    assert failed.value.system == "kafka" and producer.calls[-1] == "abort_transaction" and not txn.open
    sink.process(group)
    assert len(producer.visible) == 4


def test_a_milvus_outage_is_counted_as_milvus_and_the_carried_group_is_only_that_group():
    producer, client = TransactionalProducer(), RecordingMilvusClient(fail_upserts=1)
    sink, txn = _sink(producer, client=client)
    group = _group()
    with pytest.raises(TransientError) as failed:
        sink.process(group)
    assert failed.value.system == "milvus" and txn.open
    other = [Batch()]
    other[0].add(_item("z", 2, 0.4, partition=2))
    # another group reaching the sink meanwhile is not the open transaction's: its records are produced
    # in a transaction of their own (the open one aborted first), never committed as the carried group's
    sink.process(other)
    assert producer.calls.count("abort_transaction") == 1
    assert [k for _, k, _, _ in producer.visible] == [b"z"]
    sink.process(group)
    assert len(producer.visible) == 5 and sorted(client.rows) == ["a#0", "b#0", "c#0", "z#0"]


def test_each_transaction_times_its_milvus_and_output_sides():
    from prometheus_client import REGISTRY

    def observed(side: str) -> tuple[float, float]:
        get = REGISTRY.get_sample_value
        return (get("embedstream_sink_seconds_count", {"sink": side}) or 0.0,
                get("embedstream_sink_seconds_sum", {"sink": side}) or 0.0)

    before = {side: observed(side) for side in ("milvus", "output")}
    sink, _ = _sink(TransactionalProducer())
    sink.process(_group())
    for side in ("milvus", "output"):
        count, total = observed(side)
        assert count == before[side][0] + 1, side
        assert 0 <= total - before[side][1] < 60, side  # seconds of this transaction, not a clock reading


def _offsets_only() -> tuple[TransactionLedger, TransactionalProducer]:
    producer = TransactionalProducer()
    txn = Transactions(lambda: producer, timeout=0.2)
    txn.group_metadata = "gm"
    return TransactionLedger(_Consumer(), 0, txn, owned=_ALL), producer


class _All:
    def __contains__(self, _tp) -> bool:
        return True


_ALL = _All()


def test_offsets_never_go_back_below_what_a_transaction_committed():
    """The polling thread's offsets-only transaction committed 100; the sink's transaction of a group
    read earlier then commits 90: 100 stands, and a store of 95 is behind it, never committed (that
    would move the group back, and a restart would read 95..99 twice)."""
    ledger, producer = _offsets_only()
    ledger.committed({("docs", 0): 100})
    ledger.committed({("docs", 0): 90})
    ledger.store({("docs", 0): 95})
    assert ledger.flush(sync=True) and "commit_transaction" not in producer.calls


def test_a_partitions_first_record_is_committed_past():
    """A partition never committed before: its first record's next offset (1) goes through."""
    ledger, producer = _offsets_only()
    ledger.store({("docs", 3): 1})
    assert ledger.flush(sync=True) and producer.offsets == {("docs", 3): 1}


def test_a_forgotten_partition_starts_over_and_forgetting_an_unknown_one_is_harmless():
    """A partition revoked and given back after its topic was re-created reads offsets from 0 again:
    what this member committed before the revoke must not hold them back."""
    ledger, producer = _offsets_only()
    ledger.committed({("docs", 0): 100})
    ledger.store({("docs", 0): 120})
    ledger.revoked([("docs", 0), ("docs", 7)])  # 7: never seen here
    assert ledger.flush(sync=True) and "commit_transaction" not in producer.calls  # 120 was forgotten too
    ledger.store({("docs", 0): 5})
    assert ledger.flush(sync=True) and producer.offsets == {("docs", 0): 5}


def test_closing_gives_the_producer_the_configured_time_to_flush():
    waited = []
    producer = TransactionalProducer()
    producer.flush = lambda t=None: waited.append(t) or 0
    txn = Transactions(lambda: producer, timeout=0.2)
    ExactlyOnce(txn, 12.5).close()
    assert waited == [pytest.approx(12.5, abs=0.5)]  # the whole budget: nothing to abort took any


def test_the_carried_group_is_not_planned_again_after_a_milvus_outage():
    """The retry of a carried transaction writes Milvus from the first plan: its records are already
    in the transaction, and a second plan could judge versions differently than they were produced."""
    producer, client = TransactionalProducer(), RecordingMilvusClient(fail_upserts=1)
    sink, txn = _sink(producer, client=client)
    plans = []
    real_plan = sink.plan
    sink.plan = lambda group: plans.append(group) or real_plan(group)
    group = _group()
    with pytest.raises(TransientError, match="milvus"):
        sink.process(group)
    sink.process(group)
    assert len(plans) == 1 and len(producer.visible) == 4


def test_exactly_onces_membership_proof_commits_the_committed_offsets_in_a_transaction():
    ledger, producer = _offsets_only()
    offsets = [TopicPartition("docs", 0, 40), TopicPartition("docs", 1, 7)]
    ledger._recommit(offsets)
    assert producer.offsets == {("docs", 0): 40, ("docs", 1): 7} and producer.calls[-1] == "commit_transaction"


def test_the_polling_threads_offsets_wait_while_a_groups_transaction_is_open():
    """A drained partition's end (past a commit marker) is committed from the polling thread while the
    sink's transaction for another partition is open (its records produced, Milvus being written): the
    offsets wait for a later transaction. Aborting the sink's transaction from there instead lost its
    first records and sent its later ones out in the polling thread's transaction, ahead of the redo
    that sends them again."""
    producer = TransactionalProducer()
    client = RecordingMilvusClient()
    sink, txn = _sink(producer, client=client)
    ledger = TransactionLedger(_Consumer(), 0, txn, owned=_ALL)
    ledger.store({("docs", 3): 12})  # ahead of every transaction
    answers = []
    upsert = client.upsert

    def upsert_while_the_polling_thread_commits(*args, **kwargs):
        deadline = time.monotonic() + 5
        while not txn.open and time.monotonic() < deadline:  # the sink's transaction has begun
            time.sleep(0.005)
        answers.append(ledger.flush(sync=True))
        return upsert(*args, **kwargs)

    client.upsert = upsert_while_the_polling_thread_commits
    group = _group()
    sink.process(group)
    assert answers == [False]  # not committed yet: the group's transaction was open
    assert producer.calls.count("abort_transaction") == 0 and producer.calls.count("commit_transaction") == 1
    assert len(producer.visible) == 4 and producer.offsets == {("docs", 0): 2, ("docs", 1): 2}
    assert ledger.flush(sync=True) and producer.offsets[("docs", 3)] == 12  # the next tick commits them
    with pytest.raises(TransientError, match="open"):  # a membership proof cannot be had meanwhile
        txn.begin()
        try:
            ledger._recommit([TopicPartition("docs", 0, 2)])
        finally:
            txn.abort()


def test_closing_aborts_only_once_the_commit_under_way_has_finished():
    producer = TransactionalProducer()
    txn = Transactions(lambda: producer, timeout=0.2)
    txn.group_metadata = "gm"
    txn.begin()
    order = []
    held = threading.Event()

    def sink_commit():  # the sink's commit under way, on its own thread
        with txn.lock:
            held.set()
            time.sleep(0.2)
            txn.commit([TopicPartition("docs", 0, 3)])
            order.append("committed")

    threading.Thread(target=sink_commit).start()
    held.wait(5)
    txn.close(5)
    assert order == ["committed"] and "abort_transaction" not in producer.calls  # nothing left to abort
    assert producer.offsets == {("docs", 0): 3}


def test_closing_does_not_wait_past_its_timeout_for_a_commit_that_hangs():
    producer = TransactionalProducer()
    txn = Transactions(lambda: producer, timeout=0.2)
    txn.begin()
    held = threading.Event()
    release = threading.Event()

    def hung_commit():
        with txn.lock:
            held.set()
            release.wait(5)

    threading.Thread(target=hung_commit, daemon=True).start()
    held.wait(5)
    t0 = time.monotonic()
    txn.close(0.3)
    release.set()
    assert time.monotonic() - t0 < 2 and "abort_transaction" not in producer.calls


def test_a_milvus_outage_at_exactly_the_time_the_transaction_may_stay_open_aborts_it():
    producer, client = TransactionalProducer(), RecordingMilvusClient(fail_upserts=1)
    sink, txn = _sink(producer, client=client)
    txn.keep_open_s = 5.0
    txn.open_for = lambda: 5.0  # open exactly as long as it may be: not a second longer
    with pytest.raises(TransientError):
        sink.process(_group())
    assert not txn.open and producer.calls[-1] == "abort_transaction"


def test_a_membership_proof_while_a_groups_transaction_is_open_is_a_kafka_outage_to_retry():
    class Open:
        def commit_offsets(self, offsets):
            return False  # a group's transaction holds the producer

    with pytest.raises(TransientError) as raised:
        TransactionLedger(_Consumer(), 1.0, Open())._recommit([TopicPartition("docs", 0, 5)])  # type: ignore[arg-type]
    assert raised.value.system == "kafka" and "membership waits for it to end" in str(raised.value)
