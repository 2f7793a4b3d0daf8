"""``embedstream demo``: the whole path on the local stack, with something to look at.

Starts the local stack, builds a corpus from the installed standard library's docstrings (some
texts repeated under new ids, so the cache shows) plus a few long documents (a whole module's
docstrings each, chunked by the worker), adds a few bad records and tombstones, produces it, runs
the worker until the input is drained with a live progress display, then prints a summary table and
a few semantic searches — one of them for a passage deep inside a long document — and stops the
stack.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from connectors.milvus import MilvusReader
from schemas.codec import Document, encode_document
from tools.corpus import long_documents, sample_documents
from tools.dev import LocalStack
from worker.commands.produce import document_record, produce_records
from worker.core.stats import RunStats
from worker.settings import Settings

QUERIES = ("how do I read a file line by line", "parse command-line arguments", "compress data with gzip")
#: How many long documents the demo adds (each several thousand words: tens of chunks).
LONG_DOCUMENTS = 4


def _deep_document() -> Document:
    """The long document the deep search is about: the shortest of the demo's that is a module's
    docstrings (a package README may be a changelog of links)."""
    longs = long_documents(LONG_DOCUMENTS)
    return next((d for d in reversed(longs) if d.metadata["source"].startswith("stdlib ")), longs[-1])


def _outside(doc: Document, corpus: list[Document]) -> list[Document]:
    """``corpus`` without the docstrings of ``doc``'s module."""
    module = doc.metadata["source"].removeprefix("stdlib ")
    return [d for d in corpus if d.metadata["source"] != module and not d.metadata["source"].startswith(module + ".")]


def deep_query(doc: Document) -> str:
    """A query for a passage about four fifths into ``doc``: the first sentence of the paragraph
    there (a truncating embedder never sees it)."""
    paragraphs = [p for p in doc.text.split("\n\n") if len(p.split()) >= 8]
    passage = " ".join(paragraphs[int(len(paragraphs) * 0.8)].split())
    return " ".join(passage.split(". ")[0].split()[:16])


def _bad_records() -> list[tuple[str, bytes | None]]:
    return [
        ("bad-empty", encode_document(Document("bad-empty", "   "))),
        ("bad-json", b'{"id": "bad-json", "text": '),
        ("bad-model", encode_document(Document("bad-model", "hello", model="no-such-model"))),
    ]


def run_demo(console: Console, docs: int = 3000, repeats: float = 0.2, state_dir: Path = Path(".embedstream/demo"),
             keep_stack: bool = False) -> dict:
    """Run the demo; returns the summary figures (also printed)."""
    stack = LocalStack(state_dir)
    with console.status("starting the local stack (broker, Redis, Milvus)…"):
        env, _ = stack.up(partitions=6)
    try:
        return _stream(console, env, docs, repeats)
    finally:
        gc.collect()  # destroy the Kafka clients before their broker goes away (no reconnect noise)
        if not keep_stack:
            stack.down()
            console.print("[green]✓[/] local stack stopped")


def _stream(console: Console, env: dict[str, str], docs: int, repeats: float) -> dict:
    from worker.assembly.runner import build_worker, load_embedder
    from worker.commands.search import search_documents
    from worker.process.logs import setup_logging

    s = Settings(kafka_bootstrap_servers=env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
                 redis_url=env["EMBEDSTREAM_REDIS_URL"], milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
                 kafka={"session.timeout.ms": env["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"]},
                 metrics_port=0, log_level="WARNING", milvus_collection=f"demo_{int(time.time())}")
    setup_logging(s)
    console.print(f"[green]✓[/] local stack up: broker {s.kafka_bootstrap_servers}, Milvus {s.milvus_uri}")

    total = _produce_corpus(console, s, docs, repeats)

    with console.status("loading the model…"):
        embedder = load_embedder(s)
    console.print(f"[green]✓[/] model {embedder.model_id} ({embedder.dim} dims, {embedder.precision} on "
                  f"{embedder.device})")
    columns = [TextColumn("embedding"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TextColumn("cache hits {task.fields[hits]}"), TextColumn("batches {task.fields[batches]}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("w", total=total, rate="", hits="0%", batches=0)

        def progress(st: RunStats) -> None:
            bar.update(task, completed=st.done, rate=f"{st.docs_per_second:,.0f} docs/s",
                       hits=f"{st.cached / max(st.embedded, 1):.0%}", batches=st.batches)

        stats = build_worker(s, embedder=embedder, on_progress=progress).run(stop_when_idle=2.0)
    summary = _summary(s, stats)
    console.print(_summary_table(summary))

    # deep inside a long document (the short ones leave its module out: the passage is nowhere else)
    queries = [*QUERIES, deep_query(_deep_document())]
    hits = search_documents(s, queries, top_k=3, embedder=embedder)
    for q, h in zip(queries, hits):
        table = Table("score", "id", "matched", "from", title=f"search: [bold]{q}[/]", title_justify="left")
        for hit in h:
            where = (f"chunk {hit['chunk'] + 1}/{hit['chunks']}, chars {hit['span'][0]:,}–{hit['span'][1]:,}"
                     if hit["chunks"] > 1 else "whole text")
            table.add_row(f"{hit['score']:.3f}", hit["id"], where, (hit.get("metadata") or {}).get("source", ""))
        console.print(table)
    return summary


def _produce_corpus(console: Console, s: Settings, docs: int, repeats: float) -> int:
    """Build the sample corpus, add tombstones and bad records, produce it all; returns the count."""
    with console.status("building a corpus from the standard library's docstrings…"):
        corpus = (_outside(_deep_document(), sample_documents(docs, repeat_fraction=repeats, prefix="demo"))
                  + long_documents(LONG_DOCUMENTS))
    tombstones = [d.id for d in corpus[:5]]
    bad = _bad_records()
    total = len(corpus) + len(tombstones) + len(bad)
    unique = len({d.text for d in corpus})
    words = sum(len(d.text.split()) for d in corpus[-LONG_DOCUMENTS:])
    console.print(f"[green]✓[/] corpus: {len(corpus):,} documents ({unique:,} distinct texts; {LONG_DOCUMENTS} long "
                  f"ones, {words:,} words), {len(tombstones)} tombstones, {len(bad)} bad records")
    records = [*(document_record(d) for d in corpus), *((key, None) for key in tombstones), *bad]
    with Progress(TextColumn("producing"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("p", total=total)
        produce_records(s.kafka_common(), s.input_topic, records, on_progress=lambda n: bar.update(task, completed=n))
    console.print(f"[green]✓[/] produced {total:,} records to [bold]{s.input_topic}[/]")
    return total


def _summary(s: Settings, stats: RunStats) -> dict:
    from worker.commands.tail import tail_records

    store = MilvusReader(s.milvus_uri, s.milvus_collection)
    vectors = store.count()
    store.close()
    out = sum(1 for _ in tail_records(s, from_beginning=True, timeout=1.5))
    dlq = sum(1 for _ in tail_records(s, topic=s.dlq_topic, from_beginning=True, timeout=1.5,
                                      decode=lambda value, headers: {}))
    return {"documents": stats.embedded, "deleted": stats.deleted,
            "long documents (chunks)": f"{stats.chunked} ({stats.long_chunks})",
            "vectors in Milvus (a row per chunk)": vectors,
            "records on the output topic": out, "dead-lettered": dlq, "cache hits": stats.cached,
            "batches": stats.batches, "seconds (first record → last commit)": round(stats.busy_seconds, 1),
            "docs/s": round(stats.docs_per_second, 1)}


def _summary_table(summary: dict) -> Table:
    table = Table("", "", title="[bold]embedstream demo[/]", title_justify="left", show_header=False)
    for k, v in summary.items():
        table.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    return table
