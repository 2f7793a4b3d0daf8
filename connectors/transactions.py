"""Kafka transactions for ``EMBEDSTREAM_DELIVERY=exactly-once``: one transactional producer per worker.

A transaction holds a group of batches' output and dead-letter records *and* their input offsets
(``send_offsets_to_transaction`` with the consumer's group metadata), so a ``read_committed``
reader of the output topic sees a batch's records exactly when its offsets are committed: never
twice, never without them.

Every error is handled as librdkafka classifies it (``KafkaError.retriable`` /
``txn_requires_abort`` / ``fatal``):

* **retriable** — the same call again, until ``timeout`` runs out; a commit that still has not
  finished is *pending*: the next ``commit`` finishes it (never a new transaction meanwhile: the
  pending one may yet commit);
* **abortable** — the transaction is aborted and :class:`TransientError` raised: the caller redoes
  the group in a new transaction (its records went nowhere);
* **fatal or fenced** — :class:`TransactionsFailed`: another worker with the same
  ``transactional.id`` took over, or the producer broke; this worker must stop and never write again.

The calls are serialised by ``lock`` (re-entrant; every call that moves the transaction's state
takes it): the sink holds it from the ownership check to the end of the commit, and a revoke takes
it once after publishing the smaller ownership, so no transaction commits offsets of a partition this
member gave away. The producer has one transaction at a time, and an open one is its opener's: the
polling thread's offsets-only transaction waits while the sink's is open (never aborts it: the sink
would go on producing into whatever transaction came next), and a stop aborts only after a commit
under way has ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from connectors.kafka import access_refused
from schemas.errors import TransientError

log = logging.getLogger(__name__)


class TransactionsFailed(Exception):
    """The transactional producer is fenced or failed fatally: stop the worker (exit code 4)."""


def transactional_id(group_id: str, member: str) -> str:
    """The ``transactional.id`` of a worker: the group and the member (the static member id, i.e. the
    pod name under the Helm chart). The same member after a restart fences its predecessor and ends
    its open transaction."""
    return f"embedstream-{group_id}-{member}"


def _error(exc: KafkaException) -> KafkaError:
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        raise exc
    return err


class Transactions:
    """The worker's transactional producer and its state. ``producer`` is what records are produced
    with (between ``begin`` and ``commit``)."""

    def __init__(self, new_producer: Callable[[], Producer], timeout: float,
                 sleep: Callable[[float], None] = time.sleep, keep_open_s: float = 30.0) -> None:
        self._new_producer = new_producer
        #: How long a transaction may stay open while Milvus is retried (half the broker's
        #: ``transaction.timeout.ms``, after which the broker would abort it).
        self.keep_open_s = keep_open_s
        self.producer = new_producer()
        self.timeout = timeout
        self.lock = threading.RLock()
        #: The consumer's group metadata (member id, generation) as of its last rebalance, set by the
        #: polling thread: asked for from the sink's thread, librdkafka's ``consumer_group_metadata``
        #: blocked for good once the consumer had paused its partitions (measured, librdkafka 2.16).
        self.group_metadata: object | None = None
        self._sleep = sleep
        #: A commit that timed out and may still finish: ``finish_pending`` completes it.
        self.pending = False
        #: The open (or the last) transaction's number: ``begin`` counts them.
        self.number = 0
        #: How the last few transactions ended, by number: True committed, False aborted.
        self._ended: dict[int, bool] = {}
        self._open = False
        self._ready = False
        self._began = 0.0
        #: The group metadata the open transaction began under: its offsets are sent with it, so a
        #: rebalance during the transaction fails it (Kafka's coordinator refuses an old generation).
        self._began_metadata: object | None = None
        self._init()

    def _init(self) -> None:
        self._retrying(self.producer.init_transactions, "initialising transactions")
        self._ready = True

    def _retrying(self, call: Callable[[float], object], what: str) -> None:
        """``call(timeout)`` until it succeeds; retriable errors again until ``timeout`` has passed
        (then :class:`TransientError`), fatal ones raise :class:`TransactionsFailed`, abortable ones
        the ``KafkaException`` for the caller to abort."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                call(max(1.0, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                err = _error(exc)
                denied = access_refused(err, f"{what} (Write on its transactional.id)")
                if denied is not None:
                    raise denied from None
                if err.fatal() or (not err.retriable() and not err.txn_requires_abort()):
                    raise TransactionsFailed(f"{what}: {err.str()} ({err.name()}): the transactional producer "
                                             "cannot go on (fenced by a newer worker with the same "
                                             "transactional.id, or broken); stopping") from None
                if err.txn_requires_abort():
                    raise
                if time.monotonic() >= deadline:
                    raise TransientError("kafka", f"{what}: {err.str()}") from None
                log.warning("%s: %s; retrying", what, err.str())
                self._sleep(0.5)

    def begin(self) -> None:
        """Begin a transaction (aborting this thread's own one left open)."""
        with self.lock:
            if self._open:
                self.abort()
            if not self._ready:
                self._init()
            self.producer.begin_transaction()
            self.number += 1
            self._open = True
            self._began = time.monotonic()
            self._began_metadata = self.group_metadata

    @property
    def open(self) -> bool:
        return self._open

    def open_for(self) -> float:
        """Seconds since the open transaction began."""
        return time.monotonic() - self._began

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Add ``offsets`` (next offset per input partition) and commit. Raises :class:`TransientError`
        after aborting (redo the group) or when the commit is still pending (``finish_pending``)."""
        try:
            if offsets:
                if self._began_metadata is None:
                    raise TransientError("kafka", "no group metadata yet (no rebalance has assigned partitions)")
                if self.group_metadata != self._began_metadata:  # Kafka refuses the old one; any broker
                    raise TransientError("kafka", "the group rebalanced during the transaction")
                self._retrying(lambda t: self.producer.send_offsets_to_transaction(
                    offsets, self._began_metadata, t), "sending the offsets")
        except KafkaException as exc:
            self._abort_for(_error(exc))
        except TransientError:
            self.abort()
            raise
        self.finish_pending()

    def finish_pending(self) -> None:
        """Commit the open transaction (again, after a timeout): it may have committed meanwhile."""
        with self.lock:
            self.pending = True
            try:
                self._retrying(self.producer.commit_transaction, "committing the transaction")
            except KafkaException as exc:
                self.pending = False
                self._abort_for(_error(exc))
            except TransientError as exc:
                raise TransientError("kafka", f"{str(exc).removeprefix('kafka: ')}; the commit is retried") from None
            self.pending = self._open = False
            self._end(True)

    def ended(self, number: int) -> bool | None:
        """Whether transaction ``number`` committed (True) or was aborted (False); None while it is
        open, or its commit pending (or when it is too old to be remembered)."""
        return self._ended.get(number)

    def _end(self, committed: bool) -> None:
        self._ended[self.number] = committed
        if len(self._ended) > 8:
            del self._ended[min(self._ended)]

    def _abort_for(self, err: KafkaError) -> None:
        self.abort()
        raise TransientError("kafka", f"transaction aborted ({err.str()}): its batches are redone")

    def abort(self) -> None:
        """Abort the open transaction (its records are never seen by read_committed readers)."""
        with self.lock:
            if not self._open:
                return
            try:
                self._retrying(self.producer.abort_transaction, "aborting the transaction")
            except KafkaException as exc:  # an abort that itself needs an abort: the producer is stuck
                raise TransactionsFailed(f"aborting the transaction: {_error(exc).str()}") from None
            except TransientError:
                # Records that timed out make librdkafka bump the producer's epoch before the abort; a
                # broker that refuses the bump (Tansu: "unknown broker error", for as long as it is
                # asked) leaves the abort hanging. A new producer with the same transactional.id ends
                # the open transaction at the broker (Kafka aborts it) and starts from a clean state.
                self._replace()
            # An aborted transaction has no commit left to finish (librdkafka refuses one in its Ready state).
            self._open = self.pending = False
            self._end(False)

    def _replace(self) -> None:
        log.warning("the transaction could not be aborted within %.0fs: replacing the transactional producer "
                    "(the broker ends the open transaction when the new one initialises)", self.timeout)
        old, self.producer = self.producer, self._new_producer()
        self._open = self._ready = False
        old.purge()
        old.flush(0)
        self._init()

    def commit_offsets(self, offsets: list[TopicPartition]) -> bool:
        """A transaction of offsets alone (a drained partition's end past a commit marker, a membership
        proof). False, committing nothing, while another transaction is open: a group's, between its
        begin and its commit."""
        with self.lock:
            if self.pending:
                self.finish_pending()
            if self._open:
                return False
            self.begin()
            self.commit(offsets)
            return True

    def close(self, timeout: float) -> None:
        """Abort what is open and close the producer, within ``timeout`` seconds: a commit still under
        way past them is left to the broker (it aborts the transaction at its timeout, or when this
        ``transactional.id`` initialises again)."""
        deadline = time.monotonic() + timeout
        if self.lock.acquire(timeout=timeout):
            try:
                self.abort()
            except (TransactionsFailed, TransientError) as exc:
                log.warning("closing the transactional producer: %s", exc)
            finally:
                self.lock.release()
        else:
            log.warning("closing the transactional producer: a commit still under way after %.0fs; its "
                        "transaction is left to the broker", timeout)
        self.producer.flush(max(0.0, deadline - time.monotonic()))
