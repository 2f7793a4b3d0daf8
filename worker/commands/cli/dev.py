"""``embedstream dev``: the local stack for trying and testing (the tools of a checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from worker.commands import options as opt
from worker.commands.cli.app import (
    console,
    dev_app,
    err,
    fail,
    settings_or_exit,
    tool,
)

DEFAULT_STATE = Path(".embedstream/dev")


@dev_app.command("up")
@opt.with_settings("input_topic", "output_topic", "dlq_topic")
def dev_up(
    state_dir: opt.StateDir = DEFAULT_STATE,
    partitions: Annotated[int, typer.Option(help="Partitions of each topic created", min=1)] = 6,
    broker_port: Annotated[int | None, typer.Option(help="Broker port (default: a free one)")] = None,
    redis_port: Annotated[int | None, typer.Option(help="Redis port (default: a free one)")] = None,
    milvus_port: Annotated[int | None, typer.Option(help="Milvus port (default: a free one)")] = None,
    registry_port: Annotated[int | None, typer.Option(help="Schema registry port (default: a free one)")] = None,
    broker: opt.Broker = "tansu",
    overrides: dict[str, object] | None = None,
) -> None:
    """Start the broker (Tansu), Redis, Milvus Lite and a development schema registry, create the
    topics, print KEY=VALUE lines.

    --broker kafka runs Apache Kafka itself (one KRaft node, transactions and share groups on): its
    jars are fetched with Maven once into ~/.cache/embedstream/kafka (EMBEDSTREAM_KAFKA_CACHE), and it
    needs Java 17 or later. --broker mock runs librdkafka's mock cluster instead of Tansu (in memory,
    topics of 4 partitions, no transactions; it picks its own port): for machines Tansu's binary
    cannot reach.

    The registry is a stand-in for a Confluent-compatible one (the REST calls confluent-kafka's client
    makes, BACKWARD compatibility checks); it is never part of the Helm chart.

    It prints KEY=VALUE lines: eval "$(embedstream dev up | sed 's/^/export /')" points the other
    commands at it.
    A second up finds the running stack and prints the same lines.
    """
    _dev = tool("dev")
    LocalStack, StackError = _dev.LocalStack, _dev.StackError

    s = settings_or_exit(overrides)
    topics = {"EMBEDSTREAM_INPUT_TOPIC": s.input_topic, "EMBEDSTREAM_OUTPUT_TOPIC": s.output_topic,
              "EMBEDSTREAM_DLQ_TOPIC": s.dlq_topic}
    if broker == "mock" and broker_port:
        raise fail("--broker-port cannot be chosen with --broker mock: librdkafka picks the mock broker's port")
    try:
        stack = LocalStack(state_dir, broker=broker)
        env, started = stack.up({"broker": broker_port, "redis": redis_port, "milvus": milvus_port,
                                 "registry": registry_port},
                                partitions=partitions, topics=topics,
                                on_progress=lambda m: err.print(f"[dim]{m}[/]"))
    except StackError as exc:
        raise fail(str(exc)) from None
    err.print("[green]local stack started[/]" if started else "[yellow]local stack already running[/]",
              f"(state: {stack.state_dir})")
    for key, value in env.items():
        print(f"{key}={value}")


@dev_app.command("down")
def dev_down(state_dir: opt.StateDir = DEFAULT_STATE) -> None:
    """Stop exactly the processes that dev up started (by their recorded pids)."""
    _dev = tool("dev")
    LocalStack = _dev.LocalStack

    stopped = LocalStack(state_dir).down()
    err.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@dev_app.command("status")
def dev_status(state_dir: opt.StateDir = DEFAULT_STATE) -> None:
    """Show each part of the local stack: pid, port, running or not, log file. Exit 1 if not all run."""
    _dev = tool("dev")
    PART_NAMES, LocalStack = _dev.PART_NAMES, _dev.LocalStack

    status = LocalStack(state_dir).status()
    if not status:
        err.print(f"no local stack recorded in {state_dir}")
        raise typer.Exit(1)
    kind = LocalStack(state_dir).broker_kind()
    table = Table("part", "pid", "address", "state", "log")
    for name, st in status.items():
        table.add_row(f"broker ({kind})" if name == "broker" else name, str(st["pid"]), f"127.0.0.1:{st['port']}",
                      "[green]running[/]" if st["running"] else "[red]stopped[/]", st["log"])
    console.print(table)
    if set(status) != set(PART_NAMES) or not all(st["running"] for st in status.values()):
        raise typer.Exit(1)


@dev_app.command("env")
def dev_env(state_dir: opt.StateDir = DEFAULT_STATE) -> None:
    """Print the KEY=VALUE lines of the running local stack (for export or eval)."""
    _dev = tool("dev")
    LocalStack, StackError = _dev.LocalStack, _dev.StackError

    try:
        env = LocalStack(state_dir).env()
    except StackError as exc:
        raise fail(str(exc)) from None
    for key, value in env.items():
        print(f"{key}={value}")
