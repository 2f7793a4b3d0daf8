"""``embedstream erase ID…``: tombstones for documents, applied by the running workers, and a receipt of
every copy (``worker.commands.erase`` says how)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from worker.commands import options as opt
from worker.commands.cli.app import app, console, err, fail, settings_or_exit
from worker.commands.erase import Receipt, lifetime


@app.command("erase")
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "milvus_uri",
                   "milvus_collection", "milvus_alias", "model", "precision", "device", "truncate_dim", "sparse")
def erase(
    ids: Annotated[list[str], typer.Argument(metavar="ID...", help="The document ids to erase (each as its key)")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the workers to apply the tombstones",
                                           min=1)] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the receipt as JSON instead of a table")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Erase documents from every copy: produce a tombstone per id to the input topic, wait until the
    running workers applied them (each model's collection holds no row of the id and keeps the
    delete's version), remove what the cache still holds of their texts, find their tombstones on
    the output topic, and print a receipt, with what stays by design (the input topic until
    compaction, dead letters until the DLQ's retention). The models are loaded as the worker loads
    them (a cache key holds the model's cache id); Redis is EMBEDSTREAM_REDIS_URL's, as the worker's.
    Exit 0 when every copy is gone, 1 when the workers did not apply them in time or a copy is left."""
    from worker.commands.erase import erase as run_erasure

    s = settings_or_exit(overrides)
    try:
        with err.status(f"producing {len(ids)} tombstones to {escape(s.input_topic)}") as status:
            def waiting(applied: int, total: int) -> None:
                status.update(f"waiting for the workers to apply the tombstones: {applied} of {total}")

            receipt = run_erasure(s, ids, timeout, waiting)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(json.dumps(as_dict(receipt), indent=2, ensure_ascii=False))
    else:
        show(receipt)
    if not receipt.complete:
        raise typer.Exit(1)


def as_dict(r: Receipt) -> dict:
    return {"complete": r.complete, "waited_s": round(r.waited_s, 1), "ids": [{
        "id": e.id, "tombstone": {"topic": r.input_topic, "partition": e.partition, "offset": e.offset},
        "applied": e.applied,
        "output_tombstone": {"topic": r.output_topic, "partition": e.output[0], "offset": e.output[1]}
        if e.output else None,
        "dead_letters": e.dead_letters,
        "models": [{"model": c.model, "collection": c.collection, "chunk_rows_before": c.chunks,
                    "chunk_rows_left": c.rows_left, "version_kept": c.version_kept,
                    "cache_entries_before": len(c.cached), "cache_entries_removed_by_erase": c.cache_removed_here,
                    "cache_entries_left": len(c.cache_left)} for c in e.copies]} for e in r.ids],
        "stays": {"input_topic": {"topic": r.input_topic, **r.topics.get(r.input_topic, {})},
                  "dlq_topic": {"topic": r.dlq_topic, **r.topics.get(r.dlq_topic, {})}}}


def show(r: Receipt) -> None:
    table = Table("id", "model", "tombstone", "chunk rows", "version kept", "cache entries", "output tombstone",
                  title="erasure receipt", title_justify="left")
    for e in r.ids:
        for k, c in enumerate(e.copies):
            rows = (f"{c.chunks} → {c.rows_left}" if c.rows_left is not None else f"{c.chunks} → ?")
            cache = f"{len(c.cached)} → {len(c.cache_left)}" + (f" ({c.cache_removed_here} removed here)"
                                                                if c.cache_removed_here else "")
            output = f"{e.output[0]}:{e.output[1]}" if e.output else "[red]not found[/]"
            table.add_row(escape(e.id) if k == 0 else "", escape(c.model or "—"),
                          f"{e.partition}:{e.offset}" if k == 0 else "",
                          rows, f"offset {c.version_kept}" if c.version_kept is not None else "[red]not yet[/]",
                          cache, output if k == 0 else "")
    console.print(table)
    if not all(e.applied for e in r.ids):
        console.print(f"[red]not applied within {r.waited_s:.0f} s[/]: is a worker running on "
                      f"{escape(r.input_topic)}? Run the same command again once it is: the tombstones are "
                      "applied in order, and a second erasure of an id is harmless.")
    console.print("What stays by design:")
    console.print(f"  the input topic {escape(r.input_topic)}: the documents' records "
                  f"{lifetime(r.topics.get(r.input_topic), 'records')}; "
                  f"{lifetime(r.topics.get(r.input_topic), 'tombstones')}")
    letters = sum(e.dead_letters for e in r.ids)
    console.print(f"  the DLQ topic {escape(r.dlq_topic)}: {letters} dead letters of these ids, "
                  f"{lifetime(r.topics.get(r.dlq_topic), 'records')}")
