"""``embedstream produce``: documents from a file into the input topic."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from schemas.errors import TransientError
from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    err,
    fail,
    require_or_exit,
    settings_or_exit,
)

File = Annotated[Path, typer.Argument(help="JSONL, CSV (id,text,...) or plain text (one document a line); - reads "
                                           "standard input (JSONL unless --format says otherwise)",
                                      dir_okay=False, allow_dash=True)]
Formats = Annotated[list[str] | None, typer.Option(
    "--format", help="The file's format, jsonl|csv|text (default: from the extension), and/or the records' format, "
    "avro|avro-registry|json (default: avro, schemaless); give --format twice for both, e.g. --format csv --format "
    "avro-registry")]
Rate = Annotated[float | None, typer.Option(help="Produce at this many documents per second", min=0.001)]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Skip malformed lines (counted) instead of stopping at "
                                       "the first")]


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "input_topic", "schema_registry_url")
def produce(file: File, formats: Formats = None, rate: Rate = None, skip_bad: SkipBad = False,
            overrides: dict[str, object] | None = None) -> None:
    """Produce the documents of FILE to the input topic, keyed by id (idempotent producer).

    JSONL lines are {"id", "text", "metadata", "model", "event_time"}; CSV needs a text
    column (an id column too, or ids are hashes of the text; other columns become metadata);
    plain text is one document a line with a stable hash as id. With --format avro-registry the
    values are framed by confluent-kafka's AvroSerializer (schema registered under <topic>-value).

    Example: echo '{"id": "a", "text": "hello"}' | embedstream produce -
    """
    from worker.commands.produce import (
        BadLine,
        count_lines,
        document_record,
        good_documents,
        read_documents,
        split_formats,
    )
    from worker.commands.wire import document_encoder

    s = settings_or_exit(overrides)
    require_or_exit(s, "kafka_bootstrap_servers")
    spooled = None
    shown = "standard input" if str(file) == "-" else str(file)
    try:
        fmt, wire = split_formats(formats or [])
        file, fmt, spooled = _input(file, fmt)
        encode = document_encoder(wire, s, s.input_topic)
        if not skip_bad:  # find a bad line before producing anything, so a fixed file can simply be re-run
            for _line, doc in read_documents(file, fmt, s.max_text_bytes):
                if isinstance(doc, BadLine):
                    raise doc
        skipped: list[int] = []
        docs = good_documents(read_documents(file, fmt, s.max_text_bytes), skipped)
        result = _produce_with_bar(s, (document_record(d, encode=encode) for d in docs), count_lines(file), rate)
        result.skipped = len(skipped)
    except BadLine as exc:
        raise fail(f"{shown}: {exc} (use --skip-bad to skip such lines)") from None
    except (ValueError, TransientError) as exc:
        raise fail(str(exc)) from None
    finally:
        if spooled is not None:
            spooled.unlink(missing_ok=True)
    _say_produced(result, s.input_topic)


def _produce_with_bar(s, records, lines: int, rate: float | None):
    """Produce ``records`` to the input topic behind a progress bar of ``lines``; the result."""
    from worker.commands.produce import produce_records

    with Progress(TextColumn("[bold]producing[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("docs"),
                  TimeRemainingColumn(), console=err, transient=False) as bar:
        task = bar.add_task("produce", total=lines)
        result = produce_records(s.kafka_common(), s.input_topic, records, rate=rate,
                                 delivery_timeout_s=s.kafka_timeout_seconds,
                                 on_progress=lambda n: bar.update(task, completed=n))
        bar.update(task, total=result.produced, completed=result.produced)
    return result


def _input(file: Path, fmt: str | None) -> tuple[Path, str | None, Path | None]:
    """The file to read and its format; ``-`` is standard input, spooled to a temporary file (read twice:
    checked, then produced; and counted), which is also returned for the caller to remove."""
    if str(file) == "-":
        spooled = _spool_stdin()
        return spooled, fmt or "jsonl", spooled
    if not file.is_file():
        raise ValueError(f"{file}: no such file (give - to read standard input)")
    return file, fmt, None


def _spool_stdin() -> Path:
    """Standard input, copied to a temporary file whose path is returned (the caller removes it)."""
    import shutil
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="embedstream-produce-", suffix=".stdin", delete=False) as out:
        shutil.copyfileobj(sys.stdin.buffer, out)
    return Path(out.name)


def _say_produced(result, topic: str) -> None:
    rate_done = result.produced / result.seconds if result.seconds else float("inf")
    err.print(f"produced [bold]{result.produced}[/] documents to [bold]{topic}[/] "
              f"in {result.seconds:.1f}s ({rate_done:,.0f} docs/s)"
              + (f", skipped [yellow]{result.skipped}[/] malformed lines" if result.skipped else ""))
