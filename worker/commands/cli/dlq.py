"""``embedstream dlq``: the dead letters by reason (``summary``), one by one (``show``), and sent back to
the input topic once their cause is fixed (``replay``). ``worker.commands.dead_letters`` says how."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from worker.commands import options as opt
from worker.commands.cli.app import app, console, err, fail, settings_or_exit

dlq_app = typer.Typer(help="The dead-letter topic: what was dead-lettered and why (summary), each record (show), "
                      "and a replay to the input topic once the cause is fixed (replay).", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")

Reasons = Annotated[list[str] | None, typer.Option(
    "--reason", metavar="REASON", help="Only this reason (repeatable)")]
Keys = Annotated[list[str] | None, typer.Option(
    "--key", metavar="KEY", help="Only the dead letters of this key (repeatable)")]
Partition = Annotated[int | None, typer.Option(help="Only this partition of the DLQ topic", min=0)]
Offsets = Annotated[str | None, typer.Option(
    metavar="A-B", help="Only these DLQ offsets: A-B, A- or -B (inclusive)")]
SETTINGS = ("kafka_bootstrap_servers", "dlq_topic")


def _selection(reasons, keys, partition, offsets):
    from worker.commands.dead_letters import REASONS, Selection, parse_offsets

    unknown = sorted(set(reasons or ()) - set(REASONS))
    if unknown:
        raise fail(f"no such reason: {', '.join(unknown)} (the reasons: {', '.join(REASONS)})", 2)
    try:
        first, last = parse_offsets(offsets) if offsets else (None, None)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    return Selection(frozenset(reasons or ()), frozenset(keys or ()), partition, first, last)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms > 0 else "—"


def _read(s, select) -> list:
    from worker.commands.dead_letters import dead_letters

    try:
        return list(dead_letters(s, select))
    except RuntimeError as exc:
        raise fail(str(exc)) from None


@dlq_app.command("summary")
@opt.with_settings(*SETTINGS)
def summary(
    reasons: Reasons = None, keys: Keys = None, partition: Partition = None, offsets: Offsets = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """The dead letters by reason: how many, the first and the last (DLQ offset and time), the input
    partitions they came from, and what fixes that reason."""
    from worker.commands.dead_letters import REASONS, summarise

    select = _selection(reasons, keys, partition, offsets)
    s = settings_or_exit(overrides)
    by = summarise(_read(s, select))
    if as_json:
        print(json.dumps({reason: {
            "count": r.count, "replay": REASONS[reason].replay if reason in REASONS else None,
            "first": {"partition": r.first.partition, "offset": r.first.offset, "timestamp": r.first.timestamp_ms},
            "last": {"partition": r.last.partition, "offset": r.last.offset, "timestamp": r.last.timestamp_ms},
            "source_partitions": sorted(r.source_partitions),
            "fix": REASONS[reason].fix if reason in REASONS else None}
            for reason, r in by.items() if r.first and r.last}, indent=2))
        return
    if not by:
        console.print(f"no dead letters on {escape(s.dlq_topic)}")
        return
    table = Table("reason", "count", "first", "last", "last at", "from partitions", "replay?",
                  title=f"dead letters on [bold]{escape(s.dlq_topic)}[/]", title_justify="left")
    table.columns[0].no_wrap = True
    for reason, r in by.items():
        assert r.first is not None and r.last is not None
        known = REASONS.get(reason)
        table.add_row(escape(reason), f"{r.count:,}", f"{r.first.partition}:{r.first.offset}",
                      f"{r.last.partition}:{r.last.offset}", _when(r.last.timestamp_ms),
                      ", ".join(map(str, sorted(r.source_partitions))) or "—",
                      ("after the fix" if known.replay else "no") if known else "—")
    table.add_section()
    table.add_row("total", f"[bold]{sum(r.count for r in by.values()):,}[/]")
    console.print(table)
    console.print("first and last: DLQ partition:offset. The fix for each reason:")
    for reason in by:
        known = REASONS.get(reason)
        console.print(f"  [bold]{escape(reason)}[/]: "
                      + (f"{escape(known.cause)}. Fix: {escape(known.fix)}" if known else "a reason this version "
                         "does not know"))


@dlq_app.command("show")
@opt.with_settings(*SETTINGS)
def show(
    reasons: Reasons = None, keys: Keys = None, partition: Partition = None, offsets: Offsets = None,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N dead letters", min=1)] = None,
    overrides: dict[str, object] | None = None,
) -> None:
    """Each dead letter as one JSON line: where it is, its reason and message, the input record it was,
    its key and value (as text where they are UTF-8), the value read as a document where it reads as
    one (JSON or the schema's Avro), and the producer's headers."""
    from worker.commands.dead_letters import as_document, as_text, dead_letters

    select = _selection(reasons, keys, partition, offsets)
    s = settings_or_exit(overrides)
    try:
        for n, d in enumerate(dead_letters(s, select)):
            if max_records is not None and n >= max_records:
                break
            src = d.source
            print(json.dumps({
                "partition": d.partition, "offset": d.offset, "timestamp": d.timestamp_ms, "reason": d.reason,
                "message": d.message,
                "source": {"topic": src[0], "partition": src[1], "offset": src[2]} if src else None,
                "key": as_text(d.key), "value": as_text(d.value), "document": as_document(d.key, d.value),
                "headers": {name: as_text(value, 200) for name, value in d.original_headers()},
                **({"replay_of": d.replay_of} if d.replay_of else {})}, ensure_ascii=False), flush=True)
    except RuntimeError as exc:
        raise fail(str(exc)) from None


@dlq_app.command("replay")
@opt.with_settings("kafka_bootstrap_servers", "dlq_topic", "input_topic")
def replay(
    reasons: Reasons = None, keys: Keys = None, partition: Partition = None, offsets: Offsets = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be replayed; produce nothing")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Also replay dead letters of a reason the same record cannot pass, and those that "
        "failed again after a replay (never one already replayed)")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Produce the selected dead letters to the input topic again, once their cause is fixed: the
    producer's key, value and headers (the worker's own dropped) and an embedstream.replayed marker
    naming the dead letter. Each dead letter at most once: one already replayed is skipped, and so is one
    whose key was updated or deleted on the input topic after it."""
    from worker.commands.dead_letters import plan_replay
    from worker.commands.dead_letters import replay as produce_again

    select = _selection(reasons, keys, partition, offsets)
    s = settings_or_exit(overrides)
    letters = _read(s, select)
    try:
        plan = plan_replay(s, letters, force=force)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    for what, left in (("already replayed", plan.already),
                       ("with a later record of their key on the input topic (the replay would be older)",
                        plan.superseded),
                       ("failed again after a replay (--force replays them)",
                                                             plan.failed_again),
                       ("of a reason the same record cannot pass (--force replays them)", plan.never)):
        if left:
            err.print(f"{len(left):,} {what}: skipped")
    verb = "would replay" if dry_run else "replaying"
    err.print(f"{verb} {len(plan.send):,} of {len(letters):,} selected dead letters to {escape(s.input_topic)}")
    if dry_run or not plan.send:
        return
    try:
        sent = produce_again(s, plan.send)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    console.print(f"replayed {sent:,} dead letters to {escape(s.input_topic)}")
