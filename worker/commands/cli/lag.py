"""``embedstream lag``: the group's lag, as KEDA computes it."""

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
    settings_or_exit,
)


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "group_id", "group_type")
def lag(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    offset_reset_policy: Annotated[str, typer.Option(
        help="How a partition without a committed offset counts, as in KEDA: latest → 1, earliest → its end "
        "offset")] = "latest",
    scale_to_zero_on_invalid_offset: Annotated[bool, typer.Option(
        help="Count partitions without a committed offset as 0 (KEDA's scaleToZeroOnInvalidOffset)")] = False,
    lag_threshold: Annotated[int | None, typer.Option(
        help="Also show the replicas KEDA would ask for at this lagThreshold", min=1)] = None,
    overrides: dict[str, object] | None = None,
) -> None:
    """Per-partition and total lag of the worker's group, computed as KEDA's Kafka scaler computes it
    (end offset − committed offset)."""
    from connectors.kafka import make_admin
    from connectors.lag import as_json as lag_json
    from connectors.lag import desired_replicas, group_lag

    if offset_reset_policy not in ("latest", "earliest"):
        raise fail("--offset-reset-policy must be latest or earliest", 2)
    s = settings_or_exit(overrides)
    if s.group_type == "share":
        raise fail("a share group commits no offsets, so it has no lag to compute this way (its backlog is the "
                   "broker's share-partition start offsets, which confluent-kafka 2.16 does not read)", 2)
    try:
        s.require("kafka_bootstrap_servers")
        lags = group_lag(make_admin(s.kafka_common()), s.group_id, s.input_topic, offset_reset_policy,
                         scale_to_zero_on_invalid_offset)
    except (ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # KafkaException from the admin futures
        raise fail(f"could not read offsets from {s.kafka_bootstrap_servers}: {exc}") from None
    replicas = desired_replicas(lags, lag_threshold) if lag_threshold else None
    if as_json:
        out = lag_json(lags)
        out.update(group=s.group_id, topic=s.input_topic)
        if replicas is not None:
            out["desired_replicas"] = replicas
        print(json.dumps(out))
        return
    table = Table("partition", "end offset", "committed", "lag", title=f"group [bold]{s.group_id}[/] on "
                  f"[bold]{s.input_topic}[/]", title_justify="left")
    for p in lags:
        table.add_row(str(p.partition), f"{p.end_offset:,}", "—" if p.committed is None else f"{p.committed:,}",
                      f"{p.lag:,}")
    table.add_section()
    table.add_row("total", "", "", f"[bold]{sum(p.lag for p in lags):,}[/]")
    console.print(table)
    if replicas is not None:
        console.print(f"KEDA would ask for [bold]{replicas}[/] replica(s) at lagThreshold {lag_threshold}")
