"""``embedstream lag --serve``: a share group's backlog over HTTP, for KEDA and Prometheus.

KEDA's Kafka scaler cannot read a share group, and a worker cannot report the backlog that should
wake it from zero replicas. So a small process of its own (the chart's ``backlog`` Deployment) reads
the backlog every ``interval`` seconds (:func:`connectors.share_backlog.group_backlog`) and serves:

- ``/backlog``: JSON ``{"backlog": N, "partitions": [...], "group", "topic", "age_seconds"}``, for KEDA's
  ``metrics-api`` scaler (``valueLocation: backlog``); 503 while the last read failed, so KEDA counts a
  failure (and holds its fallback replicas) instead of scaling on a stale number;
- ``/metrics``: ``embedstream_share_backlog{group,topic,partition}``,
  ``embedstream_share_topic_backlog{group,topic}`` and ``embedstream_share_backlog_read_failures_total``,
  for a Prometheus trigger or a dashboard;
- ``/healthz``: 200 while reads succeed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from connectors.share_backlog import PartitionBacklog, as_json
from worker.process.answer_server import AnswerServer, serve_answers

log = logging.getLogger(__name__)


class BacklogExporter:
    """Reads the backlog with ``read`` every ``interval`` seconds on a daemon thread and keeps the
    last answer; :meth:`serve` answers HTTP from it."""

    def __init__(self, read: Callable[[], list[PartitionBacklog]], group: str, topic: str,
                 interval: float = 10.0) -> None:
        self.read, self.group, self.topic, self.interval = read, group, topic, interval
        self.last: list[PartitionBacklog] | None = None
        self.read_at = 0.0
        self.error: str | None = "not read yet"
        self.registry = CollectorRegistry()
        self.by_partition = Gauge("embedstream_share_backlog", "records of the topic the share group has not "
                                  "finished, per partition", ["group", "topic", "partition"], registry=self.registry)
        self.total = Gauge("embedstream_share_topic_backlog", "records of the topic the share group has not "
                           "finished", ["group", "topic"], registry=self.registry)
        self.failures = Counter("embedstream_share_backlog_read_failures", "backlog reads that failed",
                                registry=self.registry)
        self._stop = threading.Event()

    def refresh(self) -> None:
        """Read once; keep the answer, or the error (and count it)."""
        try:
            found = self.read()
        except Exception as exc:  # any failure is served as a 503 until a read succeeds again
            self.error = f"{type(exc).__name__}: {exc}"
            self.failures.inc()
            log.warning("backlog of share group %s not read: %s", self.group, self.error)
            return
        self.last, self.read_at, self.error = found, time.monotonic(), None
        for p in found:
            self.by_partition.labels(self.group, self.topic, str(p.partition)).set(p.backlog)
        self.total.labels(self.group, self.topic).set(sum(p.backlog for p in found))

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
        if path.startswith("/backlog"):
            if self.error is not None or self.last is None:
                failed = {"error": self.error, "group": self.group, "topic": self.topic}
                return 503, "application/json", json.dumps(failed).encode()
            body = {**as_json(self.last), "group": self.group, "topic": self.topic,
                    "age_seconds": round(time.monotonic() - self.read_at, 1)}
            return 200, "application/json", json.dumps(body).encode()
        if path.startswith("/healthz"):
            ok = self.error is None
            return (200 if ok else 503), "text/plain", (b"ok\n" if ok else f"{self.error}\n".encode())
        return 404, "text/plain", b"not found: /backlog, /metrics, /healthz\n"

    def serve(self, port: int, host: str = "0.0.0.0") -> AnswerServer:
        """Start reading and serving on daemon threads; returns the server."""
        threading.Thread(target=self.run, name="backlog", daemon=True).start()
        return serve_answers(port, self.answer, host, name="backlog-http")
