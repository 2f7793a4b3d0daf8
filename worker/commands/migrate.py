"""`embedstream migrate`: change the model without downtime.

Readers query an alias; each model writes a collection of its own behind it (the names:
``worker.assembly.naming``). A migration:

1. **plans** (:func:`plan`): where the alias points now, the new model's collection, the backfill's
   consumer group (``<group>.migrate.<new collection>``: the same on every run, so a re-run resumes),
   and whether the input topic's retention can replay every live document;
2. **backfills**: a worker of the new model in the backfill group reads the input topic from the
   beginning into the new collection, while the live workers keep writing the old one and the alias
   stays where it is;
3. once the backfill group's lag is zero, **compares** the two collections on a sample of the
   documents (:func:`shadow_check`: rows in each, the sampled documents each holds, and the overlap
   of their nearest neighbours for queries taken from those documents), which ``--min-overlap`` can
   make block the switch;
4. **switches** the alias in one call while still caught up, stops the backfill (it commits), and
   says how to hand the live workers over: the new model, in the backfill group (it has consumed the
   topic up to the switch; the old group's offsets belong to the old model's collection);
5. drops the other collections of the alias's family only on ``--drop-old``.

A **rollback** (``--rollback``) is the same steps back to a collection the alias pointed to before,
kept since: the group that wrote it (its backfill group, or the fleet's first group) resumes from
its committed offsets, so the collection catches up with what changed since the hand-over (updates
and deletes alike) instead of being written again; the shadow check compares it with the one in use;
the alias moves back; the fleet is told to return to that model and group.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec

from connectors.kafka import make_admin
from connectors.lag import GroupOffsets, group_lag
from connectors.milvus import MilvusAdmin, MilvusReader
from schemas import sparse as sparse_modes
from schemas.errors import ConfigError, TransientError
from schemas.sparse import SparseKind, SparseMode
from worker.assembly.canaries import canary_cosine
from worker.assembly.lanes import backfill_output
from worker.assembly.naming import alias_of, backfill_group, collection_of, family_prefix, fleet_group
from worker.commands.search import ROWS_PER_DOCUMENT, best_chunk_per_document
from worker.embedding.base import Embedder
from worker.settings import Settings

log = logging.getLogger(__name__)

#: Neighbours compared per sampled query.
TOP_K = 10


@dataclass
class Plan:
    """What a migration would do, before it does anything."""

    alias: str
    old_collection: str | None  #: where the alias points now; None: nothing serves yet
    old_model: str | None  #: the model id of the old collection's rows
    new_collection: str
    new_model: str
    group: str  #: the backfill's consumer group
    topic: str
    switched: bool  #: the alias already points to the new collection
    warnings: list[str] = field(default_factory=list)
    lag: int = 0  #: the backfill group's lag now (as the broker reports its end offsets)
    started: bool = False  #: the backfill group has committed something
    rollback: bool = False  #: back to a collection the alias pointed to before (:func:`rollback_group`)


@dataclass
class ShadowReport:
    """The two collections compared before the switch."""

    old_rows: int
    new_rows: int
    sampled: int
    in_old: int  #: sampled documents (taken from the new collection) that the old one holds
    in_new: int
    overlap_mean: float | None  #: mean share of top-k documents both collections return; None: not measured
    overlap_min: float | None
    note: str = ""
    #: Each collection's kept canary against its model now, smallest cosine (None: no canary kept,
    #: or the model not loaded): the models still make the vectors each collection holds.
    canary_old: float | None = None
    canary_new: float | None = None


def retention_warnings(settings: Settings, admin=None) -> list[str]:
    """Why the input topic may not replay every live document: a ``delete`` cleanup policy with a
    finite retention (time or size). A topic whose configuration cannot be read gets a warning too."""
    admin = admin or make_admin(settings.kafka_common())
    topic = settings.input_topic
    try:
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = admin.describe_configs([res], request_timeout=10)[res].result(10)
    except Exception as exc:
        return [f"could not read topic {topic!r}'s cleanup policy ({exc}): make sure its retention keeps every "
                "live document (a compacted topic keyed by document id), or the migration misses the older ones"]
    policy = configs["cleanup.policy"].value if "cleanup.policy" in configs else "delete"
    if "compact" in (policy or ""):
        return []
    limits = [f"{k}={configs[k].value}" for k in ("retention.ms", "retention.bytes")
              if k in configs and configs[k].value not in (None, "-1")]
    if not limits:
        return []
    return [f"topic {topic!r} has cleanup.policy={policy} with {', '.join(limits)}: documents older than that are "
            "gone from it and will be missing from the new collection. Make the input topic compacted "
            "(cleanup.policy=compact, keyed by document id) so a replay holds every live document"]


class BackfillLag(NamedTuple):
    records: int  #: end offset − committed offset, summed over the partitions
    certain: bool  #: the backfill's consumer is at the end of every partition: a 0 means done
    started: bool  #: the group has committed something


def backfill_lag(settings: Settings, group: str, ends: Mapping[int, int] | None = None,
                 admin=None, offsets=None) -> BackfillLag:
    """The backfill group's records still to embed: end offset − committed offset summed over the
    partitions (one it never committed counts from its first offset, as KEDA's ``earliest``).
    ``ends`` (partition → end offset, for the partitions the backfill's consumer is at the end of
    now) raise the end offsets the broker reports: Tansu's ListOffsets answers short (the last
    batch's base offset + 1). Only when ``ends`` covers every partition is the answer certain: a 0
    while the backfill is still reading some partition must not be taken for done. ``admin`` and
    ``offsets`` (a ``connectors.lag.GroupOffsets`` of ``group``): a caller's, kept across polls."""
    admin = admin or make_admin(settings.kafka_common())
    if offsets is None:
        with GroupOffsets(settings.kafka_common(), group) as once:
            lags = group_lag(admin, once, settings.input_topic, "earliest")
    else:
        lags = group_lag(admin, offsets, settings.input_topic, "earliest")
    # The first offsets only where the group never committed (once it has, polls cost no second request).
    never = {TopicPartition(settings.input_topic, p.partition): OffsetSpec.earliest()
             for p in lags if p.committed is None}
    first = {tp.partition: f.result(10).offset
             for tp, f in (admin.list_offsets(never, request_timeout=10) if never else {}).items()}
    seen = ends or {}
    total = sum(max(0, max(p.end_offset, seen.get(p.partition, -1))
                    - (p.committed if p.committed is not None else first[p.partition])) for p in lags)
    return BackfillLag(total, ends is not None and all(p.partition in seen for p in lags),
                       any(p.committed is not None for p in lags))


#: First chunks read to draw the sample from (a bounded read, whatever the collection's size).
SAMPLE_POOL = 5000


def sample_documents(store: MilvusReader, n: int, seed: int = 7) -> list[tuple[str, str]]:
    """Up to ``n`` documents of ``store`` as ``(doc id, excerpt of its first chunk)``, drawn at random
    (fixed seed) from up to ``SAMPLE_POOL`` of its first chunks."""
    rows = store.query("chunk_index == 0", ["doc_id", "excerpt"], limit=SAMPLE_POOL)
    firsts = sorted((r["doc_id"], r.get("excerpt") or "") for r in rows)
    firsts = [(d, e) for d, e in firsts if e.strip()]
    return random.Random(seed).sample(firsts, min(n, len(firsts)))


def _top_docs(store: MilvusReader, model: Embedder, texts: list[str]) -> list[list[str]]:
    vectors = model.embed_query(texts)
    return [[h["id"] for h in best_chunk_per_document(store.search(v, TOP_K * ROWS_PER_DOCUMENT), TOP_K)]
            for v in vectors]


def _canary(reader: MilvusReader, model: Embedder) -> float | None:
    """``reader``'s collection's canary against ``model`` now (``worker.assembly.canaries``); None when
    it keeps none, or Milvus did not answer (the check goes on without it)."""
    try:
        return canary_cosine(MilvusAdmin.sharing(reader), model)
    except TransientError as exc:
        log.warning("could not read the canary of %s (%s)", reader.collection, exc)
        return None


def shadow_check(old: MilvusReader | None, new: MilvusReader, old_model: Embedder | None, new_model: Embedder,
                 sample: int) -> ShadowReport:
    """Compare the collections on ``sample`` documents of the new one: how many each holds, for each
    document's excerpt as a query (each collection asked with its own model) the share of the top-10
    documents both return, and each collection's canary against its model now."""
    docs = sample_documents(new, sample)
    ids = [d for d, _ in docs]
    in_new = len(new.held(ids))
    canary_new = _canary(new, new_model)
    if old is None:
        return ShadowReport(0, new.count(), len(docs), 0, in_new, None, None, "no old collection to compare with",
                            canary_new=canary_new)
    in_old = len(old.held(ids))
    report = ShadowReport(old.count(), new.count(), len(docs), in_old, in_new, None, None, canary_new=canary_new,
                          canary_old=_canary(old, old_model) if old_model else None)
    if old_model is None:
        report.note = "the old model is not loaded (set EMBEDSTREAM_MODEL to it): neighbours not compared"
        return report
    if not docs:
        report.note = "no documents to sample"
        return report
    texts = [e for _, e in docs]
    overlaps = [len(set(a) & set(b)) / TOP_K
                for a, b in zip(_top_docs(old, old_model, texts), _top_docs(new, new_model, texts))]
    report.overlap_mean, report.overlap_min = sum(overlaps) / len(overlaps), min(overlaps)
    return report


class Backfill:
    """A worker of the new model in the backfill group, on a thread of its own. It loads the model
    itself: a model is called from one thread only (its embed thread), and the shadow check embeds
    its queries meanwhile with the instance of its own."""

    def __init__(self, settings: Settings) -> None:
        from worker.assembly.runner import build_worker
        from worker.core.loop import Worker

        # The live worker dead-lettered the records that cannot succeed already: not twice. The backfill
        # reads the topic from its start in a consumer group of its own, whatever group the live workers
        # form: its progress is the group's offsets against the partitions' ends.
        worker = build_worker(settings.model_copy(update={"group_type": "consumer"}), dead_letters=False)
        assert isinstance(worker, Worker)
        self.worker = worker
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="backfill", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # handed to the caller, which stops with it
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def done(self, lag: int) -> int:
        """Records this run of the backfill has taken care of."""
        stats = self.worker.stats
        return stats.embedded + stats.deleted + stats.dead_lettered

    def ends(self) -> dict[int, int]:
        """Partition → end offset, for the partitions the backfill is at the end of now."""
        return {p: off for (topic, p), off in self.worker.assignment.ends_reached().items()
                if topic == self.worker.topic}

    def stop(self, timeout: float = 120.0) -> None:
        """Finish what is in flight, commit, leave the group."""
        self.worker.stop.requested = True
        self._thread.join(timeout)


#: Seconds the backfill group may have no member, once it had one, before ``migrate --lane`` takes the
#: lane for ended (a rolling restart of the workers leaves it empty for a session timeout or so).
LANE_GONE_S = 120.0


class LaneWatch:
    """The backfill lane of the live workers (``EMBEDSTREAM_BACKFILL_MODEL``, ``worker.assembly.lanes``),
    watched from outside: by its group's lag, and by its members (``members()``: how many the group has
    now; None: not known). Nothing to start or stop. Once the group had a member, :attr:`alive` turns
    False when it has had none for ``gone_s`` (the lane ended, or no worker runs it any more); before
    the first member it waits (the workers may be rolling out the lane)."""

    error: BaseException | None = None

    def __init__(self, members: Callable[[], int | None] = lambda: None, gone_s: float = LANE_GONE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first: int | None = None
        self._members, self.gone_s, self._clock = members, gone_s, clock
        self._seen = False
        self._empty_since: float | None = None

    @property
    def alive(self) -> bool:
        n = self._members()
        if n is None:
            return True
        if n > 0:
            self._seen, self._empty_since = True, None
            return True
        if not self._seen:
            return True
        now = self._clock()
        if self._empty_since is None:
            self._empty_since = now
        return now - self._empty_since < self.gone_s

    def ends(self) -> dict[int, int]:
        return {}

    def done(self, lag: int) -> int:
        """Records the lane wrote since the first reading of ``lag``."""
        self._first = lag if self._first is None else max(self._first, lag)
        return self._first - lag

    def stop(self) -> None:
        return None


class LaneEnded(RuntimeError):
    """``migrate --lane`` found the lane it waited for gone."""


def group_members(admin: Any, group: str, timeout: float = 10.0) -> int | None:
    """How many members consumer group ``group`` has now (None: the broker did not say)."""
    try:
        [future] = admin.describe_consumer_groups([group], request_timeout=timeout).values()
        return len(future.result(timeout=timeout).members)
    except Exception as exc:  # an outage, or a broker without the call: not a reason to give up
        log.debug("describing group %s failed: %s", group, exc)
        return None


def lane_lag(lag: BackfillLag) -> BackfillLag:
    """A lane's lag read from the broker alone: a 0 is taken as done (a group that never committed owes
    every record from the first offset: its 0 is an empty topic). A broker whose end offsets answer
    short (Tansu) can read 0 one batch early; the lane writes that batch into the new collection after
    the switch all the same."""
    return lag._replace(certain=lag.records == 0)


def wait_caught_up(lag: Callable[[], BackfillLag], backfill: Backfill | LaneWatch, on_lag: Callable[[int], None],
                   interval: float = 0.5) -> None:
    """Block until ``lag()`` is a certain 0, calling ``on_lag`` with each reading. Raises when the
    backfill dies."""
    logged = 0.0
    while True:
        if backfill.error is not None:
            raise backfill.error
        if not backfill.alive:
            if isinstance(backfill, LaneWatch):
                raise LaneEnded(f"the backfill lane's group has had no member for {backfill.gone_s:.0f} s: the "
                                "live workers' lane ended (their logs say why) or no worker runs with "
                                "EMBEDSTREAM_BACKFILL_MODEL any more; nothing was switched")
            raise RuntimeError("the backfill worker stopped")
        now = lag()
        on_lag(now.records)
        if now.records == 0 and now.certain:
            return
        if time.monotonic() - logged > 10:
            logged = time.monotonic()
            log.info("backfill lag: %d records%s", now.records, "" if now.certain else " (not at every end yet)")
        time.sleep(interval)


def drop_old(admin: MilvusAdmin, plan: Plan) -> list[str]:
    """Drop the collections of the alias's family other than the new one (and their companions)."""
    keep = {plan.new_collection, f"{plan.new_collection}_deleted", f"{plan.new_collection}_claims"}
    dropped = []
    for name in admin.collections(family_prefix(plan.new_collection)):
        if name not in keep:
            admin.drop_collection(name)
            dropped.append(name)
    return dropped


def old_sparse(admin: MilvusAdmin, collection: str) -> SparseMode:
    """The sparse mode the old model ran with, as far as its collection tells: BM25 or off (a learned
    sparse model's id is not in the collection: its dense side is what migrate compares)."""
    try:
        kind = MilvusReader.sharing(admin, collection).sparse_kind()
    except TransientError:  # no such collection yet (a first migration): nothing to compare
        return sparse_modes.OFF
    return sparse_modes.BM25 if kind is SparseKind.BM25 else sparse_modes.OFF


def check_supported(settings: Settings) -> None:
    if settings.models is not None:
        raise ConfigError("migrate moves the alias of one model: with EMBEDSTREAM_MODELS, run it per model with "
                          "EMBEDSTREAM_MODELS unset, EMBEDSTREAM_MODEL the old model's path and "
                          "EMBEDSTREAM_MILVUS_ALIAS / _COLLECTION that model's names")


@dataclass
class Migration:
    """A planned migration and what it runs with: the settings of the live deployment, those of the
    backfill, both models (the old one None when it cannot be loaded from the settings) and Milvus's
    administration opened on the new collection."""

    plan: Plan
    settings: Settings
    backfill_settings: Settings
    new_model: Embedder
    old_model: Embedder | None
    admin: MilvusAdmin


def rollback_group(settings: Settings, collection: str) -> tuple[str, bool]:
    """The consumer group whose committed offsets say how far ``collection`` is written: its own
    backfill group (it came from a migration), else the fleet's first group (it was the first
    collection); ``(group, started)``, started False when neither has committed (the collection is
    then written again from the topic's beginning: slower, the same result)."""
    candidates = [backfill_group(settings, collection), fleet_group(settings.group_id)]
    for group in candidates:
        if backfill_lag(settings, group).started:
            return group, True
    return candidates[0], False


def plan(settings: Settings, new_model: str, group: str | None = None, rollback: bool = False) -> Migration:
    """Load both models and read where things stand; changes nothing. ``rollback``: ``new_model``'s
    collection is one the alias pointed to before, kept (never dropped): it catches up from the
    group that wrote it (:func:`rollback_group`) rather than from the topic's beginning. Raises
    ConfigError."""
    from connectors.kafka import check_broker
    from worker.assembly.runner import check_topics, load_embedder, open_milvus

    check_supported(settings)
    try:
        settings.require("kafka_bootstrap_servers", "milvus_uri")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_broker(settings.kafka_common())
    new = load_embedder(settings.model_copy(update={"model": new_model}))
    alias, new_collection = alias_of(settings, ""), collection_of(settings, "", new)
    admin = open_milvus(settings, MilvusAdmin, new_collection)
    warnings = retention_warnings(settings)
    if rollback:
        if not admin.has(new_collection):
            raise ConfigError(f"collection {new_collection!r} of model {new.model_id} is not in Milvus (dropped by "
                              f"--drop-old?): a rollback moves the alias back to a collection that is kept. "
                              f"`embedstream migrate --model {new_model}` builds it again from the input topic")
        if group is None:
            group, resumed = rollback_group(settings, new_collection)
            if not resumed:
                warnings.append(f"no consumer group has committed offsets for {new_collection!r}: it is written "
                                f"again from the input topic's beginning in group {group!r} (the same result, slower)")
    group = group or backfill_group(settings, new_collection)
    backfill = settings.model_copy(update={
        "model": new_model, "group_id": group, "group_instance_id": None, "metrics_port": 0,
        "output_topic": backfill_output(settings)})
    check_topics(backfill)
    target = admin.alias_target(alias)
    old: Embedder | None = None
    try:
        old = load_embedder(settings.model_copy(update={"sparse": old_sparse(admin, target or alias).setting}))
    except ConfigError as exc:
        warnings.append(f"the old model (EMBEDSTREAM_MODEL) does not load ({exc}): neighbours are not compared")
    if target is None and admin.has(alias):
        warnings.append(f"{alias!r} is a collection from before aliases: it is renamed to the old model's "
                        "collection and the alias takes its name (rows kept) before the backfill starts")
        old_collection: str | None = alias
    else:
        old_collection = target
    old_model_id = MilvusReader.sharing(admin, old_collection).model_of() if old_collection else None
    if old is not None and old_model_id not in (None, old.model_id):
        warnings.append(f"the old collection holds model {old_model_id!r} but EMBEDSTREAM_MODEL loads "
                        f"{old.model_id!r}: neighbours are not compared")
        old = None
    lag = backfill_lag(backfill, group)
    p = Plan(alias, old_collection, old_model_id, new_collection, new.model_id, group, settings.input_topic,
             switched=target == new_collection, warnings=warnings, lag=lag.records, started=lag.started,
             rollback=rollback)
    return Migration(p, settings, backfill, new, old, admin)


def adopt_legacy(m: Migration) -> None:
    """A collection from before aliases named like the alias: rename it behind the alias (as a
    worker of the old model would at start-up)."""
    p = m.plan
    if p.old_collection != p.alias:
        return
    if m.old_model is None:
        raise ConfigError(f"{p.alias!r} is a collection from before aliases: set EMBEDSTREAM_MODEL to the model it "
                          "was built with, so that migrate can move it behind the alias first")
    old_admin = MilvusAdmin.sharing(m.admin, collection_of(m.settings, "", m.old_model))
    old_admin.prepare(p.alias, m.old_model.model_id, m.old_model.dim)
    p.old_collection = old_admin.collection


def run(m: Migration, *, sample: int = 50, min_overlap: float | None = None, drop: bool = False,
        lane: bool = False, on_lag: Callable[[int, Backfill | LaneWatch], None] = lambda lag, b: None,
        on_report: Callable[[ShadowReport], None] = lambda r: None,
        say: Callable[[str], None] = log.info) -> bool:
    """Backfill (``lane``: wait for the live workers' backfill lane instead), compare, switch (unless
    blocked), drop the old collections on ``drop``. Returns True when the alias points to the new
    collection at the end."""
    p = m.plan
    if p.switched:
        say(f"alias {p.alias!r} already points to {p.new_collection!r}: nothing to backfill")
    else:
        adopt_legacy(m)
        backfill: Backfill | LaneWatch
        if lane:
            members_admin = make_admin(m.settings.kafka_common())
            backfill = LaneWatch(lambda: group_members(members_admin, p.group))
            say(f"waiting for the live workers' backfill lane (EMBEDSTREAM_BACKFILL_MODEL set to this model) to "
                f"catch up in group {p.group!r}: without one, its lag stands still")
        else:
            backfill = Backfill(m.backfill_settings)
            backfill.start()
        admin = make_admin(m.settings.kafka_common())
        offsets = GroupOffsets(m.backfill_settings.kafka_common(), p.group)  # polled until the switch
        try:

            def lag() -> BackfillLag:
                now = backfill_lag(m.backfill_settings, p.group, backfill.ends(), admin, offsets)
                return lane_lag(now) if lane else now

            wait_caught_up(lag, backfill, lambda v: on_lag(v, backfill))
            old = MilvusReader.sharing(m.admin, p.old_collection) if p.old_collection else None
            report = shadow_check(old, MilvusReader.sharing(m.admin), m.old_model, m.new_model, sample)
            on_report(report)
            if min_overlap is not None and (report.overlap_mean is None or report.overlap_mean < min_overlap):
                shown = "not measured" if report.overlap_mean is None else f"{report.overlap_mean:.3f}"
                say(f"not switching: neighbour overlap {shown} is below --min-overlap {min_overlap}; the backfill's "
                    "progress is kept (a re-run resumes)")
                return False
            wait_caught_up(lag, backfill, lambda v: on_lag(v, backfill))  # still caught up after the check
            m.admin.point_alias(p.alias)
            say(f"switched: alias {p.alias!r} → {p.new_collection!r} (was {p.old_collection!r})")
        finally:
            offsets.close()
            backfill.stop()
    if drop:
        dropped = drop_old(m.admin, p)
        say(f"dropped {', '.join(dropped)}" if dropped else "no old collection to drop")
    return True
