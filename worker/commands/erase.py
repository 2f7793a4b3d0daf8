"""Erase documents from every copy the worker made, and say what is left (``embedstream erase``).

An erasure goes through the worker, as any delete does: a tombstone per id on the input topic (to
the partition of the document's current version, so it is applied after it), which the running
workers apply like any other. Before it, each model's collection and cache are read (the document's
chunk rows, the content hashes of its texts); after it, until the workers have applied it (each
collection holds no row of the id and keeps the tombstone's version), they are read again. The
:class:`Receipt` says, per id and model, what was there and what is gone: the chunk rows, the
version record kept without content (so no older upsert can bring the document back), the cache
entries of its texts (any the worker could not remove are removed here, and counted apart), and the
tombstone on the output topic. What stays by design is named with its lifetime: the input topic's
records until compaction (``delete.retention.ms`` keeps the tombstone itself), the dead letters of
those keys until the DLQ topic's retention.

Ids are data throughout: a key on the topic, a string literal in a Milvus filter
(``connectors.milvus.expressions``), a Redis key suffix only through the content hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer

from connectors.kafka import logged, producer_conf, topic_settings
from connectors.milvus import MilvusStore
from connectors.milvus.schema import chunk_id
from connectors.redis_cache import RedisCache
from schemas.errors import ConfigError
from worker.settings import Settings

#: The topic settings that say how long what stays by design stays.
LIFETIMES = ("cleanup.policy", "retention.ms", "delete.retention.ms")


@dataclass
class ModelCopy:
    """One model's copy of one id: read before the erasure, then after it was applied."""

    model: str
    collection: str
    chunks: int = 0
    hashes: set[str] = field(default_factory=set)
    cached: list[str] = field(default_factory=list)
    #: after: rows of the id still there, the tombstone's version kept (its input offset)
    rows_left: int | None = None
    version_kept: int | None = None
    #: after: cache entries the worker left (removed here, then read again: ``cache_left``)
    cache_removed_here: int = 0
    cache_left: list[str] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return self.rows_left == 0 and self.version_kept is not None


@dataclass
class Erased:
    """One id: where its tombstone went, each model's copy, and its tombstone on the output topic."""

    id: str
    partition: int = -1
    offset: int = -1
    copies: list[ModelCopy] = field(default_factory=list)
    output: tuple[int, int] | None = None  # (partition, offset) on the output topic
    dead_letters: int = 0

    @property
    def applied(self) -> bool:
        return all(c.applied for c in self.copies)

    @property
    def complete(self) -> bool:
        return self.applied and self.output is not None and not any(c.cache_left for c in self.copies)


@dataclass
class Receipt:
    """Every id's :class:`Erased`, and what stays by design: ``topics[name]`` the :data:`LIFETIMES`
    of the input and DLQ topics that the broker told."""

    ids: list[Erased]
    topics: dict[str, dict[str, str]]
    input_topic: str
    output_topic: str
    dlq_topic: str
    waited_s: float = 0.0

    @property
    def complete(self) -> bool:
        return all(e.complete for e in self.ids)


@dataclass
class Target:
    """What one model wrote: its collection (the one behind the readers' alias) and its cache."""

    model: str
    store: MilvusStore
    cache: RedisCache | None


def targets(s: Settings) -> list[Target]:
    """Each model's collection and cache, as the worker names them: the models are loaded (a cache
    key holds the model's cache id, which its precision and prompts decide)."""
    from worker.assembly.milvus import open_milvus
    from worker.assembly.naming import alias_of
    from worker.assembly.runner import load_models, open_cache, require_connections

    require_connections(s)
    models = load_models(s)
    out = []
    for name, model in models.handles.items():
        alias = alias_of(s, name)
        probe = open_milvus(s, MilvusStore, alias)
        collection = probe.alias_target(alias) or alias  # the tombstones' companion is the collection's
        if not probe.has(collection):
            probe.close()
            raise ConfigError(f"no collection {alias!r} in Milvus at {probe.where}: nothing was written there; "
                              "fix EMBEDSTREAM_MILVUS_ALIAS / EMBEDSTREAM_MILVUS_COLLECTION")
        out.append(Target(name, MilvusStore.sharing(probe, collection), open_cache(s, model)))
    return out


def _partition_of(source: str | None) -> int | None:
    """The input partition a version came from (``VersionGuard.source``: ``<topic id>:<partition>``)."""
    tail = (source or "").rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


def read_before(ids: list[str], found: list[Target]) -> tuple[list[Erased], dict[str, int]]:
    """Each id's copies as they are now, and the input partition of its current version (where one is known)."""
    erased = {i: Erased(i) for i in ids}
    partitions: dict[str, int] = {}
    for t in found:
        versions, counts = t.store.versions(ids)
        for i in ids:
            n = counts.get(i, 0)
            hashes = t.store.content_hashes([chunk_id(i, k) for k in range(n)]) if n else set()
            cached = t.cache.held(hashes) if t.cache is not None else []
            erased[i].copies.append(ModelCopy(t.model, t.store.collection, n, hashes, cached))
            p = _partition_of(versions.get(i, (None, None))[0])  # its rows', or its last delete's
            if p is not None:
                partitions.setdefault(i, p)
    return list(erased.values()), partitions


def produce_tombstones(s: Settings, erased: list[Erased], partitions: dict[str, int]) -> None:
    """A tombstone per id to the input topic (to its current version's partition where known); each
    one's partition and offset set from its acknowledgement. Raises RuntimeError on a refusal."""
    # every record's report: its partition and offset are what the receipt waits for
    producer = Producer(logged({**producer_conf(s.kafka_common()), "delivery.report.only.error": False}))
    failures: list[str] = []

    def acked(e: Erased) -> Callable:
        def call(err, msg) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                e.partition, e.offset = msg.partition(), msg.offset()
        return call

    for e in erased:
        # -1: the producer's partitioner (librdkafka's RD_KAFKA_PARTITION_UA)
        producer.produce(s.input_topic, key=e.id.encode(), value=None, on_delivery=acked(e),
                         partition=partitions.get(e.id, -1))
        producer.poll(0)
    left = producer.flush(60)
    unreported = [e.id for e in erased if e.offset < 0]
    if failures or left or unreported:
        missing = len(failures) + max(left, len(unreported))
        raise RuntimeError(f"{missing} of {len(erased)} tombstones were not acknowledged by "
                           f"{s.kafka_bootstrap_servers}: {failures[:1] or ['timed out']}")


def read_after(erased: list[Erased], found: list[Target]) -> None:
    """Each copy's rows and kept version now (``ModelCopy.applied``)."""
    ids = [e.id for e in erased]
    for k, t in enumerate(found):
        versions, counts = t.store.versions(ids)
        for e in erased:
            copy = e.copies[k]
            copy.rows_left = counts.get(e.id, 0)
            source, offset = versions.get(e.id, (None, None))
            applied = _partition_of(source) == e.partition and offset is not None and offset >= e.offset
            copy.version_kept = offset if applied else None


def clear_cache(erased: list[Erased], found: list[Target]) -> None:
    """Read each copy's cache entries again; remove any the worker left (its cache failed the call),
    then read once more: ``cache_left`` is what could not be removed."""
    for k, t in enumerate(found):
        if t.cache is None:
            continue
        for e in erased:
            copy = e.copies[k]
            left = t.cache.held(copy.hashes)
            if left and t.cache.delete_many(left):
                copy.cache_removed_here = len(left)
                left = t.cache.held(left)
            copy.cache_left = left


def find_output_tombstones(s: Settings, erased: list[Erased], since_ms: int) -> None:
    """Each id's tombstone on the output topic: a null value under its key from the partition and
    offset of the erasure's own tombstone (its ``embedstream.source.*`` headers)."""
    from worker.commands.dead_letters import read_records

    wanted = {(e.id.encode(), e.partition, e.offset): e for e in erased}
    for msg in read_records(s, s.output_topic, since_ms=since_ms):
        if msg.value() is not None:
            continue
        headers = dict(msg.headers() or ())
        try:
            key = (msg.key(), int(headers.get("embedstream.source.partition", b"-1")),
                   int(headers.get("embedstream.source.offset", b"-1")))
        except ValueError:
            continue
        if key in wanted:
            wanted[key].output = (msg.partition(), msg.offset())


def count_dead_letters(s: Settings, erased: list[Erased]) -> None:
    """How many dead letters each id has on the DLQ topic (they stay until its retention)."""
    from worker.commands.dead_letters import dead_letters

    by_key = {e.id.encode(): e for e in erased}
    for d in dead_letters(s, lambda d: d.key in by_key):
        by_key[d.key].dead_letters += 1  # type: ignore[index]


def erase(s: Settings, ids: list[str], timeout_s: float = 120.0,
          waiting: Callable[[int, int], None] = lambda applied, total: None) -> Receipt:
    """Erase ``ids`` (see the module's docstring); ``waiting(applied, total)`` is told while the
    workers apply the tombstones. Raises ConfigError on settings, RuntimeError when the broker refuses."""
    ids = list(dict.fromkeys(ids))
    found = targets(s)
    try:
        erased, partitions = read_before(ids, found)
        since_ms = int(time.time() * 1000) - 5_000  # the broker's clock may be a little behind ours
        produce_tombstones(s, erased, partitions)
        t0 = time.monotonic()
        while True:
            read_after(erased, found)
            done = sum(e.applied for e in erased)
            waiting(done, len(erased))
            if done == len(erased) or time.monotonic() - t0 > timeout_s:
                break
            time.sleep(0.5)
        waited = time.monotonic() - t0
        clear_cache(erased, found)
    finally:
        for t in found:
            t.store.close()
            if t.cache is not None:
                t.cache.close()
    find_output_tombstones(s, erased, since_ms)
    count_dead_letters(s, erased)
    topics = topic_settings(s.kafka_common(), [s.input_topic, s.dlq_topic], LIFETIMES)
    return Receipt(erased, topics, s.input_topic, s.output_topic, s.dlq_topic, waited)


def lifetime(config: dict[str, str] | None, what: str) -> str:
    """How long a topic keeps ``what`` (``records`` or ``tombstones``), from its configuration, in words."""
    if config is None:
        return "its configuration was not told (grant DescribeConfigs to see it)"

    def span(ms: str) -> str:
        if ms in ("-1", ""):
            return "for ever"
        hours = int(ms) / 3_600_000
        n, unit = (hours / 24, "day") if hours >= 24 else (hours, "hour")
        return f"for {n:g} {unit}{'' if n == 1 else 's'}"

    policy = config.get("cleanup.policy", "delete")
    if what == "tombstones":
        return f"the tombstone itself {span(config.get('delete.retention.ms', '86400000'))} after compaction"
    if "compact" in policy:
        return ("until compaction keeps only the tombstone (cleanup.policy=" + policy + ")"
                + ("" if "delete" not in policy else f", or {span(config.get('retention.ms', ''))}"))
    return f"{span(config.get('retention.ms', '604800000'))} (cleanup.policy={policy}, retention.ms)"
