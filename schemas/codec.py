"""Encode and decode the records of the input and output topics.

By default both topics carry *schemaless* Avro: the writer and the reader share the schema files
beside this module, parsed once at import. The input topic also accepts a JSON object with the same
fields (a value whose first byte is ``{``) and, with a schema registry, registry-framed Avro written
with any schema that resolves against ``document.avsc`` (read through a :class:`FramedReader`); a
null value is a tombstone. The record key is the document's identity (:func:`key_id`).

Everything that cannot be turned into a :class:`Document` raises :class:`DecodeError`, whose
``reason`` is one of the dead-letter reasons of the contract, so the worker can dead-letter the
record without guessing.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import fastavro
import numpy as np
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.document_reader import MAX_METADATA_ENTRIES, MetadataTooLarge, read_document
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


#: The schema files' text, as a schema registry takes them.
DOCUMENT_SCHEMA_TEXT = (SCHEMA_DIR / "document.avsc").read_text()
EMBEDDING_SCHEMA_TEXT = (SCHEMA_DIR / "embedding.avsc").read_text()
_DOCUMENT_JSON = json.loads(DOCUMENT_SCHEMA_TEXT)
_EMBEDDING_JSON = json.loads(EMBEDDING_SCHEMA_TEXT)
DOCUMENT_SCHEMA = fastavro.parse_schema(_DOCUMENT_JSON)
EMBEDDING_SCHEMA = fastavro.parse_schema(_EMBEDDING_JSON)
_DOCUMENT_READER = fastavro.parse_schema(_without_logical_types(_DOCUMENT_JSON))
_EMBEDDING_READER = fastavro.parse_schema(_without_logical_types(_EMBEDDING_JSON))

#: How many of ``embedding.avsc``'s fields each release wrote, oldest first. Fields are only ever
#: appended, with defaults, so every earlier writer schema is a prefix of the file's.
EMBEDDING_FIELD_HISTORY = (11, 15, 17, 18)
#: The header of a schemaless (``avro``) output record that names the schema that wrote it: the
#: CRC-64-AVRO fingerprint of its Parsing Canonical Form, as 16 hex digits (``fastavro.schema.fingerprint``;
#: the fingerprint Avro's single-object encoding carries). A reader picks the writer schema by it.
SCHEMA_HEADER = "embedstream.schema"


def _fingerprint(schema_json: dict) -> str:
    return fingerprint(to_parsing_canonical_form(schema_json), "CRC-64-AVRO")


def _prefix(n: int) -> dict:
    return {**_EMBEDDING_JSON, "fields": _EMBEDDING_JSON["fields"][:n]}


#: The fingerprint of the schema this release writes (the ``embedstream.schema`` header's value).
EMBEDDING_FINGERPRINT = _fingerprint(_EMBEDDING_JSON)
#: Every schema a release wrote, by fingerprint, newest first, parsed for reading.
_EMBEDDING_WRITERS = {_fingerprint(_prefix(n)): _EMBEDDING_READER if n == len(_EMBEDDING_JSON["fields"])
                      else fastavro.parse_schema(_without_logical_types(_prefix(n)))
                      for n in reversed(EMBEDDING_FIELD_HISTORY)}


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Avro's long: what the output record's ``event_time`` can carry.
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(slots=True)
class Document:
    """One document of the input topic. ``event_time`` is epoch milliseconds or None. Read-only by
    use, not frozen: a frozen dataclass sets each field through ``object.__setattr__`` (0.68 µs a
    document against 0.19 on the polling thread here)."""

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


class FramedReader(Protocol):
    """Reads registry-framed Avro (``connectors.registry.SchemaRegistry``): the codec stays free of
    any network client, and raises only :class:`DecodeError` (or an outage's ``TransientError``)."""

    def read_document(self, value: bytes) -> dict[str, Any]: ...

    def read_key(self, key: bytes) -> Any: ...


def is_framed(data: bytes | None) -> bool:
    """Whether ``data`` looks registry-framed: magic byte 0, a 4-byte schema id, a body."""
    return data is not None and len(data) > 5 and data[:1] == b"\x00"


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"{what} is not valid UTF-8: {exc}") from None


#: A JSON escape of a UTF-16 surrogate: a lone one decodes to a str that UTF-8 cannot encode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


#: JSON nested deeper than this is ``decode_error``. Python's parser is recursive: past its recursion
#: limit it raises, and how deep it gets depends on the caller's stack, so without a fixed bound the
#: same record could decode on one thread and not on another.
MAX_JSON_DEPTH = 100
#: A JSON string, escapes included, or the rest of the text where one is never closed. Unrolled so that
#: every character has one way to match, and never failing from a quote: a pattern that could fail there
#: (``"(?:[^"\\]|\\.)*"``) was tried again from every later quote, so 48,000 escaped quotes before the
#: first bracket took a minute (the time grows with the square of the length).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
#: Per byte, the step in depth it makes outside strings: ``[ {`` one level deeper, ``] }`` one back. A byte of a
#: multi-byte UTF-8 character is 0x80 or more, never a bracket.
_DEPTH_STEP = np.zeros(256, dtype=np.int32)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def _nests_deeper(text: str, limit: int) -> bool:
    """Whether ``text``'s arrays and objects nest deeper than ``limit`` (brackets inside strings do
    not count). Linear in the text's length whatever it holds: strings are cut out by one pass of a
    pattern that never backtracks past a character, and the depth is a running sum in numpy."""
    bare = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    if not bare:
        return False
    return int(np.cumsum(_DEPTH_STEP[np.frombuffer(bare, dtype=np.uint8)]).max()) > limit


#: What ``json.loads`` raises on text it cannot take: ``JSONDecodeError`` (a ValueError) for bad JSON,
#: ValueError for an integer over Python's 4,300 digits, RecursionError past the stack, MemoryError
#: for a value too large to hold, UnicodeError on text it cannot read.
_JSON_FAILURES = (ValueError, RecursionError, OverflowError, MemoryError, UnicodeError)


def _json_loads(text: str, what: str) -> Any:
    """``text`` parsed as JSON. Raises :class:`DecodeError` and nothing else: a string in it with a
    lone surrogate escape (``"\\ud800"``, which the id, text and cache key could never be written
    with) is ``invalid_utf8``; JSON nested deeper than ``MAX_JSON_DEPTH``, and text the parser refuses
    for any reason, is ``decode_error``."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _nests_deeper(text, MAX_JSON_DEPTH):
        raise DecodeError("decode_error", f"{what} nests arrays or objects over {MAX_JSON_DEPTH} levels deep")
    try:
        obj = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # rare: only then is every string checked
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise DecodeError("invalid_utf8", f"{what} has a string with a lone surrogate escape (\\ud800-\\udfff "
                                          "alone): it is not Unicode text") from None
    except _JSON_FAILURES as exc:
        raise DecodeError("decode_error", f"{what} is not valid JSON: {_short(exc)}") from None
    return obj


def _short(exc: BaseException, limit: int = 200) -> str:
    """``exc`` in a line of at most ``limit`` characters (a parser's message can quote the input)."""
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, json.JSONDecodeError) else str(exc)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _key_value(obj: Any, key_field: str | None) -> str:
    """The document id inside a structured key: ``key_field`` of a record (a JSON converter's
    ``{"schema", "payload"}`` envelope is opened first), the only field of a one-field record, or a
    primitive key itself."""
    if isinstance(obj, dict):
        if isinstance(obj.get("payload"), dict) and "schema" in obj:
            obj = obj["payload"]
        if key_field is not None:
            if key_field not in obj:
                raise DecodeError("decode_error", f"the record key has no field {key_field!r} "
                                                  f"(EMBEDSTREAM_KEY_FIELD); its fields: {sorted(obj)}")
            obj = obj[key_field]
        elif len(obj) == 1:
            obj = next(iter(obj.values()))
        else:
            raise DecodeError("decode_error", f"the record key is a record with fields {sorted(obj)}: set "
                                              "EMBEDSTREAM_KEY_FIELD to the one that holds the document id")
    if isinstance(obj, str) and obj:
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return str(obj)
    raise DecodeError("decode_error", f"the record key's id must be a non-empty string or an integer, got {obj!r}")


def key_id(key: bytes | None, key_field: str | None = None, framed: FramedReader | None = None) -> str | None:
    """The document id a record key names, or None for no key (an empty key is none).

    With a registry (``framed``), a registry-framed key is read through it; with ``key_field`` set, a
    key that is a JSON object is read as one; any other key is the id itself (UTF-8)."""
    if not key:
        return None
    if framed is not None and is_framed(key):
        return _key_value(framed.read_key(key), key_field)
    text = _utf8(key, "record key")
    if key_field is not None and text[:1] == "{":
        return _key_value(_json_loads(text, "the record key"), key_field)
    return text


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


def _with_identity(doc: Document, key: str | None) -> Document:
    """``doc`` under the id its record stands for: the key's, which a value id must agree with;
    the value's own when the record has no key."""
    if key is None:
        if not doc.id:
            raise DecodeError("decode_error", "document has no 'id' and the record has no key")
        return doc
    if doc.id and doc.id != key:
        raise DecodeError("id_mismatch", f"the record key says id {key!r} but the value says {doc.id!r}: the key "
                                         "is the document's identity (deletes use it too)")
    return doc if doc.id else Document(key, doc.text, doc.model, doc.metadata, doc.event_time)


def _json_document(value: bytes) -> Document:
    """The fields of a JSON value; the id may be empty (the key gives it)."""
    obj = _json_loads(_utf8(value, "JSON value"), "the value")
    if not isinstance(obj, dict):
        raise DecodeError("decode_error", f"JSON value must be an object, got {type(obj).__name__}")
    doc_id = obj.get("id")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)  # CDC tools write numeric primary keys
    if doc_id is not None and not isinstance(doc_id, str):
        raise DecodeError("decode_error", f"'id' must be a string, got {type(doc_id).__name__}")
    body = obj.get("text")
    if not isinstance(body, str):
        raise DecodeError("decode_error", f"'text' must be a string, got {type(body).__name__}")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise DecodeError("decode_error", f"'model' must be a string or null, got {type(model).__name__}")
    event_time = obj.get("event_time")
    if event_time is not None and (isinstance(event_time, bool) or not isinstance(event_time, int)
                                   or not _LONG_MIN <= event_time <= _LONG_MAX):
        raise DecodeError("decode_error", "'event_time' must be epoch milliseconds (an integer that fits in 64 "
                                          "bits) or null")
    return Document(doc_id or "", body, model, _metadata(obj.get("metadata")), event_time)


def document_from_json(value: bytes, key: str | None) -> Document:
    """A :class:`Document` from JSON bytes (``key``, when given, is its id). Raises :class:`DecodeError`."""
    return _with_identity(_json_document(value), key)


def _read_avro(value: bytes, schema, what: str, reader=None) -> dict[str, Any]:
    """One schemaless record of ``schema`` that must span all of ``value``, resolved to ``reader``
    (None: read as written); DecodeError otherwise."""
    buf = io.BytesIO(value)
    try:
        rec = (fastavro.schemaless_reader(buf, schema) if reader is None or reader is schema
               else fastavro.schemaless_reader(buf, schema, reader))
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


def _avro_document(rec: dict[str, Any]) -> Document:
    return Document(rec["id"], rec["text"], rec["model"], dict(rec["metadata"] or {}), _ms(rec["event_time"]))


def _schemaless_document(value: bytes, framed: FramedReader | None) -> Document:
    try:
        fields = read_document(value)  # the common case, by hand; any doubt goes to fastavro below
    except MetadataTooLarge as exc:
        raise DecodeError("metadata_too_large", f"its metadata map holds over {MAX_METADATA_ENTRIES:,} entries "
                                                f"({exc.args[0]:,} counted), more than Milvus' 64 KB of JSON a row "
                                                "can hold") from None
    if fields is not None:
        return Document(*fields)
    try:
        return _avro_document(_read_avro(value, _DOCUMENT_READER, "document.avsc"))
    except DecodeError as exc:
        if framed is None and is_framed(value):
            raise DecodeError(exc.reason, f"{exc.message}; the value looks registry-framed (magic byte 0): set "
                                          "EMBEDSTREAM_SCHEMA_REGISTRY_URL so it can be read") from None
        raise


def _framed_document(value: bytes, framed: FramedReader) -> Document:
    try:
        return _avro_document(framed.read_document(value))
    except DecodeError as exc:
        if exc.reason != "unknown_schema":
            raise
        # A schemaless record whose id is empty (its key names it) starts with byte 0 too: a value
        # that reads whole as one is that, not a frame with an unknown id.
        try:
            return _avro_document(_read_avro(value, _DOCUMENT_READER, "document.avsc"))
        except DecodeError:
            raise exc from None


def decode_document(key: bytes | None, value: bytes | None, *, framed: FramedReader | None = None,
                    key_field: str | None = None) -> Document | Tombstone:
    """Decode one input record.

    Returns a :class:`Tombstone` for a null value, else a :class:`Document`: from JSON when the
    value starts with ``{``, from registry-framed Avro when ``framed`` is given and the value starts
    with the magic byte 0, from schemaless Avro otherwise. The key is the document's identity
    (:func:`key_id`); a value id that disagrees is ``id_mismatch``. Raises :class:`DecodeError` when
    the record can never be decoded, and nothing else for any input bytes (``framed`` may raise
    ``TransientError`` for an id :meth:`resolve` did not see).
    """
    kid = key_id(key, key_field, framed)
    if value is None:
        if kid is None:
            raise DecodeError("decode_error", "tombstone (null value) without a key: nothing to delete")
        return Tombstone(kid)
    if value[:1] == b"{":
        doc = _json_document(value)
    elif framed is not None and is_framed(value):
        doc = _framed_document(value, framed)
    else:
        doc = _schemaless_document(value, framed)
    return _with_identity(doc, kid)


def _varint_bytes(z: int) -> bytes:
    """Base-128 varint of a non-negative ``z``, byte by byte (the tables below are built with it)."""
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


#: The varints of zig-zag values below 2**14 (|n| < 8192: lengths, dims, partitions, spans), looked up
#: instead of built: an output record has thirteen ints, and building each was ~40 % of its encoding.
_SMALL_VARINTS = [_varint_bytes(z) for z in range(1 << 14)]
#: The two bytes of 14 low bits with more to follow: a larger varint is built 14 bits at a time (an
#: offset past 8,191 took 0.66 µs byte by byte, a time in epoch ms 1.17; 0.17 and 0.34 so).
_LOW14 = [bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80)) for z in range(1 << 14)]


def _varint(z: int) -> bytes:
    """Base-128 varint of a non-negative ``z``."""
    if z < 1 << 14:
        return _SMALL_VARINTS[z]
    if z < 1 << 28:
        return _LOW14[z & 0x3FFF] + _SMALL_VARINTS[z >> 14]
    return _LOW14[z & 0x3FFF] + _LOW14[(z >> 14) & 0x3FFF] + _varint(z >> 28)


def _long(n: int) -> bytes:
    """Avro int/long: zig-zag, then base-128 varint."""
    z = (n << 1) ^ (n >> 63)
    return _SMALL_VARINTS[z] if z < 16384 else _varint(z)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _long(len(raw)) + raw


def encode_embedding(record: dict[str, Any]) -> bytes:
    """Avro bytes of an output record (a dict with the fields of ``schemas/embedding.avsc``; the
    chunk fields may be left out), by :class:`EmbeddingWriter`: the tools' and tests' way in, where
    the sink writes a document's records from their parts."""
    writer = EmbeddingWriter(record["model"], record["dim"])
    doc = writer.document(record["id"], record["source_topic"], record["source_partition"], record["source_offset"],
                          record["metadata"] or {}, _ms(record["embedded_at"]) or 0, record.get("chunk_count", 1),
                          _ms(record.get("event_time")))
    return writer.chunk(doc, np.ascontiguousarray(record["vector"], dtype=_F4), record["content_hash"],
                        record["cached"], record.get("chunk_index", 0), record.get("span_start", 0),
                        record.get("span_end", -1), _sparse_of(record))


def _sparse_of(record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    if record.get("sparse_indices") is None:
        return None
    return np.asarray(record["sparse_indices"], dtype=np.int64), np.asarray(record["sparse_values"], dtype=_F4)


def _map(values: dict[str, str]) -> bytes:
    """An Avro map of strings: one block, then the empty block that ends it."""
    if not values:
        return b"\x00"
    parts = [_long(len(values))]
    for k, v in values.items():
        parts.append(_string(k))
        parts.append(_string(v))
    parts.append(b"\x00")
    return b"".join(parts)


class EmbeddingWriter:
    """The Avro bytes of one model's output records, written by hand for this one fixed schema (the
    bytes fastavro writes, checked by the tests), with what records share written once: the sink's
    hot path. The vector goes out as its numpy buffer, not as 384 Python floats.

    A record is its document's parts (:meth:`document`: the id, the model and dim, the source, the
    metadata, the time) around its chunk's own (:meth:`chunk`), so a document of many chunks, or a
    group of documents from one topic at one time, pays for those once instead of through a dict
    per record: a one-chunk document's record took 6.2 µs of CPU built as a dict and encoded
    (0.9 + 5.3), 3.6 here (this project's 2-core host, 20,000 records of 384 floats, in-process)."""

    def __init__(self, model_id: str, dim: int) -> None:
        self._model_dim = _string(model_id) + _long(dim)
        self._topics: dict[str, bytes] = {}
        self._time: tuple[int | None, bytes] = (None, b"")

    def document(self, doc_id: str, topic: str, partition: int, offset: int, metadata: dict[str, str],
                 embedded_at: int, chunk_count: int,
                 event_time: int | None = None) -> tuple[bytes, bytes, bytes, bytes]:
        """The parts of a document's records before the vector, between the chunk's hash and index,
        between its index and span, and after its sparse vector (the event time: epoch ms or None)."""
        topic_bytes = self._topics.get(topic)
        if topic_bytes is None:
            topic_bytes = self._topics[topic] = _string(topic)
        if self._time[0] != embedded_at:  # one time a group: its varint is built once
            self._time = (embedded_at, _long(embedded_at))
        return (_string(doc_id) + self._model_dim,
                b"".join((topic_bytes, _long(partition), _long(offset), _map(metadata), self._time[1])),
                _long(chunk_count), b"\x00" if event_time is None else b"\x02" + _long(event_time))

    @staticmethod
    def chunk(doc: tuple[bytes, bytes, bytes, bytes], vector: np.ndarray, content_hash: str, cached: bool, index: int,
              span_start: int, span_end: int, sparse: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
        """One record: ``doc`` (from :meth:`document`) around the chunk's vector, hash and place, and its
        learned sparse vector (``(indices, values)``; None: the two null fields)."""
        if vector.dtype != _F4 or not vector.flags.c_contiguous:
            vector = np.ascontiguousarray(vector, dtype=_F4)
        n = vector.shape[0]
        vec = (_long(n), vector, b"\x00") if n else (b"\x00",)
        head, middle, count, tail = doc
        # bytes.join takes the array's buffer as it is: the floats are copied once, into the record
        return b"".join((head, *vec, _string(content_hash), b"\x01" if cached else b"\x00", middle, _long(index),
                         count, _long(span_start), _long(span_end), _sparse(sparse), tail))


def _sparse(sparse: tuple[np.ndarray, np.ndarray] | None) -> bytes:
    """The ``sparse_indices`` and ``sparse_values`` unions: two nulls (branch 0), or two arrays (branch 1)."""
    if sparse is None:
        return b"\x00\x00"
    idx, val = sparse
    n = len(idx)
    if not n:
        return b"\x02\x00\x02\x00"
    return b"".join((b"\x02", _long(n), *(_long(int(i)) for i in idx), b"\x00",
                     b"\x02", _long(n), np.ascontiguousarray(val, dtype=_F4).tobytes(), b"\x00"))


_F4 = np.dtype("<f4")


def embedding_json(record: dict[str, Any]) -> bytes:
    """JSON bytes of an output record: the fields of ``embedding.avsc`` (``embedded_at`` in epoch
    milliseconds, the vector as a list of numbers: the float32 values, exactly)."""
    vec = np.asarray(record["vector"], dtype=np.float32)
    out = {**record, "vector": vec.tolist(), "embedded_at": _ms(record["embedded_at"]) or 0,
           "metadata": record["metadata"] or {}, "event_time": _ms(record.get("event_time"))}
    out.setdefault("chunk_index", 0)
    out.setdefault("chunk_count", 1)
    out.setdefault("span_start", 0)
    out.setdefault("span_end", -1)
    if out.get("sparse_indices") is not None:
        out["sparse_indices"] = [int(i) for i in out["sparse_indices"]]
        out["sparse_values"] = np.asarray(out["sparse_values"], dtype=np.float32).tolist()
    else:
        out["sparse_indices"] = out["sparse_values"] = None
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_embedding(value: bytes, headers: list | None = None) -> dict[str, Any]:
    """Decode an output record (schemaless Avro); ``embedded_at`` and ``event_time`` come back as
    epoch milliseconds. Every field of this release's schema is there: a record an older release
    wrote has the defaults of the fields it did not have.

    ``headers`` (the record's): its ``embedstream.schema`` names the writer schema. Without it (a
    record from before that header, or no headers given), the schemas releases wrote are tried,
    newest first, for one that spans the value exactly.

    Raises :class:`DecodeError` on bytes that are not such a record, or a fingerprint no release wrote."""
    named = next((v for k, v in headers or () if k == SCHEMA_HEADER), None)
    if named is not None:
        writer = _EMBEDDING_WRITERS.get(named.decode("ascii", "replace"))
        if writer is None:
            name = named.decode("ascii", "replace")
            raise DecodeError("decode_error", f"written by schema {name}, which this release does not know "
                                              "(a newer embedstream wrote it: upgrade the reader)")
        return _read_avro(value, writer, "embedding.avsc", _EMBEDDING_READER)
    first: DecodeError | None = None
    for writer in _EMBEDDING_WRITERS.values():
        try:
            return _read_avro(value, writer, "embedding.avsc", _EMBEDDING_READER)
        except DecodeError as exc:
            first = first or exc
    raise first  # type: ignore[misc]
