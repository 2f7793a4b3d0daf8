"""A worker with a backfill lane beside its live one (``EMBEDSTREAM_BACKFILL_MODEL``).

The backfill lane is ``embedstream migrate``'s backfill, run inside the live worker's process instead
of a Job of its own: a second member, in the backfill group (``<group>.migrate.<new collection>``,
``worker.assembly.naming.backfill_group``, so ``migrate --lane`` watches its lag and a Job would
resume where it stopped), reads the input topic from its start into the new model's collection.

- **Live first.** The two lanes' embed stages pass through one :class:`~worker.core.lanes.ModelGate`:
  a live group takes the model as soon as it is free; a backfill group only when no live batch waits.
- **A bounded share.** The backfill member holds at most ``EMBEDSTREAM_BACKFILL_SHARE`` of the live
  lane's ``EMBEDSTREAM_MAX_INFLIGHT_BATCHES`` (at least one batch), so a live batch waits for one
  small backfill group at most, and the backfill's memory stays a fraction of the live lane's.
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
import threading

from schemas.errors import ConfigError
from worker.assembly.naming import backfill_group, collection_of
from worker.core.lanes import ModelGate
from worker.core.member import Member
from worker.core.stats import RunStats
from worker.embedding.base import Embedder
from worker.process import metrics
from worker.process.startup import StartClock
from worker.settings import Settings

log = logging.getLogger(__name__)

#: How long a stopped backfill lane may take to finish its batches in flight and commit.
BACKFILL_STOP_S = 120.0


def backfill_inflight(s: Settings) -> int:
    """The backfill lane's batches in flight: its share of the live lane's, at least one."""
    return max(1, int(s.max_inflight_batches * s.backfill_share))


def backfill_settings(s: Settings, model: Embedder) -> Settings:
    """The backfill lane's settings: the live worker's, with the new model (loaded: ``model``) in the
    backfill group of its collection, a consumer group whatever the live lane's kind (its progress
    is the group's offsets), no metrics server of its own, and its share of the batches in flight."""
    group = backfill_group(s, collection_of(s, "", model))
    return s.model_copy(update={"model": s.backfill_model, "group_id": group, "group_type": "consumer",
                                "metrics_port": 0, "backfill_model": None,
                                "max_inflight_batches": backfill_inflight(s)})


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
        log.info("backfill lane into %s: %d embedded (%d from cache), %d skipped; %d groups through the model, "
                 "%.1f s waiting for the live lane", self.collection, b.embedded, b.cached, b.dead_lettered,
                 self.gate.backfill_groups, self.gate.backfill_waited_s)
        return stats

    def _run_backfill(self, stop_when_idle: float | None) -> None:
        metrics.quiet_this_thread()
        try:
            self.backfill.run(stop_when_idle=stop_when_idle)
        except BaseException as exc:  # the live lane goes on: the module doc
            self.backfill_error = exc
            log.error("the backfill lane into %s stopped (%s: %s); the live lane goes on. Fix the cause and "
                      "restart the worker: the backfill resumes from its group's offsets",
                      self.collection, type(exc).__name__, exc)


def build_lanes(s: Settings, startup: StartClock | None = None) -> Lanes:
    """The live worker of ``s`` and its backfill lane of ``s.backfill_model``, sharing one model gate.
    Raises ConfigError (as ``build_worker``) and for a setting the lane cannot serve."""
    from worker.assembly.runner import build_worker, load_embedder

    if s.models is not None:
        raise ConfigError("EMBEDSTREAM_BACKFILL_MODEL moves one model's alias: it cannot run with EMBEDSTREAM_MODELS "
                          "(run `embedstream migrate` per model instead)")
    gate = ModelGate(lambda: 0)
    live = build_worker(s, startup=startup, model_hold=gate.live)
    try:
        new = load_embedder(s.model_copy(update={"model": s.backfill_model}))
        bs = backfill_settings(s, new)
        backfill = build_worker(bs, embedder=new, dead_letters=False, model_hold=gate.backfill)
    except BaseException:
        live.consumer.close()  # leave the live group at once: the process stops here
        raise
    gate.live_waiting = lambda: not live.chain.model_free()
    collection = collection_of(s, "", new)
    log.info("backfill lane: model %s into %s, group %s, up to %d batches in flight; the live lane goes first",
             new.model_id, collection, bs.group_id, bs.max_inflight_batches)
    return Lanes(live, backfill, gate, collection)
