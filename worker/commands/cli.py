"""The ``embedstream`` command line. The only place that reads the environment."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from schemas.errors import ConfigError, TransientError
from worker.commands import options as opt
from worker.settings import Settings, UnknownVariables, load_settings

app = typer.Typer(
    name="embedstream",
    help="Kafka-driven streaming embedding worker: documents in, vectors out (Milvus + an output topic).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: rich tables cut long names (env vars) in 80 columns
)
dev_app = typer.Typer(help="The local stack (broker, Redis, Milvus) on 127.0.0.1, for trying and testing.",
                      no_args_is_help=True)
app.add_typer(dev_app, name="dev")

console = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"embedstream {version('embedstream')}")
        except PackageNotFoundError:  # a checkout run without `pip install`
            console.print("embedstream (not installed: its version is in pyproject.toml)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit")] = False,
) -> None:
    """Kafka-driven streaming embedding worker: documents in, vectors out (Milvus + an output topic)."""


def settings_or_exit(overrides: Mapping[str, object] | None = None, **more: object) -> Settings:
    """Settings from the environment, then the flags ``overrides`` and ``more`` (None: not given); a
    bad value exits 2 with what to fix."""
    try:
        return load_settings({**(overrides or {}), **more})
    except UnknownVariables as exc:
        for line in exc.lines:
            err.print(f"[red]invalid setting[/] {line}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            name = " EMBEDSTREAM_" + "_".join(str(p) for p in e["loc"]).upper() if e["loc"] else ""
            err.print(f"[red]invalid setting[/]{name}: {msg}", soft_wrap=True)
        raise typer.Exit(2) from None


def tool(name: str) -> Any:
    """The development tool ``tools.<name>`` (the local stack, the bench, the demo). The tools ship
    with a checkout, not with the wheel or the image: without them, exit 2 saying so."""
    try:
        return importlib.import_module(f"tools.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("tools", f"tools.{name}"):
            raise
        raise fail("this is a development command: run it from a checkout of embedstream after `make setup` "
                   "(the installed package and the image hold the worker and its commands only)", 2) from None


def refused_property(exc: Exception) -> Exception:
    """A librdkafka client refused its properties (a misspelt or invalid ``EMBEDSTREAM_KAFKA__*``):
    exit 2 with librdkafka's one line; any other Kafka error goes on as it was."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
        return fail(f"{error.str()}: check the EMBEDSTREAM_KAFKA__* variables (librdkafka's names, dots as _)", 2)
    return exc


def consumer_died(exc: Exception) -> typer.Exit | None:
    """The consumer stopped for good (librdkafka's fatal error): exit 4 with what to do when another
    member took this one's static id, exit 1 with librdkafka's line otherwise; None for other errors."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError) or not (error.fatal() or error.code() == KafkaError._FATAL):
        return None
    if "fenced" in error.str().lower():
        return fail(f"{error.str()}. Another worker joined the group with this one's EMBEDSTREAM_GROUP_INSTANCE_ID: "
                    "no offsets were committed here after that (the member that took over reads those records); "
                    "run each instance id once", 4)
    return fail(f"the Kafka consumer stopped for good: {error.str()}", 1)


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", soft_wrap=True)  # one line, whatever the terminal's width
    return typer.Exit(code)


# -- dev -------------------------------------------------------------------------------------
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

    Run eval "$(embedstream dev up)" (or export the lines) to point the other commands at it.
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


# -- produce / tail --------------------------------------------------------------------------
@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "schema_registry_url")
def produce(
    file: Annotated[Path, typer.Argument(help="JSONL, CSV (id,text,...) or plain text (one document a line)",
                                         exists=True, dir_okay=False, readable=True)],
    formats: Annotated[list[str] | None, typer.Option(
        "--format", help="The file's format, jsonl|csv|text (default: from the extension), and/or the records' "
        "format, avro|avro-registry|json (default: avro, schemaless); give --format twice for both, e.g. "
        "--format csv --format avro-registry")] = None,
    rate: Annotated[float | None, typer.Option(help="Produce at this many documents per second", min=0.001)] = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip malformed lines (counted) instead of "
                                           "stopping at the first")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Produce the documents of FILE to the input topic, keyed by id (idempotent producer).

    JSONL lines are {"id", "text", "metadata", "model", "event_time"}; CSV needs a text
    column (an id column too, or ids are hashes of the text; other columns become metadata);
    plain text is one document a line with a stable hash as id. With --format avro-registry the
    values are framed by confluent-kafka's AvroSerializer (schema registered under <topic>-value).
    """
    from worker.commands.produce import (
        BadLine,
        count_lines,
        document_record,
        good_documents,
        produce_records,
        read_documents,
        split_formats,
    )
    from worker.commands.wire import document_encoder

    s = settings_or_exit(overrides)
    try:
        s.require("kafka_bootstrap_servers")
        fmt, wire = split_formats(formats or [])
        encode = document_encoder(wire, s, s.input_topic)
        if not skip_bad:  # find a bad line before producing anything, so a fixed file can simply be re-run
            for _line, doc in read_documents(file, fmt):
                if isinstance(doc, BadLine):
                    raise doc
        skipped: list[int] = []
        records = (document_record(d, encode=encode) for d in good_documents(read_documents(file, fmt), skipped))
        with Progress(TextColumn("[bold]producing[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("docs"),
                      TimeRemainingColumn(), console=err, transient=False) as bar:
            task = bar.add_task("produce", total=count_lines(file))
            result = produce_records(s.kafka_common(), s.input_topic, records, rate=rate,
                                     delivery_timeout_s=s.kafka_timeout_seconds,
                                     on_progress=lambda n: bar.update(task, completed=n))
            bar.update(task, total=result.produced, completed=result.produced)
        result.skipped = len(skipped)
    except BadLine as exc:
        raise fail(f"{file}: {exc} (use --skip-bad to skip such lines)") from None
    except (ValueError, TransientError) as exc:
        raise fail(str(exc)) from None
    rate_done = result.produced / result.seconds if result.seconds else float("inf")
    err.print(f"produced [bold]{result.produced}[/] documents to [bold]{s.input_topic}[/] "
              f"in {result.seconds:.1f}s ({rate_done:,.0f} docs/s)"
              + (f", skipped [yellow]{result.skipped}[/] malformed lines" if result.skipped else ""))


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "output_topic", "schema_registry_url")
def tail(
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record "
                                                 "(default: only new records)")] = False,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N records", min=1)] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop when no record came for this many seconds")] = None,
    vectors: Annotated[bool, typer.Option(help="Include the vectors in the output")] = True,
    output_format: Annotated[str | None, typer.Option(
        "--format", help="avro|avro-registry|json: how the values are written [env: EMBEDSTREAM_OUTPUT_FORMAT; "
        "default: avro]")] = None,
    read_uncommitted: Annotated[bool, typer.Option(
        "--read-uncommitted", help="Also show records of open and aborted transactions (default: committed "
        "records only, as a read_committed consumer sees them)")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Print the output topic as JSON lines (tombstones as {"id", "tombstone": true}).

    With --format avro-registry the values are read by confluent-kafka's AvroDeserializer with
    nothing but the registry's URL, as any consumer of the topic would."""
    from worker.commands.tail import tail_records, to_json_line
    from worker.commands.wire import embedding_decoder

    s = settings_or_exit(overrides)
    try:
        s.require("kafka_bootstrap_servers")
        decode = embedding_decoder(output_format or s.output_format, s)
        for record in tail_records(s, from_beginning=from_beginning, max_records=max_records, timeout=timeout,
                                   decode=decode, read_committed=not read_uncommitted):
            sys.stdout.write(to_json_line(record, vectors) + "\n")
            sys.stdout.flush()
    except (ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        pass


# -- run / search ----------------------------------------------------------------------------
@app.command()
@opt.with_settings(*opt.FLAGGED)
def run(
    stop_when_idle: Annotated[float | None, typer.Option(
        "--stop-when-idle", help="Exit 0 once every assigned partition has been at its end for this many "
        "seconds (backfill / batch mode)", min=0)] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Only reach each dependency (brokers and topics, Milvus and the collection, Redis, the "
        "schema registry) and load the model, print a table, and exit 0, or 2 with what is wrong; joins no group "
        "and creates or writes nothing")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """The worker: consume documents, batch, cache, embed, upsert into Milvus, publish, commit.

    Runs until SIGTERM/SIGINT (finishes in-flight batches, commits, exits 0), or with
    --stop-when-idle until the input is drained. Every setting also reads from its
    EMBEDSTREAM_* variable; any librdkafka property passes as EMBEDSTREAM_KAFKA__<NAME_WITH_UNDERSCORES>,
    any schema registry client property (credentials, TLS) as EMBEDSTREAM_SCHEMA_REGISTRY__<NAME>
    (e.g. EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO=user:secret).

    Exit codes: 0 stopped or idle; 2 a setting to fix; 3 the DLQ breaker tripped; 4 fenced by another
    worker with this one's identity (its static member id, or exactly-once's transactional.id); 5 the
    broker refused a record for good (the line says which and what to set).
    """
    from confluent_kafka import KafkaException

    from connectors.transactions import TransactionsFailed
    from schemas.errors import DlqLimitExceeded, RecordRefused
    from worker.assembly.runner import build_worker, setup_logging

    s = settings_or_exit(overrides)
    setup_logging(s)
    if check:
        raise typer.Exit(_check(s))
    if s.processes > 1:
        from worker.process.processes import Processes

        children = Processes(s, dict(os.environ), stop_when_idle)
        children.forward_signals()
        raise typer.Exit(children.wait())
    try:
        worker = build_worker(s)
    except ConfigError as exc:
        raise fail(f"{exc}", 2) from None
    except TransactionsFailed as exc:
        raise fail(str(exc), 4) from None
    except KafkaException as exc:
        raise refused_property(exc) from None
    worker.install_signal_handlers()
    try:
        stats = worker.run(stop_when_idle=stop_when_idle)
    except KafkaException as exc:  # the consumer died, or a client made after start-up refused its properties
        raise consumer_died(exc) or refused_property(exc) from None
    except DlqLimitExceeded as exc:
        raise fail(str(exc), 3) from None
    except RecordRefused as exc:
        raise fail(str(exc), 5) from None
    except TransactionsFailed as exc:
        raise fail(f"{exc}. Nothing more was written; the offsets committed are those of the transactions "
                   "that committed. A newer worker with the same transactional.id (the same "
                   "EMBEDSTREAM_GROUP_INSTANCE_ID) fences this one: run each instance id once.", 4) from None
    err.print(_done_line(stats))


@app.command("config")
def config(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: each variable's value and source")] = False,
) -> None:
    """Print the settings in effect, secrets masked, and where each came from: its EMBEDSTREAM_*
    variable (environment) or the default. A bad setting exits 2 with what to fix, as `run` would."""
    from worker.commands.config_view import effective

    rows = effective(settings_or_exit(), os.environ)
    if as_json:
        console.print_json(data={v: {"value": value, "from": source} for v, value, source in rows})
        return
    table = Table("variable", "value", "from", title="embedstream config", title_justify="left")
    for variable, value, source in rows:
        table.add_row(variable, "" if value is None else str(value), source,
                      style="" if source == "default" else "bold")
    console.print(table)


def _check(s: Settings) -> int:
    """``run --check``: the table of :func:`worker.commands.check.run_checks`; 0, or 2 on a failure."""
    from worker.commands.check import run_checks

    checks = run_checks(s)
    table = Table("part", "", "detail", title="embedstream run --check", title_justify="left")
    for c in checks:
        mark = "[green]ok[/]" if c.ok else "[red]fail[/]" if c.ok is False else "[yellow]warn[/]"
        table.add_row(c.part, mark, c.detail)
    console.print(table)
    failed = [c.part for c in checks if c.ok is False]
    if failed:
        err.print(f"[red]error:[/] {', '.join(failed)}: fix what the table says, then run again", soft_wrap=True)
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


@app.command()
@opt.with_settings("model", "precision", "device", "milvus_uri", "milvus_collection", "milvus_alias",
                   "query_prompt", "truncate_dim", "sparse")
def search(
    text: Annotated[str, typer.Argument(help="The query text")],
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="How many documents to show", min=1)] = 5,
    mode: Annotated[str | None, typer.Option(
        "--mode", help="dense | sparse | hybrid [default: hybrid where the collection has a sparse field "
                       "(EMBEDSTREAM_SPARSE), else dense]")] = None,
    weights: Annotated[str | None, typer.Option(
        "--weights", help="hybrid: fuse by weighted scores DENSE,SPARSE (e.g. 0.7,0.3) instead of reciprocal "
                          "rank (RRF, the default)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Embed TEXT with the worker's model and precision (and its query prompt); show the best
    documents in Milvus: by the dense vector, the sparse one (BM25 or a learned sparse model), or
    both fused."""
    from worker.commands.search import search_documents

    s = settings_or_exit(overrides)
    try:
        hits = search_documents(s, [text], top_k, mode=mode, weights=parse_weights(weights))[0]
    except (ConfigError, ValueError, TransientError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(json.dumps(hits, ensure_ascii=False))
        return
    console.print(hits_table(text, hits))


def parse_weights(value: str | None) -> tuple[float, float] | None:
    """``--weights DENSE,SPARSE`` → the two weights; None when not given. Raises ValueError."""
    if value is None:
        return None
    parts = value.split(",")
    try:
        dense, sparse = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--weights {value!r}: give two numbers, DENSE,SPARSE (e.g. 0.7,0.3)") from None
    if not (0 <= dense <= 1 and 0 <= sparse <= 1):
        raise ValueError(f"--weights {value!r}: each weight is from 0 to 1")
    return dense, sparse


def hits_table(query: str, hits: list[dict]) -> Table:
    """The documents found, best first: score, id, which chunk matched (its span) and an excerpt."""
    table = Table("#", "score", "id", "matched", "excerpt", "metadata", title=f"[bold]{query}[/]",
                  title_justify="left")
    for rank, h in enumerate(hits, 1):
        meta = ", ".join(f"{k}={v}" for k, v in (h.get("metadata") or {}).items())
        chunks, (start, end) = h.get("chunks", 1), h.get("span", (0, -1))
        where = f"chunk {h.get('chunk', 0) + 1}/{chunks}, chars {start}–{end}" if chunks > 1 else "whole text"
        excerpt = " ".join((h.get("excerpt") or "").split())
        also = h.get("also") or []
        ids = h["id"] + (f" (same text: {', '.join(also[:3])}{', …' if len(also) > 3 else ''})" if also else "")
        table.add_row(str(rank), f"{h['score']:.3f}", ids, where, excerpt[:70] + ("…" if len(excerpt) > 70 else ""),
                      meta[:60])
    return table


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "group_id")
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


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "output_topic", "group_id", "precision", "device",
                   "redis_url", "milvus_uri", "milvus_collection", "milvus_alias")
def migrate(
    model: Annotated[str, typer.Option("--model", help="The new model (path or name) to re-embed every document "
                                                       "with")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be done; change nothing")] = False,
    min_overlap: Annotated[float | None, typer.Option(
        help="Refuse to switch when the mean top-10 neighbour overlap of the shadow check is below this", min=0,
        max=1)] = None,
    drop_old: Annotated[bool, typer.Option(
        "--drop-old", help="After the switch, drop the alias's other collections (once no worker writes "
        "them)")] = False,
    sample: Annotated[int, typer.Option(help="Documents sampled by the shadow check", min=1)] = 50,
    backfill_group: Annotated[str | None, typer.Option(
        "--backfill-group",
        help="Consumer group of the backfill [default: <group id>.migrate.<new collection>]")] = None,
    overrides: dict[str, object] | None = None,
) -> None:
    """Re-embed the input topic into a new collection with --model while the live workers keep
    serving the old one; once caught up, compare the two and move the alias readers query.

    Run it with the live deployment's settings (EMBEDSTREAM_MODEL = the model in use). The backfill
    group reads the topic from its beginning, so the topic must keep every live document (compacted,
    keyed by id). Killed or interrupted, a re-run resumes where the backfill group stopped. After the
    switch, move the workers to the new model in the backfill group (it printed which), then drop the
    old collection with --drop-old. Exit 0: switched (or nothing to do); 1: not switched.
    """
    from worker.assembly.runner import setup_logging
    from worker.commands import migrate as mig
    from worker.commands.migrate_view import BackfillProgress, plan_table, shadow_table

    s = settings_or_exit(overrides, log_level=None if "EMBEDSTREAM_LOG_LEVEL" in os.environ else "WARNING")
    setup_logging(s)
    try:
        m = mig.plan(s, model, backfill_group)
    except (ConfigError, TransientError) as exc:
        raise fail(str(exc), 2) from None
    console.print(plan_table(m.plan, dry_run))
    for warning in m.plan.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    if dry_run:
        return
    with BackfillProgress(err) as progress:
        try:
            switched = mig.run(m, sample=sample, min_overlap=min_overlap, drop=drop_old, on_lag=progress.update,
                               on_report=lambda r: console.print(shadow_table(r, sample)), say=console.print)
        except (ConfigError, TransientError) as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise fail("interrupted: the alias stays where it was; the backfill's progress is committed and a "
                       "re-run resumes it", 130) from None
    if not switched:
        raise typer.Exit(1)
    if not drop_old:
        console.print(f"next: run the workers with EMBEDSTREAM_MODEL={model} and EMBEDSTREAM_GROUP_ID={m.plan.group} "
                      "(that group has consumed the topic up to the switch), then `embedstream migrate --model "
                      f"{model} --drop-old` drops the old collection")


@app.command()
@opt.with_settings("device", "precision")
def bench(
    quick: Annotated[bool, typer.Option("--quick", help="Small workloads: the whole run in under 3 minutes")] = False,
    peer_python: Annotated[str | None, typer.Option(
        help="Python of a virtualenv with infinity-emb[torch] (make bench-peer-env) to measure the peer")] = None,
    docs: Annotated[int | None, typer.Option(help="Override the documents per workload", min=10)] = None,
    latency_seconds: Annotated[float | None, typer.Option(help="Override the length of each S5 latency run",
                                                          min=1)] = None,
    output: Annotated[Path, typer.Option(help="Where to write bench.json and bench.png")] = Path("."),
    state_dir: opt.StateDir = Path(".embedstream/bench"),
    broker: opt.Broker = "tansu",
    cpu: Annotated[bool, typer.Option("--cpu", help="Only the CPU/doc rows, each thread's share beside them: "
                                      "an instant model, no model loaded, about a minute (--docs: documents a run, "
                                      "default 20,000; a tenth of them first, unmeasured, to warm up). "
                                      "Writes cpu.json")] = False,
    processes: Annotated[str | None, typer.Option(
        "--processes", help="Only R1 at these process counts, e.g. 1,2,4,8: for S1 and S2 the raw encode, then "
        "`embedstream run --processes K` end to end for each K (cold cache; the best K of S2 once more without "
        "Redis), with tokens/s and the GPU's utilisation (--docs: documents a run, default 20,000). Writes "
        "processes.json")] = None,
    brokers: Annotated[str | None, typer.Option(
        "--brokers", help="Only the broker rows, on each of these local brokers in turn, e.g. tansu,kafka: R1, Rio, "
        "Reos and Rdup90, and how long partitions stand still while a second worker joins and leaves, under each "
        "group protocol the broker serves (--docs: documents a workload, default 1,000). Writes brokers.json")] = None,
    overrides: dict[str, object] | None = None,
) -> None:
    """Measure the workloads of the README's Benchmark section on a local stack of its own and print the ratio table.

    Every figure is a ratio to a denominator measured in the same run: raw SentenceTransformer.encode,
    an instant model (what Kafka + Redis + Milvus cost), Milvus bulk upserts, and optionally the
    infinity-emb engine. Writes bench.json and bench.png.
    """
    report, bench_run = tool("bench.report"), tool("bench.run")

    s = None if cpu else settings_or_exit(overrides)
    if s is not None and s.models is not None:
        raise fail("bench measures one model (EMBEDSTREAM_MODEL); unset EMBEDSTREAM_MODELS")
    counts = _process_counts(processes) if processes is not None else None
    broker_list = _broker_list(brokers) if brokers is not None else None
    if sum(map(bool, (counts, cpu, broker_list))) > 1:
        raise fail("--cpu, --processes and --brokers are separate runs: give one of them")
    with console.status("benchmarking…") as status:
        def say(message: str) -> None:
            status.update(message)
            err.print(f"[dim]{message}[/]")

        if s is None:
            out = bench_run.run_cpu(docs=docs or 20_000, state_dir=state_dir, say=say, broker=broker)
        elif broker_list:
            out = tool("bench.brokers").run_brokers(brokers=broker_list, docs=docs, device=s.device,
                                                    precision=s.precision, state_dir=state_dir, say=say, model=s.model)
        elif counts:
            out = bench_run.run_processes(counts=counts, docs=docs or 20_000, device=s.device, precision=s.precision,
                                          state_dir=state_dir, say=say, model=s.model, broker=broker)
        else:
            out = bench_run.run_bench(quick=quick, device=s.device, precision=s.precision, peer_python=peer_python,
                                      docs=docs, latency_seconds=latency_seconds, state_dir=state_dir, say=say,
                                      model=s.model, broker=broker)
    output.mkdir(parents=True, exist_ok=True)
    if s is None:
        report.write_json(out, output / "cpu.json")
        console.print(report.cpu_table(out))
        err.print(f"wrote {output / 'cpu.json'}")
        return
    if broker_list:
        report.write_json(out, output / "brokers.json")
        console.print(report.brokers_table(out))
        err.print(f"wrote {output / 'brokers.json'}")
        return
    if counts:
        report.write_json(out, output / "processes.json")
        console.print(report.processes_table(out))
        err.print(f"wrote {output / 'processes.json'}")
        return
    report.write_json(out, output / "bench.json")
    report.write_chart(out, output / "bench.png")
    console.print(report.ratio_table(out))
    err.print(f"wrote {output / 'bench.json'} and {output / 'bench.png'}")


def _broker_list(value: str) -> list[str]:
    """``--brokers tansu,kafka`` → ``["tansu", "kafka"]``; an unknown name stops with the known ones."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [n for n in names if n not in ("tansu", "kafka", "mock")]
    if not names or unknown:
        raise fail(f"--brokers takes local brokers separated by commas (tansu, kafka, mock), not {value!r}")
    return names


def _process_counts(value: str) -> list[int]:
    """``--processes 1,2,4,8`` → ``[1, 2, 4, 8]``; a bad list stops with what to give."""
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(k < 1 for k in counts):
        raise fail(f"--processes {value!r}: give process counts of at least 1, separated by commas, e.g. 1,2,4,8")
    return counts


@app.command()
def demo(
    docs: Annotated[int, typer.Option(help="Documents in the sample corpus", min=10, max=7000)] = 3000,
    repeats: Annotated[float, typer.Option(help="Fraction of documents that repeat an earlier text under a new id",
                                           min=0.0, max=0.95)] = 0.2,
    state_dir: opt.StateDir = Path(".embedstream/demo"),
    keep_stack: Annotated[bool, typer.Option("--keep-stack", help="Leave the local stack running afterwards")] = False,
) -> None:
    """Start the local stack, stream a sample corpus through the worker, show what came out, stop.

    The corpus is built at run time from the installed Python standard library's docstrings.
    """
    _demo = tool("demo")
    run_demo = _demo.run_demo

    try:
        run_demo(console, docs=docs, repeats=repeats, state_dir=state_dir, keep_stack=keep_stack)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None


def main() -> None:  # pragma: no cover - console entry for `python -m worker`
    # Models load from local paths only (no hub at run time), and the tokenizer must not start
    # threads of its own (the embed thread is its only user; see worker/embedding/base.py).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except ConfigError as exc:
        err.print(f"[red]configuration error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
