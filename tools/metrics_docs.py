"""``docs/metrics.md``, generated from the metrics the worker declares (``worker.process.metrics``,
``worker.process.gpu_metrics``, the Milvus writer's in ``connectors.milvus.writes``): each series'
name as Prometheus shows it, its type, labels and meaning. ``make docs`` writes it;
``tests/unit/test_metrics_docs.py`` fails when the page and the code differ. Run:
``python -m tools.metrics_docs [--check]``."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from connectors.milvus import writes
from tools.generated_page import page_main
from worker.process import gpu_metrics, metrics

PAGE = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def _row(value: MetricWrapperBase) -> tuple[str, str, tuple[str, ...], str]:
    name = value._name + ("_total" if value._type == "counter" else "")
    return name, value._type, tuple(value._labelnames), value._documentation


def declared() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Every metric of the worker: (name as scraped, type, labels, help), by name."""
    out = []
    for value in [*vars(metrics).values(), *vars(writes).values()]:
        value = value.metric if isinstance(value, metrics.LiveLane) else value
        if isinstance(value, MetricWrapperBase):
            out.append(_row(value))
        elif isinstance(value, metrics.BatchHistogram):
            out.append((value.name, "histogram", (), value.documentation))
    out += [(name, "gauge", ("gpu",), text) for name, text in gpu_metrics.GAUGES.items()]
    return sorted(out)


def exporter_declared(kind: str = "share") -> list[tuple[str, str, tuple[str, ...], str]]:
    """The metrics of ``embedstream lag --serve`` (``worker.process.backlog_server``) for a group of
    ``kind`` (share or consumer), by name."""
    from worker.process.backlog_server import GROUP, SHARE, BacklogExporter

    exporter = BacklogExporter(list, "group", "topic", kind=SHARE if kind == "share" else GROUP)
    return sorted(_row(v) for v in vars(exporter).values() if isinstance(v, MetricWrapperBase))


def _table(rows: list[tuple[str, str, tuple[str, ...], str]]) -> list[str]:
    out = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for name, kind, labels, text in rows:
        out.append(f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | "
                   f"{text.replace('|', '/')} |")
    return out


def page() -> str:
    """The whole page, as ``docs/metrics.md`` must read."""
    out = ["# Metrics", "",
           "Generated from `worker/process/metrics.py`, `worker/process/gpu_metrics.py` and "
           "`connectors/milvus/writes.py` by `make docs` (a test fails when the two differ). Served on "
           "`EMBEDSTREAM_METRICS_PORT` at `/metrics` (Prometheus' text format), beside `/healthz` (the polling "
           "loop turned lately) and `/readyz` (model loaded, partitions assigned). A histogram is scraped as "
           "`<name>_bucket`, `_count` and `_sum`. With `run --processes N`, process i serves on the port + i.", "",
           *_table(declared()), "",
           "## A share group's backlog", "",
           "Served by `embedstream lag --serve PORT` (`worker/process/backlog_server.py`; the chart's "
           "`<release>-backlog` Deployment in share mode) at `/metrics`, beside `/backlog` (JSON, for KEDA's "
           "`metrics-api` trigger) and `/healthz` (the last read succeeded).", "",
           *_table(exporter_declared()), "",
           "## A consumer group's lag, with no worker running", "",
           "Served by `embedstream lag --serve PORT` for a consumer group (the chart's `<release>-backlog` "
           "Deployment when `lagExporter.enabled`): the lag as KEDA's Kafka scaler counts it, read every "
           "`--interval` seconds, so the lag alerts have a series while KEDA holds the workers at zero. "
           "`/lag` answers it as JSON. Its names are not the workers' `embedstream_consumer_lag`: a sum over "
           "the release's pods counts each record once.", "",
           *_table(exporter_declared("consumer"))]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(PAGE, page, "Write docs/metrics.md from the worker's metric declarations", argv)


if __name__ == "__main__":
    sys.exit(main())
