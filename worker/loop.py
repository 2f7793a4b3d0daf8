"""The polling loop: consume → validate → batch → pipeline → store offsets → commit.

Owns the consumer and everything that must happen on its thread: rebalance callbacks, pausing
and resuming partitions for back-pressure, storing the offsets of finished batches and committing
them, the idle check of ``--stop-when-idle``, and the graceful stop on SIGTERM/SIGINT.

Commit order (the delivery contract): a batch's offsets are stored only after the pipeline's sink
step confirmed it (Milvus and the broker acknowledged); stored offsets are committed at most every
``commit_interval`` seconds, and synchronously on revoke and at shutdown. Lost partitions commit
nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from worker import metrics
from worker.embedding.base import Embedder
from worker.pipeline import Pipeline
from worker.records import Batch, DeadLetter, Delete, Item, TopicPartitionKey
from worker.steps.batcher import Batcher
from worker.steps.dlq_limit import DlqLimit, DlqLimitExceeded
from worker.steps.validate import Validator

log = logging.getLogger(__name__)

CONSUME_CHUNK = 500


@dataclass
class RunStats:
    """Counters the loop keeps for progress displays and the run summary."""

    embedded: int = 0
    deleted: int = 0
    dead_lettered: int = 0
    cached: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    #: When the first record arrived and when the last batch finished (monotonic), for rates.
    first_record_at: float | None = None
    last_done_at: float | None = None
    dlq_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.embedded + self.deleted + self.dead_lettered

    @property
    def busy_seconds(self) -> float:
        """First record consumed → last batch committed-ready (excludes group join and idle time)."""
        if self.first_record_at is None or self.last_done_at is None:
            return 0.0
        return self.last_done_at - self.first_record_at

    @property
    def docs_per_second(self) -> float:
        return self.done / self.busy_seconds if self.busy_seconds > 0 else 0.0


class Worker:
    """One consumer-group member. ``run()`` blocks until stopped, idle (if asked), or a bug."""

    def __init__(self, consumer: Consumer, topic: str, embedder: Embedder, pipeline: Pipeline, *,
                 max_batch_size: int, max_batch_tokens: int, max_batch_wait_ms: int, max_inflight: int,
                 max_text_bytes: int, max_batch_bytes: int = 16 * 1024 * 1024, shutdown_grace: float = 30.0,
                 commit_interval: float = 1.0,
                 join_grace: float = 30.0, health: metrics.Health | None = None,
                 dlq_limit: DlqLimit | None = None, pause_after: float = 1.0,
                 on_progress: Callable[[RunStats], None] | None = None) -> None:
        self.consumer = consumer
        self.topic = topic
        self.embedder = embedder
        self.pipeline = pipeline
        self.batcher = Batcher(max_batch_size, max_batch_tokens, max_batch_wait_ms / 1000, max_bytes=max_batch_bytes)
        self.validator = Validator(max_text_bytes, embedder.accepts)
        self.max_inflight = max_inflight
        self.shutdown_grace = shutdown_grace
        self.commit_interval = commit_interval
        self.join_grace = join_grace
        self.health = health or metrics.Health()
        self.dlq_limit = dlq_limit or DlqLimit(1000, 0.9, 1000)
        self.pauses = 0
        #: Seconds the pipeline may stay full (not consuming, partitions still fetching into
        #: librdkafka's bounded queue) before the assignment is paused. Well under max.poll.interval.ms
        #: (the runner uses min(5 s, a third of it)).
        self.pause_after = pause_after
        self._full_since: float | None = None
        self.on_progress = on_progress
        self.stats = RunStats()
        self.assigned: set[TopicPartitionKey] = set()
        self.eof: dict[TopicPartitionKey, bool] = {}
        self.paused = False
        self._stop = False
        self._signals = 0
        self._dirty = False
        self._last_commit = time.monotonic()
        self._unassigned_since: float | None = time.monotonic()
        self._reapply_pause = False

    # -- signals -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting at once; unfinished batches are not committed")
            os._exit(128 + signum)
        log.info("signal %s: stop fetching, finish in-flight batches, commit, exit", signum)
        self._stop = True

    # -- rebalance callbacks (run inside consume(), on this thread) ----------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self.assigned.add((p.topic, p.partition))
            self.eof[(p.topic, p.partition)] = False
        if self.paused and partitions:
            consumer.pause(partitions)
        # librdkafka keeps the pause state of a partition object across revoke/lost and reassignment:
        # a partition paused when it was lost comes back paused. Re-apply our state to the whole
        # assignment once the library has assigned it (after this callback returns).
        self._reapply_pause = True
        self.health.assigned = len(self.assigned)
        # An assignment (even an empty one) ends any wait for a rejoin.
        self._unassigned_since = None if self.assigned else (self._unassigned_since or time.monotonic())
        log.info("assigned %s", sorted(p.partition for p in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        dropped = self.batcher.drop(tps)
        deadline = time.monotonic() + min(self.shutdown_grace, 20.0)
        while self.pipeline.inflight and not self.pipeline.aborted and time.monotonic() < deadline:
            self._collect(timeout=0.1)
        self._commit(sync=True)
        self.assigned -= tps
        for tp in tps:
            self.eof.pop(tp, None)
        self.health.assigned = len(self.assigned)
        if not self.assigned:
            self._unassigned_since = time.monotonic()
        log.info("revoked %s (dropped %d uncommitted records still batching)", sorted(p for _, p in tps), dropped)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        self.batcher.drop(tps)
        self.assigned -= tps
        for tp in tps:
            self.eof.pop(tp, None)
        self.health.assigned = len(self.assigned)
        # Lost partitions come back through a rejoin: never take their absence for the end of input.
        self._unassigned_since = None
        log.warning("lost %s: committing nothing for them", sorted(p for _, p in tps))

    # -- the loop ----------------------------------------------------------------------------
    def run(self, stop_when_idle: float | None = None) -> RunStats:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        idle_since: float | None = None
        try:
            while not self._stop:
                self.health.tick()
                # A full pipeline holds off consuming for a while before it pauses: pausing drops
                # the records librdkafka has prefetched, and after a resume the first record came
                # back only 0.7-0.8 s later (measured on Tansu, whatever the fetch settings), time
                # the pipeline sat idle whenever it had drained meanwhile. Holding serves no
                # callbacks, so a rebalance waits up to ``pause_after``.
                holding = self._full() and not self.paused
                msgs = [] if holding else self._consume()
                self._ingest(msgs)
                # A batch past its deadline closes only when the model is free: while the model is
                # busy it could not start earlier anyway, and it keeps growing instead of queueing
                # as many small batches (continuous batching).
                if self.pipeline.embed_backlog == 0:
                    for batch in self.batcher.poll():
                        self.pipeline.submit(batch)
                self._collect(0.02 if holding else 0.0)
                self._backpressure()
                if self.commit_interval == 0:
                    self._commit(sync=True)
                elif time.monotonic() - self._last_commit >= self.commit_interval:
                    self._commit(sync=False)
                if stop_when_idle is not None:
                    recent_error = time.monotonic() - self.health.last_kafka_error < stop_when_idle
                    if self._idle() and not recent_error:
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since >= stop_when_idle:
                            log.info("idle for %.1fs: stopping", stop_when_idle)
                            break
                    else:
                        idle_since = None
            self._drain()
        except DlqLimitExceeded:
            # Finish and commit the batches already in flight (all before the bad run), then halt.
            self._finish_inflight()
            self.pipeline.abort()
            raise
        except BaseException:
            self.pipeline.abort()
            raise
        finally:
            self.consumer.close()
        return self.stats

    def _consume(self) -> list:
        """What the consumer holds now, else wait briefly for the first record.

        ``consume(n, timeout)`` blocks until it has ``n`` records *or* the timeout passes, so asking
        for a chunk with a timeout stalls the loop whenever fewer records are at hand (right after a
        resume, or at a low rate). Take what is there without waiting; only when nothing is, wait for
        one record (which returns as soon as it arrives)."""
        msgs = self.consumer.consume(CONSUME_CHUNK, 0)
        if msgs:
            return msgs
        busy = len(self.batcher) or self.pipeline.inflight
        return self.consumer.consume(1, 0.02 if busy else 0.2)

    def _ingest(self, msgs: list) -> None:
        entries = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.eof[(m.topic(), m.partition())] = True
                    continue
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer: %s", err)
                continue
            self.eof[(m.topic(), m.partition())] = False
            entries.append(self.validator.validate(m))
        if entries and self.stats.first_record_at is None:
            self.stats.first_record_at = time.monotonic()
        items = [e for e in entries if isinstance(e, Item)]
        if items:
            # An estimate, not a count: tokenizing here cost 0.12 ms a docstring on this thread (paid
            # again by the model's own tokenizing, and for every cache hit).
            for it, n in zip(items, self.embedder.estimate_tokens([it.text for it in items])):
                it.tokens = n
        for e in entries:
            # The breaker runs before the entry joins a batch: when it trips, this record and
            # everything after it stay uncommitted.
            if isinstance(e, DeadLetter):
                self.dlq_limit.record(e.reason, e.message)
            else:
                self.dlq_limit.record(None)
            for batch in self.batcher.add(e):
                self.pipeline.submit(batch)

    def _collect(self, timeout: float = 0.0) -> None:
        """Account for finished batches and store their offsets (only for partitions still ours)."""
        for batch in self.pipeline.completed(timeout):
            self._account(batch)
            offsets = [TopicPartition(t, p, o) for (t, p), o in batch.offsets.items() if (t, p) in self.assigned]
            if offsets:
                self.consumer.store_offsets(offsets=offsets)
                self._dirty = True

    def _account(self, batch: Batch) -> None:
        s = self.stats
        now_ms = time.time() * 1000
        s.batches += 1
        s.last_done_at = time.monotonic()
        items = deletes = 0
        for e in batch.entries:
            if isinstance(e, Item):
                items += 1
                s.cached += e.cached
                if e.source.timestamp_ms:
                    metrics.END_TO_END_SECONDS.observe(max(0.0, (now_ms - e.source.timestamp_ms) / 1000))
            elif isinstance(e, Delete):
                deletes += 1
            elif isinstance(e, DeadLetter):
                s.dlq_reasons[e.reason] = s.dlq_reasons.get(e.reason, 0) + 1
                metrics.DLQ_MESSAGES.labels(e.reason).inc()
        s.embedded += items
        s.deleted += deletes
        s.dead_lettered += len(batch) - items - deletes
        metrics.MESSAGES.labels("embedded").inc(items)
        metrics.MESSAGES.labels("deleted").inc(deletes)
        metrics.MESSAGES.labels("dead_lettered").inc(len(batch) - items - deletes)
        if self.on_progress:
            self.on_progress(s)

    def _full(self) -> bool:
        """As many batches in flight as allowed: consume nothing more for now."""
        return self.pipeline.inflight >= self.max_inflight

    def _backpressure(self) -> None:
        """Pause the assignment once the pipeline has been full for ``pause_after`` s; resume when a
        batch slot frees. (Until then the loop only stops consuming; see ``run``.)"""
        now = time.monotonic()
        if self._full():
            self._full_since = self._full_since or now
        else:
            self._full_since = None
        pause = self._full_since is not None and now - self._full_since >= self.pause_after
        if pause == self.paused and not self._reapply_pause:
            return
        self._reapply_pause = False
        parts = self.consumer.assignment()
        if parts:
            (self.consumer.pause if pause else self.consumer.resume)(parts)
        self.pauses += pause and not self.paused
        self.paused = pause
        metrics.PAUSED_PARTITIONS.set(len(parts) if pause else 0)

    def _commit(self, sync: bool, attempts: int = 1) -> bool:
        """Commit the stored offsets; True when nothing is left uncommitted. A failed commit is retried
        by the next call (the stored offsets stay), or here up to ``attempts`` times (shutdown)."""
        self._last_commit = time.monotonic()
        for attempt in range(attempts):
            if not self._dirty:
                return True
            try:
                self.consumer.commit(asynchronous=not sync)
                self._dirty = False
                return True
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                    self._dirty = False
                    return True
                level = logging.ERROR if attempt == attempts - 1 and attempts > 1 else logging.WARNING
                log.log(level, "commit failed (%s)%s", exc,
                        "; retrying" if attempt < attempts - 1 else "; the next commit retries it")
                if attempt < attempts - 1:
                    time.sleep(0.5)
        return False

    def _idle(self) -> bool:
        """Nothing buffered or in flight, and every assigned partition at its end. A worker without
        partitions (more workers than partitions, or just after losing them) counts as idle only once
        it has had none for ``join_grace`` seconds, long enough for a rejoin."""
        if len(self.batcher) or self.pipeline.inflight:
            return False
        if not self.assigned:
            return self._unassigned_since is not None and time.monotonic() - self._unassigned_since > self.join_grace
        return all(self.eof.get(tp, False) for tp in self.assigned)

    def _finish_inflight(self) -> None:
        deadline = time.monotonic() + self.shutdown_grace
        while self.pipeline.inflight and time.monotonic() < deadline:
            self._collect(timeout=0.1)
        self._commit(sync=True, attempts=5)

    def _drain(self) -> None:
        """Shutdown: close the open batch, finish in-flight batches within the grace, commit."""
        if self.assigned:
            self.consumer.pause(self.consumer.assignment())
        for batch in self.batcher.flush():
            self.pipeline.submit(batch)
        deadline = time.monotonic() + self.shutdown_grace
        while self.pipeline.inflight and time.monotonic() < deadline:
            self._collect(timeout=0.1)
        if self.pipeline.inflight:
            log.warning("%d batches unfinished after %.0fs grace: not committing them", self.pipeline.inflight,
                        self.shutdown_grace)
            self.pipeline.abort()
        else:
            self.pipeline.close()
        if self._commit(sync=True, attempts=10):
            committed = self.consumer.committed(self.consumer.assignment(), timeout=10) if self.assigned else []
            log.info("shutdown: committed %s", {tp.partition: tp.offset for tp in committed})
