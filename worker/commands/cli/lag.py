"""``embedstream lag``: the group's lag, as KEDA computes it; for a share group its backlog; and
``--serve`` to export either over HTTP (for KEDA's metrics-api scaler, Prometheus and the alerts)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    fail,
    require_or_exit,
    settings_or_exit,
)


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "group_id", "group_type", "metrics_host")
def lag(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    offset_reset_policy: Annotated[str, typer.Option(
        help="How a partition without a committed offset counts, as in KEDA: latest → 1, earliest → its "
        "records (see --keda-version); the chart's keda.offsetResetPolicy is earliest")] = "earliest",
    keda_version: Annotated[str, typer.Option(
        help="Count as this KEDA version does: from 2.21 a partition without a commit under earliest counts "
        "the records it still holds (end − log start); before 2.21, its end offset")] = "2.21",
    scale_to_zero_on_invalid_offset: Annotated[bool, typer.Option(
        help="Count partitions without a committed offset as 0 (KEDA's scaleToZeroOnInvalidOffset)")] = False,
    lag_threshold: Annotated[int | None, typer.Option(
        help="Also show the replicas KEDA would ask for at this lagThreshold", min=1)] = None,
    serve: Annotated[int | None, typer.Option(
        help="Keep reading the lag and serve it on this port until stopped: /metrics for Prometheus and "
        "/healthz; /lag as JSON for a consumer group, /backlog for a share group (KEDA's metrics-api scaler)",
        min=1, max=65535)] = None,
    interval: Annotated[float, typer.Option(help="With --serve: seconds between reads of the lag",
                                            min=1.0)] = 10.0,
    overrides: dict[str, object] | None = None,
) -> None:
    """Per-partition and total lag of the worker's group, computed as KEDA's Kafka scaler computes it
    (end offset − committed offset). For a share group (EMBEDSTREAM_GROUP_TYPE=share), which commits no
    offsets: its backlog, the records the broker says it has not finished (Apache Kafka 4.2+)."""
    from connectors.lag import as_json as lag_json
    from connectors.lag import desired_replicas, keda_counts_retained

    if offset_reset_policy not in ("latest", "earliest"):
        raise fail("--offset-reset-policy must be latest or earliest", 2)
    try:
        retained_only = keda_counts_retained(keda_version)
    except ValueError as exc:
        raise fail(f"--keda-version: {exc}", 2) from None
    s = settings_or_exit(overrides)
    require_or_exit(s, "kafka_bootstrap_servers")
    if s.group_type == "share":
        return share_backlog(s, as_json, lag_threshold, serve, interval)
    read = group_reader(s, offset_reset_policy, scale_to_zero_on_invalid_offset, retained_only)
    if serve is not None:
        from worker.process.backlog_server import GROUP

        return serve_backlog(read, s.group_id, s.input_topic, serve, interval, s.metrics_host, GROUP)
    try:
        lags = read()
    except (ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # KafkaException from the admin futures
        raise fail(f"could not read offsets from {s.kafka_bootstrap_servers}: {exc}") from None
    replicas = desired_replicas(lags, lag_threshold) if lag_threshold else None
    if as_json:
        return print_json(lag_json(lags), s, replicas)
    print_lag_table(lags, s)
    if replicas is not None:
        console.print(f"KEDA would ask for [bold]{replicas}[/] replica(s) at lagThreshold {lag_threshold}")


def group_reader(s, offset_reset_policy: str, scale_to_zero: bool, retained_only: bool):
    """A function reading the consumer group's lag, with one admin client and one offsets reader for
    every read (the process's life)."""
    from connectors.kafka import make_admin
    from connectors.lag import GroupOffsets, group_lag

    admin, offsets = make_admin(s.kafka_common()), GroupOffsets(s.kafka_common(), s.group_id)
    return lambda: group_lag(admin, offsets, s.input_topic, offset_reset_policy, scale_to_zero,
                             retained_only=retained_only)


def print_lag_table(lags, s) -> None:
    table = Table("partition", "end offset", "committed", "lag", title=f"group [bold]{s.group_id}[/] on "
                  f"[bold]{s.input_topic}[/]", title_justify="left")
    for p in lags:
        committed = (f"{p.committed:,}" if p.committed is not None else "—" if p.start_offset is None
                     else f"— (log starts at {p.start_offset:,})")
        table.add_row(str(p.partition), f"{p.end_offset:,}", committed, f"{p.lag:,}")
    table.add_section()
    table.add_row("total", "", "", f"[bold]{sum(p.lag for p in lags):,}[/]")
    console.print(table)


def print_json(out: dict, s, replicas: int | None) -> None:
    out.update(group=s.group_id, topic=s.input_topic)
    if replicas is not None:
        out["desired_replicas"] = replicas
    print(json.dumps(out))


def share_backlog(s, as_json: bool, lag_threshold: int | None, serve: int | None, interval: float) -> None:
    """``lag`` for a share group: print its backlog once, or serve it (``--serve``)."""
    from connectors.kafka import make_admin
    from connectors.kafka_wire import check_supported
    from connectors.share_backlog import as_json as backlog_json
    from connectors.share_backlog import group_backlog

    try:
        props = s.kafka_common()
        check_supported(props)
    except Exception as exc:
        raise fail(str(exc), 2) from None
    admin = make_admin(props)

    def read():
        return group_backlog(admin, props, s.group_id, s.input_topic)

    if serve is not None:
        return serve_backlog(read, s.group_id, s.input_topic, serve, interval, s.metrics_host)
    try:
        found = read()
    except Exception as exc:
        raise fail(f"could not read the backlog of share group {s.group_id} from {s.kafka_bootstrap_servers}: "
                   f"{exc}") from None
    total = sum(p.backlog for p in found)
    replicas = -(-total // lag_threshold) if lag_threshold else None  # no partition cap in a share group
    if as_json:
        return print_json(backlog_json(found), s, replicas)
    table = Table("partition", "end offset", "start offset", "backlog", title=f"share group [bold]{s.group_id}[/] "
                  f"on [bold]{s.input_topic}[/]", title_justify="left")
    for p in found:
        table.add_row(str(p.partition), f"{p.end_offset:,}", "— (not started)" if p.start_offset is None
                      else f"{p.start_offset:,}", f"{p.backlog:,}")
    table.add_section()
    table.add_row("total", "", "", f"[bold]{total:,}[/]")
    console.print(table)
    if replicas is not None:
        console.print(f"KEDA would ask for [bold]{replicas}[/] replica(s) at a target of {lag_threshold} a replica")


def serve_backlog(read, group: str, topic: str, port: int, interval: float, host: str = "0.0.0.0",
                  kind=None) -> None:
    """Serve the backlog on ``host:port`` until SIGTERM or Ctrl-C (``kind``: the exporter's
    ``SHARE``, the default, or ``GROUP``)."""
    import signal
    import threading

    from worker.process.backlog_server import SHARE, BacklogExporter

    kind = kind or SHARE
    exporter = BacklogExporter(read, group, topic, interval, kind)
    server = exporter.serve(port, host)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    console.print(f"serving the backlog of {kind.group} [bold]{group}[/] on {host}:{port} ({kind.path}, /metrics, "
                  f"/healthz), read every {interval:g}s")
    try:
        while not done.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    exporter.stop()
    server.shutdown()
