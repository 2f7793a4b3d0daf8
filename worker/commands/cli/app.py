"""The ``embedstream`` application: its command groups, and what every command shares (settings
that exit 2 with what to fix, the failure line, the development tools of a checkout)."""

import importlib
import logging
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from schemas.redact import remember
from worker.commands.shown import shown
from worker.process.logs import logs_are_json
from worker.settings import Settings, UnknownVariables, load_settings

app = typer.Typer(
    name="embedstream",
    help="Kafka-driven streaming embedding worker: documents in, vectors out (Milvus + an output topic).",
    no_args_is_help=True,
    add_completion=False,
    # a traceback of a crash never prints the frames' locals: they hold the settings, secrets included
    pretty_exceptions_show_locals=False,
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
        settings = load_settings({**(overrides or {}), **more})
        remember(settings.secrets())  # masked in every line this process writes from now on
        return settings
    except UnknownVariables as exc:
        for line in exc.lines:
            err.print(f"[red]invalid setting[/] {shown(line)}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            name = " EMBEDSTREAM_" + "_".join(str(p) for p in e["loc"]).upper() if e["loc"] else ""
            err.print(f"[red]invalid setting[/]{name}: {shown(msg)}", soft_wrap=True)
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


def say(message: str, level: int = logging.INFO, styled: str | None = None) -> None:
    """One line on stderr: ``styled`` (rich markup whose outside text went through
    ``worker.commands.shown.shown``; default ``message``, shown as the characters it holds) for a
    person, or a log line when the logs are JSON (``EMBEDSTREAM_LOG_FORMAT=json``), so that every line a
    worker writes is one JSON object, its last included."""
    if logs_are_json():
        logging.getLogger("embedstream").log(level, message)
    else:  # one line, whatever the terminal's width
        err.print(styled if styled is not None else shown(message), soft_wrap=True)


def require_or_exit(s: Settings, *names: str) -> None:
    """Exit 2 (a setting to fix, as every command) naming each setting of ``names`` that is unset."""
    try:
        s.require(*names)
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def fail(message: str, code: int = 1) -> typer.Exit:
    say(message, logging.ERROR, f"[red]error:[/] {shown(message)}")
    return typer.Exit(code)
