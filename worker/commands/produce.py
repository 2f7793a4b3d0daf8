"""``embedstream produce``: documents from a file into the input topic.

Formats (by extension, or ``--format``): JSONL (``{"id", "text", "metadata", "model",
"event_time"}`` per line), CSV (``id`` and ``text`` columns, every other column → metadata) and
plain text (one document a line; the id is a stable hash of the text).
"""

from __future__ import annotations

import csv
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from connectors.kafka import DeliveryBatch, make_producer
from schemas.codec import DecodeError, Document, document_from_json, encode_document

FORMATS = ("jsonl", "csv", "text")


class BadLine(ValueError):
    """A line of the input file that is not a document; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    return "text"


def text_id(text: str) -> str:
    """The stable id of a plain-text document: 20 hex digits of the sha256 of its text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def _jsonl(path: Path) -> Iterator[tuple[int, Document | BadLine]]:
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                yield n, document_from_json(raw, None)
            except DecodeError as exc:
                yield n, BadLine(n, exc.message)


#: The most characters a CSV field may hold by default (the worker's default hard limit on a value).
CSV_FIELD_LIMIT = 1_000_000


def _csv(path: Path, field_limit: int = CSV_FIELD_LIMIT) -> Iterator[tuple[int, Document | BadLine]]:
    """The documents of a CSV file. A row with a field over ``field_limit`` characters, bytes that are not
    UTF-8, or the wrong number of fields is a :class:`BadLine` with its reason, never an exception."""
    previous = csv.field_size_limit(field_limit)  # the csv module's limit is the process's: put back after
    try:
        yield from _csv_rows(path, field_limit)
    finally:
        csv.field_size_limit(previous)


def _csv_rows(path: Path, field_limit: int) -> Iterator[tuple[int, Document | BadLine]]:
    # surrogateescape: an invalid byte is read as a lone surrogate, and its row alone is refused
    with path.open(newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.DictReader(fh)
        try:
            names = reader.fieldnames
        except csv.Error as exc:
            raise BadLine(1, f"CSV header: {exc}") from None
        if not names or "text" not in names:
            raise BadLine(1, f"CSV header must have a 'text' column (and usually 'id'); got {names}")
        if not _utf8(names):
            raise BadLine(1, "CSV header is not valid UTF-8")
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # a field over the limit (the rest of its line is dropped with it)
                yield reader.line_num, BadLine(reader.line_num, f"{exc} (a field holds at most {field_limit:,} "
                                                                "characters: EMBEDSTREAM_MAX_TEXT_BYTES)")
                continue
            n = reader.line_num
            if None in row:
                yield n, BadLine(n, "more fields than the header has")
                continue
            text = row.pop("text")
            if text is None:
                yield n, BadLine(n, "fewer fields than the header has")
                continue
            if not _utf8([text, *row.values()]):
                yield n, BadLine(n, "not valid UTF-8")
                continue
            doc_id = row.pop("id", None) or text_id(text)
            yield n, Document(doc_id, text, None, {k: v or "" for k, v in row.items()})


def _utf8(fields: Iterable[str | None]) -> bool:
    """Whether no field holds a byte that was not UTF-8 (read as a lone surrogate)."""
    try:
        for f in fields:
            if f:
                f.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(path: Path) -> Iterator[tuple[int, Document | BadLine]]:
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                yield n, BadLine(n, f"not valid UTF-8: {exc}")
                continue
            if text.strip():
                yield n, Document(text_id(text), text)


def split_formats(formats: list[str]) -> tuple[str | None, str]:
    """``--format`` values → (the file's format or None for "from the extension", the records'
    format, ``avro`` unless given). Raises ``ValueError`` on an unknown or twice-given kind."""
    from worker.commands.wire import FORMATS as WIRE

    files = [f for f in formats if f in FORMATS]
    wires = [f for f in formats if f in WIRE]
    unknown = [f for f in formats if f not in FORMATS and f not in WIRE]
    if unknown or len(files) > 1 or len(wires) > 1:
        raise ValueError(f"--format {' '.join(formats)}: give at most one file format ({', '.join(FORMATS)}) "
                         f"and one record format ({', '.join(WIRE)})")
    return (files[0] if files else None), (wires[0] if wires else "avro")


def read_documents(path: Path, fmt: str | None = None,
                   field_limit: int = CSV_FIELD_LIMIT) -> Iterator[tuple[int, Document | BadLine]]:
    """Yield ``(line number, Document or BadLine)`` for each document-bearing line of ``path``
    (``field_limit``: the most characters of a CSV field)."""
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return _csv(path, field_limit)
    return {"jsonl": _jsonl, "text": _text}[fmt](path)


@dataclass
class ProduceResult:
    produced: int = 0
    skipped: int = 0
    seconds: float = 0.0


#: A record as the producing helpers take it: key and value (None: a tombstone).
Record = tuple[str, bytes | None]


def document_record(doc: Document, stamp: bool = True,
                    encode: Callable[[Document], bytes] = encode_document) -> Record:
    """The input-topic record of ``doc``: keyed by id, its value by ``encode`` (schemaless Avro
    unless given; ``worker.commands.wire`` has the others); ``stamp`` fills a missing ``event_time`` with now
    (end-to-end latency is measured from it)."""
    if stamp and doc.event_time is None:
        doc = Document(doc.id, doc.text, doc.model, doc.metadata, int(time.time() * 1000))
    return doc.id, encode(doc)


def produce_records(common: Mapping[str, object], topic: str, records: Iterable[Record], *,
                    rate: float | None = None, delivery_timeout_s: float = 30.0,
                    on_progress: Callable[[int], None] = lambda _n: None, **producer_conf: object) -> ProduceResult:
    """Produce ``records`` to ``topic`` with an idempotent producer and wait until the broker has
    acknowledged every one. ``rate`` (records/s) paces an open-loop stream; ``producer_conf`` adds
    librdkafka properties. Raises ``schemas.errors.TransientError`` when acknowledgements fail."""
    producer = make_producer(common, delivery_timeout_s, defaults={"compression.type": "lz4"},  # texts compress
                             **producer_conf)
    delivery = DeliveryBatch(producer, delivery_timeout_s)
    result = ProduceResult()
    start = time.monotonic()
    try:
        pending = iter(records)
        while True:
            if rate:  # pace before taking the next record, so a record stamped as it is taken goes out at once
                wait = start + result.produced / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            record = next(pending, None)
            if record is None:
                break
            key, value = record
            delivery.produce(topic, key.encode("utf-8"), value)
            result.produced += 1
            producer.poll(0)
            if result.produced % 256 == 0:
                on_progress(result.produced)
        delivery.confirm()
    finally:
        # Closed here, not left to the garbage collector: a producer outliving its broker (tests,
        # the demo) keeps reconnecting and logging. close() flushes without a deadline, so whatever
        # was not acknowledged (a failure) is purged first.
        producer.purge()
        producer.close()
    on_progress(result.produced)
    result.seconds = time.monotonic() - start
    return result


def good_documents(lines: Iterable[tuple[int, Document | BadLine]], skipped: list[int]) -> Iterator[Document]:
    """The documents of ``lines``; a :class:`BadLine` is counted (its line number appended to
    ``skipped``) and left out."""
    for line, doc in lines:
        if isinstance(doc, BadLine):
            skipped.append(line)
        else:
            yield doc


def count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)
