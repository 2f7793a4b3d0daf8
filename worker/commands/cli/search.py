"""``embedstream search``: the best documents for a query, dense, sparse or hybrid."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from schemas.errors import ConfigError, TransientError
from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    console,
    fail,
    settings_or_exit,
)
from worker.commands.shown import shown


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
    table = Table("#", "score", "id", "matched", "excerpt", "metadata", title=f"[bold]{shown(query)}[/]",
                  title_justify="left")
    for rank, h in enumerate(hits, 1):
        meta = ", ".join(f"{k}={v}" for k, v in (h.get("metadata") or {}).items())
        chunks, (start, end) = h.get("chunks", 1), h.get("span", (0, -1))
        where = f"chunk {h.get('chunk', 0) + 1}/{chunks}, chars {start}–{end}" if chunks > 1 else "whole text"
        excerpt = " ".join((h.get("excerpt") or "").split())
        also = h.get("also") or []
        ids = h["id"] + (f" (same text: {', '.join(also[:3])}{', …' if len(also) > 3 else ''})" if also else "")
        table.add_row(str(rank), f"{h['score']:.3f}", shown(ids), where,
                      shown(excerpt[:70] + ("…" if len(excerpt) > 70 else "")), shown(meta[:60]))
    return table
