"""Build a ready-to-run worker from settings, checking every setting before the first record.

Start-up fails with :class:`ConfigError` (a message that says what to fix) when the broker does
not answer, a topic is missing, the model cannot be loaded, or the Milvus collection holds vectors
of another dim. Redis is optional: an unreachable one is a warning, and the worker runs uncached.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from dataclasses import replace

from confluent_kafka import KafkaError
from confluent_kafka.schema_registry import SchemaRegistryError

from connectors.kafka import check_broker, group_session_ms, make_admin, topic_ids, topic_max_bytes
from connectors.milvus import MilvusAdmin, MilvusStore
from connectors.redis_cache import VECTORS, WITH_SPARSE, RedisCache
from connectors.registry import SchemaRegistry, client_conf
from schemas import sparse as sparse_modes
from schemas.codec import DOCUMENT_SCHEMA_TEXT
from schemas.errors import ConfigError
from schemas.sparse import SparseMode
from worker.assembly import groups
from worker.assembly.canaries import check_canary
from worker.assembly.chain import build_chain
from worker.assembly.milvus import open_milvus
from worker.assembly.naming import alias_of, collection_of
from worker.assembly.upgrade import collection_to_write
from worker.core.fence import Fence, lease_seconds
from worker.core.lanes import LaneGate
from worker.core.member import Member
from worker.core.stats import RunStats
from worker.embedding.base import Embedder
from worker.embedding.models import ModelSet, ModelSpec, describe, parse_models
from worker.process import heap, metrics
from worker.process.gpu_metrics import register_gpu_metrics
from worker.process.startup import StartClock
from worker.settings import Settings
from worker.steps.writing.fit import DEFAULT_MESSAGE_MAX_BYTES, TopicLimits
from worker.steps.writing.ordering import claim_expiry
from worker.steps.writing.sink import NO_OUTPUT

log = logging.getLogger(__name__)


def check_topics(settings: Settings) -> None:
    """Raise ``ConfigError`` when one of the three topics is missing, or hidden from this principal (a
    broker with an authorizer lists only the topics a principal may describe: asked by name, it says
    which it refused)."""
    admin = make_admin(settings.kafka_common())
    meta = admin.list_topics(timeout=10)
    unseen = [t for t in (settings.input_topic, settings.output_topic, settings.dlq_topic)
              if t != NO_OUTPUT and (t not in meta.topics or meta.topics[t].error is not None)]
    refused = []
    for topic in unseen:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        error = found.error if found is not None else None
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            refused.append(topic)
    if refused:
        raise ConfigError(f"the broker refused this principal access to topic(s) {', '.join(refused)} "
                          "(TOPIC_AUTHORIZATION_FAILED): grant the ACLs of docs/operations.md (Describe and Read on "
                          "the input topic; Describe, Write and DescribeConfigs on the output and DLQ topics)")
    missing = [t for t in unseen if t not in refused]
    if missing:
        raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on {settings.kafka_bootstrap_servers}: "
                          "create them, or fix EMBEDSTREAM_INPUT_TOPIC / _OUTPUT_TOPIC / _DLQ_TOPIC")


def load_embedder(settings: Settings, spec: ModelSpec | None = None) -> Embedder:
    """The model of ``spec`` (one of EMBEDSTREAM_MODELS), else of EMBEDSTREAM_MODEL and its neighbours:
    at int8 on a CPU built without torch where it can be (``worker.embedding.lite``), else loaded whole."""
    from worker.embedding.lite import lite_model
    from worker.embedding.sentence import SentenceTransformerEmbedder

    if spec is not None:
        model, precision, device = spec.path, spec.precision or settings.precision, spec.device or settings.device
        given = dict(document_prompt=spec.document_prompt, query_prompt=spec.query_prompt,
                     truncate_dim=spec.truncate_dim, sparse=SparseMode.of(spec.sparse or settings.sparse))
    else:
        model, precision, device = settings.model, settings.precision, settings.device
        given = dict(document_prompt=settings.document_prompt, query_prompt=settings.query_prompt,
                     truncate_dim=settings.truncate_dim, sparse=SparseMode.of(settings.sparse))
    return (lite_model(model, precision, device, **given)  # type: ignore[arg-type]
            or SentenceTransformerEmbedder(model, precision, device, **given))  # type: ignore[arg-type]


def load_models(settings: Settings, embedder: Embedder | None = None) -> ModelSet:
    """The worker's models: ``embedder`` alone when given (tests, the bench), the set of
    EMBEDSTREAM_MODELS, else the one model of EMBEDSTREAM_MODEL. Raises ConfigError."""
    if embedder is None and settings.models is not None:
        return ModelSet(parse_models(settings.models), lambda spec: load_embedder(settings, spec),
                        settings.model_memory_mb)
    embedder = with_sparse(embedder, settings.sparse) if embedder is not None else load_embedder(settings)
    embedder.warmup()
    return ModelSet.single(embedder)


def with_sparse(embedder: Embedder, setting: str) -> Embedder:
    """A given model (tests, the bench) with EMBEDSTREAM_SPARSE applied: unchanged when the setting is
    off or already the model's; a shallow copy writing BM25 otherwise. A learned sparse model cannot
    be added to a loaded one: ConfigError."""
    mode = SparseMode.of(setting)
    if mode == sparse_modes.OFF or mode == embedder.sparse:
        return embedder
    if mode.learned:
        raise ConfigError(f"EMBEDSTREAM_SPARSE={setting!r}: the model given was loaded without that sparse model; "
                          "load it with sparse= set")
    out = copy.copy(embedder)
    out.sparse = mode
    return out


def inflight_limit(settings: Settings, models: ModelSet) -> int:
    """Batches queued or running before the polling thread stops consuming:
    EMBEDSTREAM_MAX_INFLIGHT_BATCHES for each model the worker serves. A group of batches is split by
    model, each model's part in a call of its own; so each model's call holds what a one-model
    worker's would, rather than a share of it (a model called on half a group cuts more, smaller
    forward passes: two models at int8 here, 3,000 S2 documents interleaved, six alternating runs
    each, embedded 323 docs/s with 8 batches in flight against 381 with 16, where each model alone
    ran the same at both)."""
    return settings.max_inflight_batches * len(models.handles)


def open_cache(settings: Settings, embedder: Embedder) -> RedisCache | None:
    if settings.redis_url is None:
        log.info("EMBEDSTREAM_REDIS_URL unset: running without the cache")
        return None
    cache = RedisCache(settings.redis_url.get_secret_value(), embedder.cache_id, embedder.dim,
                       settings.cache_ttl_seconds, settings.redis_timeout_ms,
                       values=WITH_SPARSE if embedder.sparse.learned else VECTORS)
    if cache.get_many(["startup-probe"]) == [None] and cache.errors:
        log.warning("Redis did not answer at start-up; running without hits until it does")
    return cache


def open_registry(settings: Settings) -> SchemaRegistry | None:
    """The schema registry client when ``EMBEDSTREAM_SCHEMA_REGISTRY_URL`` is set. An unreachable
    registry is a warning here: framed records wait for it (the loop holds them), they are never
    dead-lettered for it."""
    if settings.schema_registry_url is None:
        return None
    registry = SchemaRegistry(client_conf(settings.schema_registry_url, settings.schema_registry),
                              DOCUMENT_SCHEMA_TEXT)
    try:
        subjects = registry.client.get_subjects()
        log.info("schema registry %s: %d subjects", registry.url, len(subjects))
    except SchemaRegistryError as exc:
        if exc.http_status_code in (401, 403):
            raise ConfigError(f"the schema registry at {registry.url} refused our credentials ({exc}): fix "
                              "EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO or the bearer settings") from None
        log.warning("schema registry %s answered %s; framed records wait until it answers", registry.url, exc)
    except Exception as exc:
        log.warning("schema registry %s does not answer (%r); framed records wait until it does", registry.url, exc)
    return registry


def serve_metrics(settings: Settings, health: metrics.Health) -> int | None:
    """Serve /metrics, /healthz and /readyz on the metrics port (``auto``: one the system picks);
    returns the port, None when off."""
    if not settings.metrics_port:
        return None
    try:
        server = metrics.serve(0 if settings.metrics_port == "auto" else settings.metrics_port, health,
                               settings.metrics_host)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {settings.metrics_host} port {settings.metrics_port} ({exc}): "
                          "set EMBEDSTREAM_METRICS_PORT to a free port, auto, or 0 to turn it off, and "
                          "EMBEDSTREAM_METRICS_HOST to an address of this host") from None
    port = server.server_address[1]
    log.info("metrics on port %d of %s (/metrics, /healthz, /readyz)", port, settings.metrics_host)
    return port


def group_session(s: Settings) -> tuple[float, float]:
    """``(session, heartbeat)`` in seconds as the group coordinator applies them to this member: the
    client's properties under the classic protocol; under KIP-848 the broker's (the group's
    ``consumer.session.timeout.ms``), never longer than what the client's properties state, since
    the fence's lease must end before the coordinator could hand the partitions on."""
    session_ms = int(s.kafka.get("session.timeout.ms", 45000))
    heartbeat_ms = int(s.kafka.get("heartbeat.interval.ms", 3000))
    if s.group_protocol == "consumer":
        told = group_session_ms(s.kafka_common(), s.group_id)
        session_ms = min(session_ms, told) if told else session_ms
        heartbeat_ms = min(heartbeat_ms, session_ms // 3)
        log.info("group protocol consumer (KIP-848): a session of %d ms bounds the fence's lease", session_ms)
    return session_ms / 1000, heartbeat_ms / 1000


def input_topic_ids(s: Settings) -> dict[str, str]:
    """The input topic's id for the version guard (``worker.steps.writing.versions``); without one,
    a warning at start-up says what the guard falls back to and what that costs."""
    ids = topic_ids(s.kafka_common(), [s.input_topic])
    if s.input_topic in ids:
        log.info("input topic %s has id %s (the version guard's source)", s.input_topic, ids[s.input_topic])
    else:
        log.warning("the broker gave no id for topic %r: the version guard compares offsets by topic name. If the "
                    "topic is deleted and re-created, its records start again at offset 0 and count as older than "
                    "the rows the old topic wrote: updates of those documents are skipped (counted as superseded) "
                    "until their offsets pass the old ones. Use a broker with topic ids (Kafka 2.8+), or clear the "
                    "collection when you re-create the topic", s.input_topic)
    return ids


#: The smallest record limit the worker runs with: a dead letter's own headers take up to ~6 KB.
MIN_RECORD_LIMIT = 16_384


def topic_limits(s: Settings) -> TopicLimits:
    """The largest record the output and DLQ topics take: their ``max.message.bytes`` where the
    broker tells it, bounded by the producer's ``message.max.bytes`` (EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES)."""
    try:
        producer_max = int(s.kafka.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
    except ValueError:
        raise ConfigError(f"EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES={s.kafka['message.max.bytes']!r} is not a "
                          "number of bytes") from None
    told = topic_max_bytes(s.kafka_common(), [t for t in (s.output_topic, s.dlq_topic) if t != NO_OUTPUT])
    limits = TopicLimits.of(producer_max, told.get(s.output_topic), told.get(s.dlq_topic))
    if s.output_topic == NO_OUTPUT:  # a backfill that publishes nothing: no output record to fit
        limits = replace(limits, output=sys.maxsize)
    for topic, limit in ((s.output_topic, limits.output), (s.dlq_topic, limits.dlq)):
        if limit < MIN_RECORD_LIMIT:
            raise ConfigError(f"topic {topic} takes records of at most {limit:,} bytes (its max.message.bytes, or "
                              f"EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES): a dead letter's own headers need more; allow "
                              f"at least {MIN_RECORD_LIMIT:,}")
    log.info("largest records: %d bytes to %s, %d to %s", limits.output, s.output_topic, limits.dlq, s.dlq_topic)
    return limits


def require_connections(s: Settings) -> None:
    """ConfigError unless the broker and Milvus are named (they have no default)."""
    try:
        s.require("kafka_bootstrap_servers", "milvus_uri")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def open_stores(s: Settings, models: ModelSet, store_factory: Callable[[Settings, str], MilvusStore] | None = None,
                ) -> tuple[dict[str, MilvusStore], dict[str, RedisCache | None]]:
    """Each model's collection (made ready behind its alias, its canary compared: ``worker.assembly.canaries``;
    or ``store_factory``'s stand-in) and cache."""
    stores, caches = {}, {}
    for name, model in models.handles.items():
        if store_factory is None:
            setting = models.specs[name].path if s.models is not None else s.model
            collection = collection_to_write(s, name, model, setting)
        else:
            collection = collection_of(s, name, model)
        if store_factory is None:
            stores[name] = open_milvus(s, MilvusStore, collection)
            admin = MilvusAdmin.sharing(stores[name])

            def prepare(admin: MilvusAdmin = admin, alias: str = alias_of(s, name), model: Embedder = model) -> None:
                admin.prepare(alias, model.model_id, model.dim, model.sparse.kind)
                if s.group_type == "share":
                    admin.ensure_claims()  # its members claim the versions they write (writing.ordering)
                check_canary(admin, model)  # before a row is written: the model makes what the collection holds

            prepare()
            stores[name].recover = prepare  # a collection dropped under the worker is made again
        else:
            stores[name] = store_factory(s, collection)
        caches[name] = open_cache(s, model)
    return stores, caches


def build_worker(settings: Settings, embedder: Embedder | None = None,
                 on_progress: Callable[[RunStats], None] | None = None,
                 store_factory: Callable[[Settings, str], MilvusStore] | None = None,
                 dead_letters: bool = True, stats: RunStats | None = None, startup: StartClock | None = None,
                 model_gate: LaneGate | None = None) -> Member:
    """Check the settings against the real systems, open them, and assemble the worker around the
    chain of ``worker.assembly.chain.build_chain``. ``store_factory(settings, collection)`` stands in for
    Milvus (the bench's instant sink); ``dead_letters=False``: the records the live worker dead-letters
    alike are skipped (a migration's backfill), those only its own model or collection refuse are not;
    ``stats``: the run's counters (the bench's also read the CPU clock); ``startup``: the process's
    start-up clock (``embedstream run``), read out at the first assignment; ``model_gate``: the lane's
    way through the gate of a worker with a backfill lane, every stage's (``worker.assembly.lanes``). Raises
    ConfigError."""
    s, clock = settings, startup or StartClock()  # a caller's clock is read out at the first assignment
    clock.mark("python, imports and settings")
    require_connections(s)
    check_broker(s.kafka_common())
    check_topics(s)
    clock.mark("Kafka and its topics")
    health = metrics.Health(s.healthz_max_tick_age_seconds)
    # A consumer group's member joins while its models load (worker.core.early_join); a share
    # group's member joins at its first poll.
    side = groups.join(s, health)
    try:
        return assemble(s, clock, side, embedder, store_factory, dead_letters, health=health, startup=startup,
                        on_progress=on_progress, stats=stats, model_gate=model_gate)
    except BaseException:
        side.abandon()
        raise


def assemble(s: Settings, clock: StartClock, side: groups.Side, embedder: Embedder | None,
             store_factory: Callable[[Settings, str], MilvusStore] | None, dead_letters: bool, *,
             health: metrics.Health, startup: StartClock | None, on_progress: Callable[[RunStats], None] | None,
             stats: RunStats | None, model_gate: LaneGate | None = None) -> Member:
    """``build_worker`` past the checks: the models, the stores, the delivery and the chain, around
    the group's ``side`` (``worker.assembly.groups``), with the member's health, start-up clock,
    progress call, counters and way through the model gate."""
    models = load_models(s, embedder)
    log.info("models: %s", describe(models))
    clock.mark("models")
    stores, caches = open_stores(s, models, store_factory)
    clock.mark("Milvus and Redis")
    try:
        return _assemble_on(s, side, models, stores, caches, dead_letters, health=health, startup=startup,
                            on_progress=on_progress, stats=stats, model_gate=model_gate)
    except BaseException:  # a refused start (the registry's credentials, a topic's limit): nothing was written
        for store in stores.values():
            store.close()
        for cache in caches.values():
            if cache is not None:
                cache.close()
        raise


def _assemble_on(s: Settings, side: groups.Side, models: ModelSet, stores: dict[str, MilvusStore],
                 caches: dict[str, RedisCache | None], dead_letters: bool, *, health: metrics.Health,
                 startup: StartClock | None, on_progress: Callable[[RunStats], None] | None, stats: RunStats | None,
                 model_gate: LaneGate | None) -> Member:
    """``assemble`` once the models and stores are open: the metrics server, the fence, the delivery
    (closed again when what follows fails) and the chain."""
    heap.settle()  # the models' objects out of the collector's walks (worker.process.heap)
    heap.keep_pages()  # a group's megabyte buffers reuse the heap's pages (worker.process.heap)
    health.model_loaded = True
    metrics_port = serve_metrics(s, health)
    if any(m.device == "cuda" for m in models.handles.values()):
        register_gpu_metrics("cuda")
    session_s, heartbeat_s = group_session(s)
    fence = Fence(lease_seconds(session_s, heartbeat_s))
    # A record still queued in librdkafka when the process froze must time out on waking rather than
    # be sent after the new owner's records (worker/core/fence.py): deliveries never outlast the lease.
    delivery_timeout_s = min(s.kafka_timeout_seconds, fence.lease_s)
    max_inflight = inflight_limit(s, models)
    log.info("up to %d batches in flight (%d a model served)", max_inflight, s.max_inflight_batches)
    delivery = side.durability(s, max_inflight, delivery_timeout_s)
    try:
        chain = build_chain(s, delivery, models, caches, stores, fence, input_topic_ids(s), open_registry(s),
                            topic_limits(s), dead_letters=dead_letters,
                            lookup_ids=lambda: topic_ids(s.kafka_common(), [s.input_topic]),
                            max_deliveries=side.max_deliveries, model_gate=model_gate,
                            claim_expiry_s=(claim_expiry(side.lock_s, s.milvus_timeout_seconds)
                                            if isinstance(side, groups.ShareGroup) else None))
    except BaseException:
        delivery.close()
        raise
    worker = side.member(s, chain, groups.MemberParts(health, max_inflight, session_s, startup, on_progress, stats))
    worker.metrics_port = metrics_port
    return worker
