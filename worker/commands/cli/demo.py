"""``embedstream demo``: what ``make demo`` runs (the tools of a checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from schemas.errors import ConfigError
from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    fail,
    tool,
)


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
