"""Write a group of finished batches: Milvus, the output and dead-letter topics, and the cache.

A document is written as its chunks (``worker.steps.model.chunk``): a Milvus row and an output record per
chunk, and its chunks of an older version that the new one no longer has are deleted. A group is
written with one Milvus upsert and one delete per collection (the last operation per id across the
group wins). The cache is filled while Milvus writes, best-effort; it never fails a batch.

A group is written one way, whichever the delivery (``worker.core.delivery`` tells that order once:
the fence, the version guard, Milvus and the topics, the offsets); the delivery chosen at assembly
hands each group an attempt that says what its mode does at each step (a transaction begun and
committed, or records that are durable once acknowledged). Nothing older is written over something
newer: ``worker.core.fence`` and ``worker.steps.writing.versions`` say why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

from confluent_kafka import Producer, TopicPartition

from connectors.kafka import DeliveryBatch, OutputRefused
from schemas.errors import TransientError
from worker.core.delivery import Delivery, Planned, written_offsets
from worker.core.fence import Fence
from worker.core.records import Batch, Delete, Fresh, Item, Written
from worker.process import metrics
from worker.steps.writing.fit import TopicLimits, dead_letter_record
from worker.steps.writing.ordering import ShareOrder
from worker.steps.writing.output import OutputFormat
from worker.steps.writing.planning import Planner
from worker.steps.writing.refusals import Refusals, isolate
from worker.steps.writing.targets import ModelTarget, Plan, write_collection
from worker.steps.writing.versions import VersionGuard

log = logging.getLogger(__name__)


#: Dead letters a backfill writes though it writes none of intake's (``dead_letters=False``): the reasons
#: its own model, collection or output find, which the live worker never met for the record. Skipped,
#: such a document would be missing from the new collection after the switch, silently.
OWN_DEAD_LETTERS = frozenset({"too_many_chunks", "milvus_rejected", "output_rejected", "output_too_large"})
#: The output topic of a sink that publishes no output records, only Milvus' rows (and dead letters):
#: a backfill's by default (EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC unset), so that the output topic's
#: readers never get the new model's vectors beside the live model's before the switch.
NO_OUTPUT = ""


class SinkStep:
    """``process(group)`` makes the batches durable; raises :class:`TransientError` to be retried.

    ``targets`` holds each model's collection and cache by model name (``Item.model``; one entry
    named "" without a model set). An item goes to its model's collection; a tombstone deletes its
    id from every collection (a document may be embedded by several models, each collection holding
    the newest record of the id that asked for its model)."""

    def __init__(self, targets: dict[str, ModelTarget], delivery: Delivery, *, fence: Fence,
                 guard: VersionGuard, output_topic: str, dlq_topic: str, delivery_timeout_s: float,
                 limits: TopicLimits | None = None, output: OutputFormat | None = None,
                 dead_lettered: Callable[[str, str], None] = lambda reason, message: None,
                 dead_letters: bool = True, order: ShareOrder | None = None) -> None:
        self.targets = targets
        #: Whether dead letters are written to the DLQ topic (a migration's backfill re-reads records
        #: the live worker dead-lettered already: it skips them, writing them nowhere).
        self.dead_letters = dead_letters
        #: A tombstone's ``embedstream.model`` header: the model when there is one, else every one.
        self._delete_header = b",".join(t.header for t in targets.values())
        #: How the group becomes durable (``worker.core.delivery``): at-least-once or exactly-once.
        self.delivery = delivery
        self.fence = fence
        #: How output values are encoded (EMBEDSTREAM_OUTPUT_FORMAT).
        self.output = output or OutputFormat()
        self.output_topic = output_topic
        #: False for a sink without an output topic (NO_OUTPUT): its documents and tombstones reach Milvus only.
        self.publishes = output_topic != NO_OUTPUT
        self.dlq_topic = dlq_topic
        self.delivery_timeout_s = delivery_timeout_s
        #: The largest record each topic takes: dead letters are cut to fit, output records over it are
        #: dead-lettered (``worker.steps.writing.fit``).
        self.limits = limits or TopicLimits()
        #: Per model, the headers of an output record by whether it came from a cache: the model's and
        #: the format's (a document's forwarded input headers follow them).
        self._headers = {name: {cached: [*hs, *self.output.headers] for cached, hs in t.headers.items()}
                         for name, t in targets.items()}
        #: What a group writes (``worker.steps.writing.planning``); ``dead_lettered`` is told of each
        #: dead letter it makes (``DlqLimit.record_late``: the breaker counts it).
        self.planner = Planner(targets, fence, guard, self.output, self.limits, self._headers, dead_lettered,
                               order)
        #: A share member's claims on the versions it writes (None in a consumer group).
        self.order = order
        self._milvus = ThreadPoolExecutor(1, thread_name_prefix="milvus-write")
        #: What becomes of records Milvus or the output topic refuse for good (``refusals``).
        self.refusals = Refusals(dead_lettered)
        #: The plan of the group being attempted, kept across its retries: an attempt that finds the
        #: group's commit went through after all hands on what that plan left unwritten (a commit is
        #: pending only after this sink's own attempt at the group, so the plan is always there).
        self._planned: Planned | None = None

    def close(self) -> None:
        """Release the Milvus writer thread and the producer (call once the step is no longer used)."""
        self._milvus.shutdown(wait=True)
        self.delivery.close()

    def process(self, group: list[Batch], fresh: list[Fresh | None] | None = None) -> list[Written]:
        """Make ``group`` durable, in the order of ``worker.core.delivery``, through the attempt its
        delivery hands out; ``fresh``: per batch, the vectors the embed stage made for it (the caches
        are filled with them; None: none). Returns what was written of each batch, for the polling
        thread; raises :class:`TransientError` to be retried."""
        attempt = self.delivery.attempt(group)
        if attempt.finished:  # an earlier attempt at this group committed after all: as it planned it
            planned = self._planned
            assert planned is not None and planned.group is group and attempt.committed is not None
            return planned.written(attempt.committed)
        planned = self._planned = attempt.carried or self.plan(group)
        write = self._milvus.submit(self._write_milvus, planned)
        t0 = time.perf_counter()
        try:
            producer = attempt.begin()
            if producer is not None:
                try:
                    attempt.sent(self.produce(planned, producer, fresh))
                except OutputRefused as refusal:
                    wait([write])  # the other documents' rows are written: the redo writes them alike
                    raise self.refusals.output(group, refusal) from None
                if attempt.durable_when_sent:
                    metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
            try:
                seconds, refused = write.result()  # raises Milvus' outage
            except TransientError:
                attempt.milvus_failed(planned)
                raise
            metrics.SINK_SECONDS.labels("milvus").observe(seconds)
            if refused:
                raise self.refusals.milvus(group, refused)
            with attempt.holding():
                committed = attempt.commit(self.owned_offsets(planned))
            if not attempt.durable_when_sent:
                metrics.SINK_SECONDS.labels("output").observe(time.perf_counter() - t0)
        except BaseException as exc:
            wait([write])  # never leave a write running behind a retry: one writer at a time
            failure = attempt.abort(exc)
            if failure is exc:
                raise
            raise failure from None
        for plan in planned.plans:
            metrics.MODEL_DOCUMENTS.labels(plan.target.model_id).inc(len(plan.upserts))
        self._planned = None
        return planned.written(committed)

    def plan(self, group: list[Batch]) -> Planned:
        """The group's writes (``Planner.plan``)."""
        return self.planner.plan(group)

    def _write_milvus(self, planned: Planned) -> tuple[float, dict[int, str]]:
        """Each model's collection, in turn (``targets.write_collection``); in a share group, each
        then settled with the other members' claims (``ordering.ShareOrder.settle``). Returns the
        seconds, and the entries whose documents Milvus refused for good (by ``id()``, with Milvus'
        answer): found by halves (``worker.steps.writing.refusals``), every other document written."""
        t0 = time.perf_counter()
        refused: dict[int, str] = {}
        source = self.planner.guard.source

        def write(plan: Plan) -> None:
            write_collection(plan, source, planned.now)

        for plan in planned.plans:
            def write_some(docs: list[str], plan: Plan = plan) -> None:
                write(plan.only(docs))

            found = isolate(plan.documents, write_some)
            refused.update({id(plan.entry(d)): message for d, message in found.items()})
            if self.order is not None:
                self.order.settle(plan, set(plan.documents) - set(found), write, lambda: self._still_locked(planned))
        return time.perf_counter() - t0, refused

    def _still_locked(self, planned: Planned) -> bool:
        """No batch of ``planned`` has lost a partition since it was planned (a share member's: its
        records' lock has not run out)."""
        return not any(self.fence.stale(batch) - fenced for batch, fenced in zip(planned.group, planned.fenced))

    def produce(self, planned: Planned, producer: Producer, fresh: list[Fresh | None] | None = None) -> DeliveryBatch:
        """Hand every output and dead-letter record of the group to ``producer`` (not yet confirmed),
        then fill the caches; the lease is checked before each document. A document's chunks go out
        in order, under its id."""
        now = planned.now
        self.output.ready()  # before any record: an outage of the registry then repeats none
        delivery = DeliveryBatch(producer, self.delivery_timeout_s)
        for e in planned.entries:
            self.fence.check()
            alone = self.refusals.alone(e)
            if alone:
                delivery.settle()
            if isinstance(e, (Item, Delete)) and not self.publishes:
                pass
            elif isinstance(e, Item):
                key, target, by_cached = e.id.encode(), self.targets[e.model], self._headers[e.model]
                values = self.output.values(e, target.model_id, target.dim, now)
                for ch, encoded in zip(e.chunks, values):
                    hs = by_cached[ch.cached]
                    delivery.produce(self.output_topic, key, encoded, [*hs, *e.headers] if e.headers else hs,
                                     owner=e)
            elif isinstance(e, Delete):
                delivery.produce(self.output_topic, e.id.encode(), None,
                                 [("embedstream.model", self._delete_header), *_source_headers(e.source),
                                  *(e.headers or ())], owner=e)
            elif self.dead_letters or e.reason in OWN_DEAD_LETTERS:
                dlq_key, value, headers = dead_letter_record(e, self.limits.dlq)
                delivery.produce(self.dlq_topic, dlq_key, value, headers, what=f"the dead letter ({e.reason}) of "
                                 f"{e.source.topic} partition {e.source.partition} offset {e.source.offset}")
            if alone:
                delivery.settle()
        if fresh:
            self._fill_caches(fresh, {p.target.model_id: p.erased for p in planned.plans})
        return delivery

    def _fill_caches(self, fresh: list[Fresh | None], erased: dict[str, set[str]]) -> None:
        """Each model's fresh vectors (the embed stage's, per batch) into its cache, but for the texts
        of a document the group deletes (``erased``, by model id). A vector depends only on the text
        and the model, so the cache may be filled before the batches are durable: it is, while Milvus
        writes."""
        for name, target in self.targets.items():
            skip = erased.get(target.model_id, set())
            made = {h: v for by_model in fresh if by_model for h, v in by_model.get(name, {}).items() if h not in skip}
            if target.cache is not None and made:
                target.cache.set_many(made)

    def owned_offsets(self, planned: Planned) -> list[TopicPartition]:
        """The group's ``written_offsets`` to commit; raises :class:`TransientError` when one of their
        partitions left this member during the transaction, or left and came back (the redo leaves
        its records to its new owner, or to this member's new reading of them)."""
        offsets = written_offsets(planned.group, planned.fenced)
        gone = sorted({p for batch, fenced in zip(planned.group, planned.fenced)
                       for _, p in self.fence.stale(batch) - fenced})
        if gone:
            raise TransientError("fence", f"partitions {gone} were revoked or lost during the transaction: "
                                 "redoing the group without them")
        return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]


def _source_headers(source) -> list[tuple[str, bytes]]:
    """Which input record a tombstone came from (an embedding says it in its fields): a reader of a
    share group's output, where a key's versions may arrive out of order, keeps the highest."""
    return [("embedstream.source.partition", b"%d" % source.partition), ("embedstream.source.offset",
                                                                          b"%d" % source.offset)]
