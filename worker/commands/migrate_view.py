"""What `embedstream migrate` shows: the plan, the backfill's progress, the shadow check."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from worker.commands.migrate import Backfill, LaneWatch, Plan, ShadowReport


def plan_table(p: Plan, dry_run: bool) -> Table:
    """The migration at a glance: alias, old and new collections and models, the backfill group."""
    kind = "migrate --rollback" if p.rollback else "migrate"
    table = Table("", "", title=f"[bold]{kind}[/] alias [bold]{p.alias}[/]" + (" (dry run)" if dry_run else ""),
                  title_justify="left", show_header=False)
    table.add_row("readers now", f"{p.old_collection or '— (no alias yet)'}"
                  + (f"  [dim]model {p.old_model}[/]" if p.old_model else ""))
    table.add_row("back to" if p.rollback else "new collection", f"{p.new_collection}  [dim]model {p.new_model}[/]")
    table.add_row("catch-up group" if p.rollback else "backfill group", f"{p.group} on {p.topic}")
    table.add_row("backfill lag", f"{p.lag:,} records" + ("" if p.started else
                                                         " (not started: reads the topic from its beginning)"))
    if p.switched:
        todo = "nothing: the alias already points to the new collection"
    elif p.rollback:
        todo = ("catch the collection up from its group's committed offsets, compare it with the one in use, then "
                "move the alias back once the group's lag is 0")
    else:
        todo = ("backfill the new collection, compare it with the old one, then move the alias once the backfill "
                "group's lag is 0")
    table.add_row("would do" if dry_run else "will do", todo)
    return table


def shadow_table(r: ShadowReport, sample: int) -> Table:
    """The two collections side by side on the sampled documents."""
    table = Table("", "old", "new", title=f"[bold]shadow check[/] ({r.sampled} of {sample} sampled documents)",
                  title_justify="left")
    table.add_row("rows", f"{r.old_rows:,}", f"{r.new_rows:,}")
    table.add_row("sampled documents held", f"{r.in_old}/{r.sampled}", f"{r.in_new}/{r.sampled}")
    table.add_row("canary cosine (kept vs its model now)", _cosine(r.canary_old), _cosine(r.canary_new))
    if r.overlap_mean is not None:
        table.caption = (f"top-10 neighbours both return, per sampled document: mean {r.overlap_mean:.3f}, "
                         f"min {r.overlap_min:.3f}")
    else:
        table.caption = r.note
    return table


def _cosine(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


class BackfillProgress:
    """A progress bar of the backfill: records done in this run of those done plus the group's lag
    (a broker whose end offsets answer short, like Tansu, shows a total that grows), docs/s, ETA."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(TextColumn("backfill"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=console)
        self._task = self._progress.add_task("backfill", total=None, rate="")
        self._start: float | None = None

    def __enter__(self) -> BackfillProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def update(self, lag: int, backfill: Backfill | LaneWatch) -> None:
        done = backfill.done(lag)
        if self._start is None:
            self._start = time.monotonic()
        elapsed = max(time.monotonic() - self._start, 1e-6)
        self._progress.update(self._task, total=done + lag, completed=done,
                              rate=f"lag {lag:,} · {done / elapsed:,.0f} docs/s")
