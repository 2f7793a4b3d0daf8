"""``embedstream migrate``: change the model without downtime."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from schemas.errors import ConfigError, TransientError
from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    err,
    fail,
    settings_or_exit,
)
from worker.commands.shown import shown

NewModel = Annotated[str, typer.Option("--model", help="The new model (path or name) to re-embed every document "
                                                        "with")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would be done; change nothing")]
MinOverlap = Annotated[float | None, typer.Option(
    help="Refuse to switch when the mean top-10 neighbour overlap of the shadow check is below this", min=0, max=1)]
DropOld = Annotated[bool, typer.Option(
    "--drop-old", help="After the switch, drop the alias's other collections (once no worker writes them)")]
Sample = Annotated[int, typer.Option(help="Documents sampled by the shadow check", min=1)]
Lane = Annotated[bool, typer.Option(
    "--lane", help="Start no backfill: the live workers run it as a lane of their own (EMBEDSTREAM_BACKFILL_MODEL set "
    "to --model); wait for its lag to reach 0, then compare and switch")]
Rollback = Annotated[bool, typer.Option(
    "--rollback", help="Move the alias back to --model's collection, one it pointed to before (kept: not dropped): "
    "it first catches up from the group that wrote it, then the same shadow check, then the switch")]
BackfillGroup = Annotated[str | None, typer.Option(
    "--backfill-group", help="Consumer group of the backfill [default: <group id>.migrate.<new collection>]")]


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "backfill_output_topic", "group_id", "precision",
                   "device", "milvus_uri", "milvus_collection", "milvus_alias")
def migrate(model: NewModel, dry_run: DryRun = False, min_overlap: MinOverlap = None, drop_old: DropOld = False,
            sample: Sample = 50, lane: Lane = False, rollback: Rollback = False,
            backfill_group: BackfillGroup = None, overrides: dict[str, object] | None = None) -> None:
    """Re-embed the input topic into a new collection with --model while the live workers keep
    serving the old one; once caught up, compare the two and move the alias readers query.

    Run it with the live deployment's settings (EMBEDSTREAM_MODEL = the model in use). The backfill
    group reads the topic from its beginning, so the topic must keep every live document (compacted,
    keyed by id). Killed or interrupted, a re-run resumes where the backfill group stopped. After the
    switch, move the workers to the new model in the backfill group (it printed which), then drop the
    old collection with --drop-old. With --lane the live workers backfill (EMBEDSTREAM_BACKFILL_MODEL,
    their model going first) and migrate only waits, compares and switches. With --rollback, --model is
    the model to go back to: its collection catches up from the group that wrote it (what changed since
    the hand-over), is compared with the one in use, and the alias moves back. Exit 0: switched (or
    nothing to do); 1: not switched, or the backfill failed (the line says why); 2: a setting to fix;
    130: interrupted (a re-run resumes).
    """
    from worker.commands import migrate as mig
    from worker.commands.migrate_view import BackfillProgress, plan_table, shadow_table
    from worker.process.logs import setup_logging

    s = settings_or_exit(overrides, log_level=None if "EMBEDSTREAM_LOG_LEVEL" in os.environ else "WARNING")
    setup_logging(s)
    if rollback and lane:
        raise fail("--rollback catches the old collection up with a worker of its own: leave out --lane", 2)
    try:
        m = mig.plan(s, model, backfill_group, rollback=rollback)
    except (ConfigError, TransientError) as exc:
        raise fail(str(exc), 2) from None
    console.print(plan_table(m.plan, dry_run))
    for warning in m.plan.warnings:
        err.print(f"[yellow]warning:[/] {shown(warning)}")
    if dry_run:
        return
    with BackfillProgress(err) as progress:
        try:
            switched = mig.run(m, sample=sample, min_overlap=min_overlap, drop=drop_old, lane=lane,
                               on_lag=progress.update,
                               on_report=lambda r: console.print(shadow_table(r, sample)), say=console.print)
        except (ConfigError, TransientError, mig.LaneEnded) as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise fail("interrupted: the alias stays where it was; the backfill's progress is committed and a "
                       "re-run resumes it", 130) from None
    if not switched:
        raise typer.Exit(1)
    if not drop_old:
        unset = " and EMBEDSTREAM_BACKFILL_MODEL unset" if lane else ""
        console.print(f"next: run the workers with EMBEDSTREAM_MODEL={model} and EMBEDSTREAM_GROUP_ID={m.plan.group}"
                      f"{unset} (that group has consumed the topic up to the switch), then "
                      f"`embedstream migrate --model {model} --drop-old` drops the old collection")
