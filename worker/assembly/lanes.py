"""A worker with a backfill lane beside its live one (``EMBEDSTREAM_BACKFILL_MODEL``).

The backfill lane is ``embedstream migrate``'s backfill, run inside the live worker's process instead
of a Job of its own: a second member, in the backfill group (``<group>.migrate.<new collection>``,
``worker.assembly.naming.backfill_group``, so ``migrate --lane`` watches its lag and a Job would
resume where it stopped), reads the input topic from its start into the new model's collection.

- **Live first.** Every stage of both lanes passes through one :class:`~worker.core.lanes.ModelGate`:
  a live group takes the model as soon as it is free; the backfill takes a turn (a batch into the
  model, a group through its prepare or its sink) only when no live batch is on its way to the model
  (none in the live lane's prepare or embed stage). Only its model batches hold the model.
- **A bounded share.** The backfill member holds ``EMBEDSTREAM_BACKFILL_SHARE`` of the live lane's
  batches in flight (``EMBEDSTREAM_MAX_INFLIGHT_BATCHES``), at least one, each at most that share of
  a live batch's size (``EMBEDSTREAM_MAX_BATCH_SIZE`` and ``_TOKENS``): its memory stays a fraction of
  the live lane's.
- **A short wait.** A live group waits for one backfill batch at most, and the gate keeps the
  backfill's model batches to about :data:`BACKFILL_HOLD_S` of model time, at the pace it measures.
- **Live first on the CPU too.** The backfill's polling thread (consuming and decoding, outside the
  turns) runs at the lowest CPU priority (nice 19). Its stage threads keep theirs: the embed thread
  holds the model while it works, and the live lane waits for it to let go (a starved holder would
  keep it waiting).
- **No dead letters twice.** The live lane dead-letters the records that cannot succeed; the backfill
  skips them (as migrate's does).
- **The live lane's metrics.** The backfill's polling thread writes none of the member's series
  (``worker.process.metrics.LiveLane``): the lag, partitions and end-to-end latency stay the live
  lane's. Its documents count under ``embedstream_model_documents_total`` with the new model's label.
- **Stops.** A signal stops both lanes. With ``--stop-when-idle`` each lane stops once its own input is
  idle, and the process exits when both have. A backfill that fails is logged and ends alone: the live
  lane goes on (``migrate --lane`` sees its lag stand still).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from connectors.milvus import MilvusStore
from schemas.errors import ConfigError
from worker.assembly.naming import backfill_group, collection_of
from worker.core.lanes import ModelGate
from worker.core.member import Member
from worker.core.stats import RunStats
from worker.embedding.base import Embedder
from worker.process import metrics
from worker.process.startup import StartClock
from worker.settings import Settings
from worker.steps.writing.sink import NO_OUTPUT

log = logging.getLogger(__name__)

#: How long a stopped backfill lane may take to finish its batches in flight and commit.
BACKFILL_STOP_S = 120.0
#: How long one backfill batch should hold the model: the longest a live batch that arrives meanwhile
#: waits for it (a tenth to a quarter of a short live record's p99 alone on the 2-core host).
BACKFILL_HOLD_S = 0.025
#: The smallest token budget of a backfill batch, whatever the model's pace; and the first one's, before
#: the gate has measured the pace.
MIN_BATCH_TOKENS, FIRST_BATCH_TOKENS = 64, 512

#: The nice value of the backfill's polling thread (it holds no turn): the lowest CPU priority.
BACKFILL_NICE = 19


def check_supported(s: Settings) -> None:
    """ConfigError when ``s`` asks for a backfill lane it cannot serve: one beside a model set."""
    if s.models is not None:
        raise ConfigError("EMBEDSTREAM_BACKFILL_MODEL moves one model's alias: it cannot run with EMBEDSTREAM_MODELS "
                          "(run `embedstream migrate` per model instead)")


def backfill_inflight(s: Settings) -> int:
    """The backfill lane's batches in flight: its share of the live lane's, at least one."""
    return max(1, int(s.max_inflight_batches * s.backfill_share))


def backfill_output(s: Settings) -> str:
    """The topic a backfill (the lane's or migrate's) publishes its records to:
    ``EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC``, else none (``sink.NO_OUTPUT``): the output topic's readers
    get the live model alone until the hand-over, and never two vector spaces at once."""
    return s.backfill_output_topic or NO_OUTPUT


def backfill_settings(s: Settings, model: Embedder) -> Settings:
    """The backfill lane's settings: the live worker's, with the new model (loaded: ``model``) in the
    backfill group of its collection, a consumer group whatever the live lane's kind (its progress
    is the group's offsets), no metrics server of its own, its records published only to
    ``EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC`` (none by default), and its share of the live lane's batches
    in flight and of their size (records and tokens; the gate makes them smaller still: the module
    doc)."""
    group = backfill_group(s, collection_of(s, "", model))
    share = s.backfill_share
    return s.model_copy(update={"model": s.backfill_model, "group_id": group, "group_type": "consumer",
                                "metrics_port": 0, "backfill_model": None,
                                "output_topic": backfill_output(s),
                                "max_inflight_batches": backfill_inflight(s),
                                "max_batch_size": max(1, int(s.max_batch_size * share)),
                                "max_batch_tokens": max(16, int(s.max_batch_tokens * share))})


class Lanes:
    """The live member and the backfill member of one process (the module doc). Run like a member:
    ``stop.install()`` on the main thread, then ``run()``, which returns the live lane's counters."""

    def __init__(self, live: Member, backfill: Member, gate: ModelGate, collection: str) -> None:
        self.live, self.backfill, self.gate, self.collection = live, backfill, gate, collection
        self.stop = live.stop
        self.metrics_port = live.metrics_port
        #: What ended the backfill lane, when it failed (the live lane went on).
        self.backfill_error: BaseException | None = None

    def run(self, stop_when_idle: float | None = None) -> RunStats:
        thread = threading.Thread(target=self._run_backfill, args=(stop_when_idle,), name="backfill-lane",
                                  daemon=True)
        thread.start()
        try:
            stats = self.live.run(stop_when_idle=stop_when_idle)
        except BaseException:
            self.backfill.stop.requested = True
            thread.join(BACKFILL_STOP_S)
            raise
        # Stopped: the backfill too. Idle: the backfill runs on until idle too, or a signal stops both.
        while thread.is_alive():
            if self.live.stop.requested or stop_when_idle is None:
                self.backfill.stop.requested = True
            thread.join(0.2)
        b = self.backfill.stats
        log.info("backfill lane into %s: %d embedded (%d from cache), %d skipped; %d batches through the model, "
                 "%.1f s waiting for the live lane", self.collection, b.embedded, b.cached, b.dead_lettered,
                 self.gate.backfill_batches, self.gate.backfill_waited_s)
        return stats

    def _run_backfill(self, stop_when_idle: float | None) -> None:
        metrics.quiet_this_thread()
        lower_thread(threading.get_native_id())  # its polling thread
        try:
            self.backfill.run(stop_when_idle=stop_when_idle)
        except BaseException as exc:  # the live lane goes on: the module doc
            self.backfill_error = exc
            log.error("the backfill lane into %s stopped (%s: %s); the live lane goes on. Fix the cause and "
                      "restart the worker: the backfill resumes from its group's offsets",
                      self.collection, type(exc).__name__, exc)


def lower_thread(thread_id: int) -> None:
    """The kernel thread ``thread_id`` at :data:`BACKFILL_NICE` (Linux sets priority per thread). A host
    that refuses logs it, and the thread goes on at its priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, BACKFILL_NICE)
    except (OSError, AttributeError) as exc:
        log.info("a backfill lane thread runs at the live lane's CPU priority (%s)", exc)


def build_lanes(s: Settings, startup: StartClock | None = None, embedder: Embedder | None = None,
                store_factory: Callable[[Settings, str], MilvusStore] | None = None) -> Lanes:
    """The live worker of ``s`` and its backfill lane of ``s.backfill_model``, sharing one model gate
    (``embedder``: the live lane's model, loaded; ``store_factory``: a stand-in for Milvus; the
    bench's). Raises ConfigError (as ``build_worker``) and for a setting the lane cannot serve."""
    from worker.assembly.runner import build_worker, load_embedder

    check_supported(s)
    gate = ModelGate(lambda: 0, backfill_hold_s=BACKFILL_HOLD_S)
    live = build_worker(s, embedder=embedder, startup=startup, store_factory=store_factory,
                        model_gate=gate.live_stage)
    try:
        new = load_embedder(s.model_copy(update={"model": s.backfill_model}))
        bs = backfill_settings(s, new)
        backfill = build_worker(bs, embedder=new, dead_letters=False, store_factory=store_factory,
                                model_gate=gate.backfill_stage)
    except BaseException:
        live.consumer.close()  # leave the live group at once: the process stops here
        raise
    gate.live_busy = lambda: not live.chain.model_free()
    batcher = backfill.chain.intake.batcher
    # Read by the backfill's polling thread as it closes batches; written by its embed thread. Small
    # until the gate has measured the model's pace: a first batch of the full size could hold it long.
    gate.resize = lambda tokens: setattr(batcher, "max_tokens", min(max(tokens, MIN_BATCH_TOKENS), bs.max_batch_tokens))
    gate.resize(FIRST_BATCH_TOKENS)
    collection = collection_of(s, "", new)
    log.info("backfill lane: model %s into %s, group %s, up to %d batches in flight; the live lane goes first",
             new.model_id, collection, bs.group_id, bs.max_inflight_batches)
    return Lanes(live, backfill, gate, collection)
