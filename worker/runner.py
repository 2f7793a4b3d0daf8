"""Build a ready-to-run worker from settings, checking every setting before the first record.

Start-up fails with :class:`ConfigError` (a message that says what to fix) when the broker does
not answer, a topic is missing, the model cannot be loaded, or the Milvus collection holds vectors
of another dim. Redis is optional: an unreachable one is a warning, and the worker runs uncached.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

from connectors.exceptions import ConfigError
from connectors.kafka import check_broker, make_admin, make_consumer, make_producer
from connectors.milvus import MilvusStore
from connectors.redis_cache import RedisCache
from worker import metrics
from worker.embedding.base import Embedder
from worker.loop import RunStats, Worker
from worker.pipeline import Pipeline
from worker.settings import Settings
from worker.steps.dlq_limit import DlqLimit
from worker.steps.embed import EmbedStep
from worker.steps.sink import SinkStep

log = logging.getLogger(__name__)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    for noisy in ("httpx", "urllib3", "sentence_transformers", "transformers", "pymilvus"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def check_topics(settings: Settings) -> None:
    meta = make_admin(settings).list_topics(timeout=10)
    missing = [t for t in (settings.input_topic, settings.output_topic, settings.dlq_topic)
               if t not in meta.topics or meta.topics[t].error is not None]
    if missing:
        raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on {settings.kafka_bootstrap_servers}: "
                          "create them, or fix EMBEDSTREAM_INPUT_TOPIC / _OUTPUT_TOPIC / _DLQ_TOPIC")


def load_embedder(settings: Settings) -> Embedder:
    from worker.embedding.sentence import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(settings.model, settings.precision, settings.device)


def open_cache(settings: Settings, embedder: Embedder) -> RedisCache | None:
    if settings.redis_url is None:
        log.info("EMBEDSTREAM_REDIS_URL unset: running without the cache")
        return None
    cache = RedisCache(settings.redis_url.get_secret_value(), embedder.model_id, embedder.dim,
                       settings.cache_ttl_seconds, settings.redis_timeout_ms)
    if cache.get_many(["startup-probe"]) == [None] and cache.errors:
        log.warning("Redis did not answer at start-up; running without hits until it does")
    return cache


def build_worker(settings: Settings, embedder: Embedder | None = None,
                 on_progress: Callable[[RunStats], None] | None = None) -> Worker:
    """Check the settings against the real systems and assemble the worker. Raises ConfigError."""
    try:
        settings.require("kafka_bootstrap_servers", "milvus_uri")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_broker(settings)
    check_topics(settings)
    embedder = embedder or load_embedder(settings)
    metrics.MODEL_INFO.labels(embedder.model_id, embedder.precision, embedder.device).set(1)
    log.info("model %s: dim %d, precision %s, device %s", embedder.model_id, embedder.dim, embedder.precision,
             embedder.device)
    store = MilvusStore(settings.milvus_uri, settings.milvus_collection,
                        settings.milvus_token.get_secret_value() if settings.milvus_token else None,
                        settings.milvus_timeout_seconds)
    store.ensure_collection(embedder.dim)
    cache = open_cache(settings, embedder)
    embedder.warmup()
    health = metrics.Health(settings.healthz_max_tick_age_seconds)
    health.model_loaded = True
    if settings.metrics_port:
        try:
            metrics.serve(settings.metrics_port, health)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on port {settings.metrics_port} ({exc}): set "
                              "EMBEDSTREAM_METRICS_PORT to a free port, or 0 to turn it off") from None
    producer = make_producer(settings)
    sink = SinkStep(settings, store, producer, embedder.model_id, embedder.dim, cache)
    pipeline = Pipeline(EmbedStep(embedder, cache).process, sink.process,
                        backoff_max=settings.retry_backoff_max_seconds, release=sink.close)
    session_ms = int(settings.kafka.get("session.timeout.ms", 45000))
    max_poll_s = int(settings.kafka.get("max.poll.interval.ms", 300_000)) / 1000
    consumer = make_consumer(settings, **{"statistics.interval.ms": 5000,
                                          "stats_cb": metrics.record_lag_from_stats,
                                          "error_cb": health.on_kafka_error})
    return Worker(consumer, settings.input_topic, embedder, pipeline,
                  max_batch_size=settings.max_batch_size, max_batch_tokens=settings.max_batch_tokens,
                  max_batch_wait_ms=settings.max_batch_wait_ms, max_inflight=settings.max_inflight_batches,
                  max_text_bytes=settings.max_text_bytes, max_batch_bytes=settings.max_batch_bytes,
                  shutdown_grace=settings.shutdown_grace_seconds,
                  commit_interval=settings.commit_interval_ms / 1000,
                  join_grace=max(10.0, 2 * session_ms / 1000), health=health, on_progress=on_progress,
                  pause_after=min(5.0, max_poll_s / 3),
                  dlq_limit=DlqLimit(settings.dlq_max_consecutive, settings.dlq_max_ratio, settings.dlq_ratio_window))
