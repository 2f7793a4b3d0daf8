"""Every metric of the worker, declared once with its meaning, and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from worker.process.answer_server import AnswerServer, serve_answers


class BatchHistogram:
    """A Prometheus histogram fed a batch of observations at once (``observe_many``): for a value per
    record, where ``Histogram.observe`` costs a lock, a search and an increment per value (1.1 µs
    of the polling thread a document, with the rest of ``RunStats.account``). Exposed as
    prometheus_client exposes a histogram: ``_bucket`` (cumulative, ``le``), ``_count``, ``_sum``."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry=REGISTRY) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = np.array([*buckets, np.inf])
        self._counts = np.zeros(len(self._bounds), np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values) -> None:
        """Count each of ``values`` (finite numbers) in the bucket of the first bound ≥ it."""
        v = np.asarray(values, dtype=np.float64)
        if not v.size:
            return
        counts = np.bincount(np.searchsorted(self._bounds, v, side="left"), minlength=len(self._bounds))
        with self._lock:
            self._counts += counts
            self._sum += float(v.sum())

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def describe(self) -> list:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> list:
        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum
        return [HistogramMetricFamily(self.name, self.documentation, sum_value=total, buckets=[
            (floatToGoString(b), int(c)) for b, c in zip(self._bounds, cumulative)])]


class _Nowhere:
    """What a quiet thread's metric calls reach: every method takes anything and does nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self


_NOWHERE = _Nowhere()
#: Marks the threads of a backfill lane's member (``worker.assembly.lanes``).
_lane = threading.local()


def quiet_this_thread() -> None:
    """The calling thread (a backfill lane's polling thread) writes no :class:`LiveLane` metric."""
    _lane.backfill = True


class LiveLane:
    """A metric that describes *the* member of the process, read on its polling thread: its records'
    outcomes and ages, its partitions, lag, pauses, rebalances, commits and batches in flight. A
    backfill lane (``worker.assembly.lanes``) runs a second member in the process, reading the topic
    from its start: on its polling thread every call is a no-op, so these stay the live lane's (a
    backfill's hours-old records would fill the end-to-end histogram; its lag would take the live
    member's series of the same partition). ``metric`` is the wrapped one."""

    def __init__(self, metric) -> None:
        self.metric = metric

    def __getattr__(self, name: str):
        if getattr(_lane, "backfill", False):
            return getattr(_NOWHERE, name)
        return getattr(self.metric, name)


_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Records by final outcome: embedded | deleted | dead_lettered | superseded (Milvus held a newer version).
MESSAGES = LiveLane(Counter("embedstream_messages_total", "Input records by final outcome", ["outcome"]))
# Records not written because this member may have lost their partition (its new owner redoes them).
FENCED_RECORDS = Counter("embedstream_fenced_records_total", "Records left to a partition's new owner")
# Records per batch handed to the pipeline.
BATCH_SIZE = Histogram("embedstream_batch_size", "Records per batch", buckets=_BATCH_BUCKETS)
# Real (unpadded) tokens per batch.
BATCH_TOKENS = Histogram("embedstream_batch_tokens", "Tokens per batch", buckets=_TOKEN_BUCKETS)
# Wall time of one call to the model (the cache misses of one group of batches).
EMBED_SECONDS = Histogram("embedstream_embed_seconds", "Model time per call (one group of batches)",
                          buckets=_SECONDS)
# Record timestamp on the input topic → its output acknowledged.
END_TO_END_SECONDS = LiveLane(BatchHistogram(
    "embedstream_end_to_end_seconds", "Input record timestamp to sinks confirmed", buckets=_SECONDS))
# Cache lookups: hit | miss | error.
CACHE_REQUESTS = Counter("embedstream_cache_requests_total", "Cache lookups by result", ["result"])
# Wall time of each sink write, once per group of batches: milvus | output (output and DLQ records).
SINK_SECONDS = Histogram("embedstream_sink_seconds", "Sink write time per group of batches", ["sink"],
                         buckets=_SECONDS)
# Dead-lettered records by reason.
DLQ_MESSAGES = LiveLane(Counter("embedstream_dlq_messages_total", "Records sent to the dead-letter topic", ["reason"]))
# Lag per assigned partition, from librdkafka's statistics (high watermark − committed offset).
CONSUMER_LAG = LiveLane(Gauge("embedstream_consumer_lag", "Consumer lag per partition", ["topic", "partition"]))
# Partitions currently paused for back-pressure or an outage.
PAUSED_PARTITIONS = LiveLane(Gauge("embedstream_paused_partitions", "Partitions paused by back-pressure"))
# Tokens the model ran: real (the texts') | padded (including padding); real ÷ padded = padding efficiency.
MODEL_TOKENS = Counter("embedstream_model_tokens_total", "Tokens through the model, real and padded", ["kind"])
# Constant 1, labelled with the model in use.
MODEL_LOADS = Counter("embedstream_model_loads_total", "Models loaded (at start-up and after an eviction)", ["model"])

MODEL_EVICTIONS = Counter("embedstream_model_evictions_total",
                          "Models unloaded to make room under EMBEDSTREAM_MODEL_MEMORY_MB", ["model"])

MODEL_DOCUMENTS = Counter("embedstream_model_documents_total", "Documents embedded and written, by model", ["model"])

MODEL_INFO = Gauge("embedstream_model_info", "The model in use", ["model", "precision", "device"])
MODEL_LOAD_SECONDS = Histogram("embedstream_model_load_seconds", "Time to load a model and warm it up", ["model"],
                               buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300))
# The group: rebalance events this member saw (assigned | revoked | lost), what it owns, its commits.
REBALANCES = LiveLane(Counter("embedstream_rebalances_total", "Rebalance events of this member", ["event"]))
ASSIGNED_PARTITIONS = LiveLane(Gauge("embedstream_assigned_partitions", "Input partitions this member owns"))
COMMIT_SECONDS = LiveLane(Histogram(
    "embedstream_commit_seconds", "Time to commit stored offsets, or to send a share group's acknowledgements "
    "(sync: until the broker answered; async: to hand them over)", ["mode"], buckets=_SECONDS))
COMMIT_FAILURES = LiveLane(Counter("embedstream_commit_failures_total", "Commits (or sends of a share group's "
                          "acknowledgements) that failed (retried by the next)"))
def _release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedstream")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown"


# Constant 1, labelled with the running release.
BUILD_INFO = Gauge("embedstream_build_info", "The embedstream release running", ["version"])
BUILD_INFO.labels(_release()).set(1)
# Transient failures of outside systems, retried: kafka | milvus.
RETRIES = Counter("embedstream_retries_total", "Transient failures retried", ["system"])
# Long documents: how they were split (chunking on) or cut (chunking off).
CHUNKS_PER_DOCUMENT = BatchHistogram("embedstream_chunks_per_document",
                                     "Chunks per document longer in characters than one chunk's tokens",
                                     buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512))
DOCUMENTS_CHUNKED = Counter("embedstream_documents_chunked_total", "Documents split into more than one chunk")
DOCUMENTS_TRUNCATED = Counter("embedstream_documents_truncated_total",
                              "Documents cut to the model's max length (EMBEDSTREAM_CHUNKING=off)")
TOKENS_TRUNCATED = Counter("embedstream_tokens_truncated_total", "Tokens cut off by truncation (chunking off)")
# Batches waiting for or inside the pipeline.
INFLIGHT_BATCHES = LiveLane(Gauge("embedstream_inflight_batches", "Batches in the pipeline"))
# Share groups (EMBEDSTREAM_GROUP_TYPE=share): what a member did with the records it was delivered.
# Acknowledgements by type: accept (written or dead-lettered) | release (left unwritten after a stall:
# delivered again) | reject (never sent by this worker: a record that cannot succeed is dead-lettered
# and accepted). A delivery count above 1: the record came back (a crash, a lock that ran out, a release).
SHARE_ACKNOWLEDGEMENTS = Counter("embedstream_share_acknowledgements_total",
                                 "Records a share-group member acknowledged, by type", ["type"])
SHARE_REDELIVERIES = Counter("embedstream_share_redeliveries_total",
                             "Records delivered to this member that had been delivered before (delivery count > 1)")
SHARE_LOCK_EXPIRIES = Counter("embedstream_share_lock_expiries_total",
                              "Records acknowledged after their acquisition lock ran out (the group may have "
                              "delivered them again meanwhile)")
SHARE_ACK_SECONDS = BatchHistogram("embedstream_share_ack_seconds",
                                   "Time from a record's delivery (the poll) to its acknowledgement",
                                   buckets=_SECONDS)


def record_lag_from_stats(stats_json: str) -> None:
    """librdkafka ``stats_cb`` → ``embedstream_consumer_lag`` (its ``consumer_lag`` per partition)."""
    try:
        stats = json.loads(stats_json)
    except ValueError:
        return
    for topic, t in stats.get("topics", {}).items():
        for pid, p in t.get("partitions", {}).items():
            if pid == "-1":
                continue
            if p.get("desired") is False:  # revoked: librdkafka still reports it a while
                forget_lag(topic, [int(pid)])
                continue
            if not p.get("fetch_state") or p.get("fetch_state") == "none":
                continue
            lag = p.get("consumer_lag", -1)
            if lag >= 0:
                CONSUMER_LAG.labels(topic, pid).set(lag)


def forget_lag(topic: str, partitions: Iterable[int]) -> None:
    """Drop the lag series of partitions this member no longer owns: their new owner reports them,
    and a sum over the members (the dashboard's, KEDA's view) must count each partition once."""
    for p in partitions:
        try:
            CONSUMER_LAG.remove(topic, str(p))
        except KeyError:
            pass


class Health:
    """What /healthz and /readyz report. The loop calls ``tick()`` each turn."""

    def __init__(self, max_tick_age: float = 60.0) -> None:
        self.max_tick_age = max_tick_age
        self.last_tick = time.monotonic()
        self.model_loaded = False
        self.assigned = 0
        #: monotonic time of the last error librdkafka reported for the cluster (0: never)
        self.last_kafka_error = 0.0

    def on_kafka_error(self, err) -> None:
        """librdkafka ``error_cb``: broker down, transport errors. Remembered so that a worker never
        takes an unreachable cluster for the end of its input."""
        self.last_kafka_error = time.monotonic()

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self.last_tick < self.max_tick_age

    def ready(self) -> bool:
        return self.model_loaded and self.assigned > 0


def serve(port: int, health: Health, host: str = "0.0.0.0") -> AnswerServer:
    """Serve /metrics, /healthz, /readyz on ``host:port`` from a daemon thread; returns the server."""

    def answer(path: str) -> tuple[int, str, bytes]:
        if path.startswith("/metrics"):
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        if path.startswith("/healthz"):
            ok = health.alive()
            return (200 if ok else 503), "text/plain", (b"ok\n" if ok else b"loop stalled\n")
        if path.startswith("/readyz"):
            ok = health.ready()
            return (200 if ok else 503), "text/plain", (
                b"ready\n" if ok else b"not ready (model loading or no partitions assigned)\n")
        return 404, "text/plain", b"not found\n"

    return serve_answers(port, answer, host)
