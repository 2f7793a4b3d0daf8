"""``embedstream run``: the worker (and ``--check``, which only reaches each dependency)."""

from __future__ import annotations

import logging
import os
import time
from typing import Annotated

import typer
from rich.table import Table

from schemas.errors import ConfigError
from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    consumer_died,
    fail,
    refused_property,
    say,
    settings_or_exit,
)
from worker.commands.shown import shown
from worker.process.startup import StartClock
from worker.settings import Settings

StopWhenIdle = Annotated[float | None, typer.Option(
    "--stop-when-idle", help="Exit 0 once every assigned partition has been at its end for this many seconds "
    "(backfill / batch mode)", min=0)]
CheckOnly = Annotated[bool, typer.Option(
    "--check", help="Only reach each dependency (brokers and topics, Milvus and the collection, Redis, the schema "
    "registry) and load the model, print a table, and exit 0, or 2 with what is wrong; joins no group and creates "
    "or writes nothing")]


@app.command()
@opt.with_settings(*opt.FLAGGED)
def run(stop_when_idle: StopWhenIdle = None, check: CheckOnly = False,
        overrides: dict[str, object] | None = None) -> None:
    """The worker: consume documents, batch, cache, embed, upsert into Milvus, publish, commit.

    Runs until SIGTERM/SIGINT (finishes in-flight batches, commits, exits 0), or with
    --stop-when-idle until the input is drained. Every setting also reads from its
    EMBEDSTREAM_* variable; any librdkafka property passes as EMBEDSTREAM_KAFKA__<NAME_WITH_UNDERSCORES>,
    any schema registry client property (credentials, TLS) as EMBEDSTREAM_SCHEMA_REGISTRY__<NAME>
    (e.g. EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO=user:secret).

    Exit codes: 0 stopped or idle; 1 the Kafka consumer stopped for good (the line says why); 2 a
    setting to fix (or a check that failed, with --check); 3 the DLQ breaker tripped; 4 fenced by
    another worker with this one's identity (its static member id, or exactly-once's
    transactional.id); 5 the broker refused a record for good (the line says which and what to set).
    With EMBEDSTREAM_PROCESSES > 1: the first failed child's code (128 + the signal if one killed it),
    or 1 if a child stalled.
    """
    from confluent_kafka import KafkaException

    from connectors.transactions import TransactionsFailed
    from schemas.errors import DlqLimitExceeded, RecordRefused
    from worker.process.logs import setup_logging

    startup = StartClock()  # from the process's start: a pod's whole start-up
    s = settings_or_exit(overrides)
    setup_logging(s)
    if check:
        raise typer.Exit(_check(s))
    if s.processes > 1:
        from worker.process.processes import Processes

        children = Processes(s, dict(os.environ), stop_when_idle)
        children.forward_signals()
        raise typer.Exit(children.wait())
    worker = _built(s, startup)
    worker.stop.install()
    try:
        stats = worker.run(stop_when_idle=stop_when_idle)
    except KafkaException as exc:  # the consumer died, or a client made after start-up refused its properties
        raise consumer_died(exc) or refused_property(exc) from None
    except DlqLimitExceeded as exc:
        raise fail(str(exc), 3) from None
    except ConfigError as exc:  # the broker refused an ACL the worker needs (AccessRefused)
        raise fail(str(exc), 2) from None
    except RecordRefused as exc:
        raise fail(str(exc), 5) from None
    except TransactionsFailed as exc:
        raise fail(f"{exc}. Nothing more was written; the offsets committed are those of the transactions "
                   "that committed. A newer worker with the same transactional.id (the same "
                   "EMBEDSTREAM_GROUP_INSTANCE_ID) fences this one: run each instance id once.", 4) from None
    say(_done_line(stats))


def _built(s: Settings, startup: StartClock):
    """The worker of ``s`` (with its backfill lane when EMBEDSTREAM_BACKFILL_MODEL is set); a start-up
    failure exits with its code (2 a setting, 4 fenced, or what the refused client property says)."""
    from confluent_kafka import KafkaException

    from connectors.transactions import TransactionsFailed
    from worker.assembly.lanes import build_lanes
    from worker.assembly.runner import build_worker

    try:
        return build_lanes(s, startup) if s.backfill_model else build_worker(s, startup=startup)
    except ConfigError as exc:
        raise fail(f"{exc}", 2) from None
    except TransactionsFailed as exc:
        raise fail(str(exc), 4) from None
    except KafkaException as exc:
        raise refused_property(exc) from None




def _check(s: Settings) -> int:
    """``run --check``: the table of :func:`worker.commands.check.run_checks`; 0, or 2 on a failure."""
    from worker.commands.check import run_checks

    checks = run_checks(s)
    table = Table("part", "", "detail", title="embedstream run --check", title_justify="left")
    for c in checks:
        mark = "[green]ok[/]" if c.ok else "[red]fail[/]" if c.ok is False else "[yellow]warn[/]"
        table.add_row(shown(c.part), mark, shown(c.detail))
    console.print(table)
    failed = [c.part for c in checks if c.ok is False]
    if failed:
        say(f"{', '.join(failed)}: fix what the table says, then run again", logging.ERROR,
            f"[red]error:[/] {shown(', '.join(failed))}: fix what the table says, then run again")
        return 2
    return 0


def _done_line(stats) -> str:
    """What ``run`` prints as it exits: the counts of a ``RunStats``."""
    elapsed = time.monotonic() - stats.started
    extra = "".join(f", {n} {what}" for n, what in ((stats.superseded, "superseded by newer versions"),
                                                  (stats.fenced, "left to new owners (fenced)")) if n)
    if stats.chunked:
        extra += f", {stats.chunked} long documents in {stats.long_chunks} chunks"
    return (f"done: {stats.embedded} embedded ({stats.cached} from cache), {stats.deleted} deleted, "
            f"{stats.dead_lettered} dead-lettered{extra}, {stats.batches} batches in {elapsed:.1f}s")
