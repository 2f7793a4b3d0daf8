"""``embedstream config``: the settings in effect and where each came from."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from worker.commands.cli.app import (
    app,
    console,
    settings_or_exit,
)


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
