"""``embedstream lag --serve``: a group's backlog over HTTP, for KEDA, Prometheus and the alerts.

A worker cannot report the backlog that should wake it from zero replicas, nor page when none is
running. So a small process of its own (the chart's ``backlog`` Deployment) reads the group's
backlog every ``interval`` seconds and serves it, in one of two kinds (:data:`SHARE`, :data:`GROUP`):

- a share group (KEDA's Kafka scaler cannot read one): the records it has not finished
  (:func:`connectors.share_backlog.group_backlog`); ``/backlog`` as JSON
  ``{"backlog": N, "partitions": [...], "group", "topic", "age_seconds"}`` for KEDA's ``metrics-api``
  scaler (``valueLocation: backlog``); ``/metrics``: ``embedstream_share_backlog{group,topic,partition}``,
  ``embedstream_share_topic_backlog{group,topic}``, ``embedstream_share_backlog_read_failures_total``;
- a consumer group (KEDA reads its lag itself; the exporter gives the alerts a series while no worker
  runs): its lag as KEDA counts it (:func:`connectors.lag.group_lag`); ``/lag`` as JSON
  ``{"total_lag": N, "partitions": [...], "group", "topic", "age_seconds"}``; ``/metrics``:
  ``embedstream_group_lag{group,topic,partition}``, ``embedstream_group_topic_lag{group,topic}``,
  ``embedstream_group_lag_read_failures_total``.

The JSON path answers 503 while the last read failed, so KEDA counts a failure (and holds its
fallback replicas) instead of scaling on a stale number; ``/healthz`` is 200 while reads succeed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from connectors import lag, share_backlog
from worker.process.answer_server import AnswerServer, serve_answers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    """What one kind of group's exporter serves: its metric names and meanings, its JSON path, and
    how a read's partitions give their backlog and their JSON."""

    group: str  # how the log names the group
    metric: str  # per partition; the topic's total and the failures counter are named after it
    topic_metric: str
    meaning: str
    path: str
    value: Callable[[Any], int]
    as_json: Callable[[list], dict]


SHARE = Kind("share group", "embedstream_share_backlog", "embedstream_share_topic_backlog",
             "records of the topic the share group has not finished", "/backlog", lambda p: p.backlog,
             share_backlog.as_json)
GROUP = Kind("consumer group", "embedstream_group_lag", "embedstream_group_topic_lag",
             "records of the topic past the consumer group's committed offsets, as KEDA's Kafka scaler counts them",
             "/lag", lambda p: p.lag, lag.as_json)


class BacklogExporter:
    """Reads the backlog with ``read`` every ``interval`` seconds on a daemon thread and keeps the
    last answer; :meth:`serve` answers HTTP from it. ``kind``: :data:`SHARE` or :data:`GROUP`."""

    def __init__(self, read: Callable[[], list], group: str, topic: str, interval: float = 10.0,
                 kind: Kind = SHARE) -> None:
        self.read, self.group, self.topic, self.interval, self.kind = read, group, topic, interval, kind
        self.last: list | None = None
        self.read_at = 0.0
        self.error: str | None = "not read yet"
        self.registry = CollectorRegistry()
        self.by_partition = Gauge(kind.metric, f"{kind.meaning}, per partition", ["group", "topic", "partition"],
                                  registry=self.registry)
        self.total = Gauge(kind.topic_metric, kind.meaning, ["group", "topic"], registry=self.registry)
        self.failures = Counter(f"{kind.metric}_read_failures", "backlog reads that failed", registry=self.registry)
        self._stop = threading.Event()

    def refresh(self) -> None:
        """Read once; keep the answer, or the error (and count it)."""
        try:
            found = self.read()
        except Exception as exc:  # any failure is served as a 503 until a read succeeds again
            self.error = f"{type(exc).__name__}: {exc}"
            self.failures.inc()
            log.warning("backlog of %s %s not read: %s", self.kind.group, self.group, self.error)
            return
        self.last, self.read_at, self.error = found, time.monotonic(), None
        for p in found:
            self.by_partition.labels(self.group, self.topic, str(p.partition)).set(self.kind.value(p))
        self.total.labels(self.group, self.topic).set(sum(self.kind.value(p) for p in found))

    def run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``."""
        if path.startswith("/metrics"):
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path.startswith(self.kind.path):
            if self.error is not None or self.last is None:
                failed = {"error": self.error, "group": self.group, "topic": self.topic}
                return 503, "application/json", json.dumps(failed).encode()
            body = {**self.kind.as_json(self.last), "group": self.group, "topic": self.topic,
                    "age_seconds": round(time.monotonic() - self.read_at, 1)}
            return 200, "application/json", json.dumps(body).encode()
        if path.startswith("/healthz"):
            ok = self.error is None
            return (200 if ok else 503), "text/plain", (b"ok\n" if ok else f"{self.error}\n".encode())
        return 404, "text/plain", f"not found: {self.kind.path}, /metrics, /healthz\n".encode()

    def serve(self, port: int, host: str = "0.0.0.0") -> AnswerServer:
        """Start reading and serving on daemon threads; returns the server."""
        threading.Thread(target=self.run, name="backlog", daemon=True).start()
        return serve_answers(port, self.answer, host, name="backlog-http")
