"""The commands' options. A setting's flag is derived from its declaration (``worker.settings``):
``with_settings`` adds ``--<name>`` for each setting it names, its help the setting's description and
``[env: EMBEDSTREAM_<NAME>; default: …]``; nothing about a setting is written here again.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from worker.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

#: Every setting declared with ``flag=True``: what ``run`` takes.
FLAGGED: tuple[str, ...] = tuple(n for n, f in Settings.model_fields.items()
                                 if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("flag"))


def _option_type(annotation: Any) -> type:
    """The type a flag parses to: int or float where the setting is a number, else str (choices and
    secrets are checked by the settings, with the variable's name in the message)."""
    if typing.get_origin(annotation) is Literal:
        return str
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if any(typing.get_origin(a) is Literal for a in args):  # a number or a word (a port or "auto")
        return str
    return args[0] if args[0] in (int, float) else str


def setting_option(name: str) -> Any:
    """``Annotated[type | None, typer.Option(...)]`` of setting ``name``'s flag."""
    field = Settings.model_fields[name]
    shown = field.default if field.default not in (None, "") else None
    tail = f"; default: {shown}" if shown is not None else ""
    help_ = f"{field.description} [env: EMBEDSTREAM_{name.upper()}{tail}]"
    return Annotated[_option_type(field.annotation) | None, typer.Option("--" + name.replace("_", "-"), help=help_)]


def with_settings(*names: str) -> Callable[[F], F]:
    """A command that takes ``--<name>`` for each setting in ``names`` (after its own parameters) and
    receives them as ``overrides`` (name → value, None where not given): its signature is the
    command's own, less ``overrides``, plus one option per setting, which Typer reads."""
    unknown = [n for n in names if n not in Settings.model_fields]
    if unknown:
        raise ValueError(f"no such settings: {unknown}")

    def wrap(func: F) -> F:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
               if p.name != "overrides"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=setting_option(n))
                 for n in names]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            overrides = {n: kwargs.pop(n, None) for n in names}
            return func(*args, overrides=overrides, **kwargs)

        params = [*own, *added]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]
    return wrap


StateDir = Annotated[Path, typer.Option(
    "--state-dir", help="Where the local stack keeps its pids, ports, logs and data")]


def _one_of(*values: str):
    def check(value: str) -> str:
        if value not in values:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(values)}")
        return value
    return check


Broker = Annotated[str, typer.Option(
    "--broker", callback=_one_of("tansu", "kafka", "mock"),
    help="The local stack's broker: tansu (the default), kafka (Apache Kafka from Maven's jars: needs Java 17+ "
         "and Maven), or mock (librdkafka's mock cluster, in memory; where Tansu cannot run)")]
