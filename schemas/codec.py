"""Encode and decode the records of the input and output topics.

Both topics carry *schemaless* Avro (no registry framing): the writer and the reader share the
schema files beside this module, parsed once at import. The input topic also accepts a JSON object
with the same fields (a value whose first byte is ``{``), and a null value is a tombstone.

Everything that cannot be turned into a :class:`Document` raises :class:`DecodeError`, whose
``reason`` is one of the dead-letter reasons of the contract, so the worker can dead-letter the
record without guessing.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import fastavro
import numpy as np

from schemas.errors import DecodeError

SCHEMA_DIR = Path(__file__).resolve().parent


def _without_logical_types(node: Any) -> Any:
    """The same schema with ``logicalType`` dropped: the bytes are identical, but timestamps read as
    plain longs (epoch ms) instead of datetimes the worker would only turn back into longs."""
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(v) for v in node]
    return node


_DOCUMENT_JSON = json.loads((SCHEMA_DIR / "document.avsc").read_text())
_EMBEDDING_JSON = json.loads((SCHEMA_DIR / "embedding.avsc").read_text())
DOCUMENT_SCHEMA = fastavro.parse_schema(_DOCUMENT_JSON)
EMBEDDING_SCHEMA = fastavro.parse_schema(_EMBEDDING_JSON)
_DOCUMENT_READER = fastavro.parse_schema(_without_logical_types(_DOCUMENT_JSON))
_EMBEDDING_READER = fastavro.parse_schema(_without_logical_types(_EMBEDDING_JSON))


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class Document:
    """One document of the input topic. ``event_time`` is epoch milliseconds or None."""

    id: str
    text: str
    model: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    event_time: int | None = None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A key with a null value: delete ``id`` downstream."""

    id: str


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        # integer arithmetic: float timestamps lose a millisecond now and then
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


def encode_document(doc: Document) -> bytes:
    """Avro bytes of ``doc`` (schemaless, ``schemas/document.avsc``)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        DOCUMENT_SCHEMA,
        {
            "id": doc.id,
            "text": doc.text,
            "model": doc.model,
            "metadata": doc.metadata,
            "event_time": doc.event_time,
        },
    )
    return buf.getvalue()


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"record key is not valid UTF-8: {exc}") from None


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DecodeError("decode_error", f"'metadata' must be an object, got {type(raw).__name__}")
    out: dict[str, str] = {}
    for k, v in raw.items():
        # JSON producers send numbers and booleans; keep them as their JSON text, as the schema
        # (map<string>) asks for strings.
        out[str(k)] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return out


def document_from_json(value: bytes, key: str | None) -> Document:
    """A :class:`Document` from JSON bytes (``key`` fills a missing id). Raises :class:`DecodeError`."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"JSON value is not valid UTF-8: {exc}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecodeError("decode_error", f"value is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise DecodeError("decode_error", f"JSON value must be an object, got {type(obj).__name__}")
    doc_id = obj.get("id", key)
    if doc_id is None or doc_id == "":
        doc_id = key
    if not isinstance(doc_id, str) or not doc_id:
        raise DecodeError("decode_error", "JSON document has no string 'id' and the record has no key")
    body = obj.get("text")
    if not isinstance(body, str):
        raise DecodeError("decode_error", f"'text' must be a string, got {type(body).__name__}")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise DecodeError("decode_error", f"'model' must be a string or null, got {type(model).__name__}")
    event_time = obj.get("event_time")
    if event_time is not None and (isinstance(event_time, bool) or not isinstance(event_time, int)):
        raise DecodeError("decode_error", "'event_time' must be epoch milliseconds (an integer) or null")
    return Document(doc_id, body, model, _metadata(obj.get("metadata")), event_time)


def _read_avro(value: bytes, schema, what: str) -> dict[str, Any]:
    """One schemaless record of ``schema`` that must span all of ``value``; DecodeError otherwise."""
    buf = io.BytesIO(value)
    try:
        rec = fastavro.schemaless_reader(buf, schema)
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"Avro string is not valid UTF-8: {exc}") from None
    except (EOFError, StopIteration):
        raise DecodeError("decode_error", "Avro value is truncated (ended before the record did)") from None
    except Exception as exc:  # fastavro raises many types on garbage (IndexError, ValueError, ...)
        raise DecodeError("decode_error", f"value is not a {what} record: {exc!r}") from None
    if buf.tell() != len(value):
        raise DecodeError(
            "decode_error",
            f"value has {len(value) - buf.tell()} trailing bytes after the Avro record (wrong schema?)",
        )
    if not isinstance(rec, dict):
        raise DecodeError("decode_error", f"value is not a {what} record")
    return rec


def _from_avro(value: bytes, key: str | None) -> Document:
    rec = _read_avro(value, _DOCUMENT_READER, "document.avsc")
    doc_id = rec["id"] or key
    if not doc_id:
        raise DecodeError("decode_error", "document has an empty 'id' and the record has no key")
    return Document(doc_id, rec["text"], rec["model"], dict(rec["metadata"] or {}), _ms(rec["event_time"]))


def decode_document(key: bytes | None, value: bytes | None) -> Document | Tombstone:
    """Decode one input record.

    Returns a :class:`Tombstone` for a null value, else a :class:`Document` (from JSON when the
    value starts with ``{``, from Avro otherwise). Raises :class:`DecodeError` when the record can
    never be decoded. Never raises anything else for any input bytes.
    """
    key_text = _key_text(key)
    if value is None:
        if not key_text:
            raise DecodeError("decode_error", "tombstone (null value) without a key: nothing to delete")
        return Tombstone(key_text)
    if value[:1] == b"{":
        return document_from_json(value, key_text)
    return _from_avro(value, key_text)


def _long(n: int) -> bytes:
    """Avro int/long: zig-zag, then base-128 varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _long(len(raw)) + raw


def encode_embedding(record: dict[str, Any]) -> bytes:
    """Avro bytes of an output record (a dict with the fields of ``schemas/embedding.avsc``).

    Written by hand for this one fixed schema (the bytes fastavro would write, checked by the
    tests): the worker encodes one per document, and the 384-float vector goes out as one numpy
    buffer instead of 384 Python floats (the largest cost of the sink stage when profiled).
    """
    vec = np.ascontiguousarray(record["vector"], dtype="<f4")
    metadata = record["metadata"] or {}
    parts = [
        _string(record["id"]),
        _string(record["model"]),
        _long(record["dim"]),
        (_long(vec.shape[0]) + vec.tobytes() + b"\x00") if vec.shape[0] else b"\x00",
        _string(record["content_hash"]),
        b"\x01" if record["cached"] else b"\x00",
        _string(record["source_topic"]),
        _long(record["source_partition"]),
        _long(record["source_offset"]),
    ]
    if metadata:
        parts.append(_long(len(metadata)))
        for k, v in metadata.items():
            parts.append(_string(k))
            parts.append(_string(v))
    parts.append(b"\x00")
    parts.append(_long(_ms(record["embedded_at"]) or 0))
    parts.append(_long(record.get("chunk_index", 0)))
    parts.append(_long(record.get("chunk_count", 1)))
    parts.append(_long(record.get("span_start", 0)))
    parts.append(_long(record.get("span_end", -1)))
    return b"".join(parts)


def decode_embedding(value: bytes) -> dict[str, Any]:
    """Decode an output record; ``embedded_at`` comes back as epoch milliseconds.

    Raises :class:`DecodeError` on bytes that are not an ``embedding.avsc`` record."""
    return _read_avro(value, _EMBEDDING_READER, "embedding.avsc")
