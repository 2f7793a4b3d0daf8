"""The collection's shape: its fields, its companion of deletes, and the columnar upsert request.

One row per chunk of a document (a document that fits the model is one chunk). The primary key
``id`` is ``<document id>#<chunk index>``; ``doc_id``, ``chunk_index``, ``chunk_count`` and the
character span (``span_start``, ``span_end``, into the normalised text) are fields of their own, and
``excerpt`` holds the chunk's first characters (what ``search`` shows). ``source`` and
``source_offset`` say which version of the document a row holds (``worker.steps.writing.versions``).

With a sparse side (``EMBEDSTREAM_SPARSE``; ``schemas.sparse.SparseKind``), a row also has ``sparse``, a
SPARSE_FLOAT_VECTOR beside the dense ``vector``:

- ``bm25``: ``text`` holds the chunk's whole text and the words of its compound identifiers
  (:func:`bm25_text`; VARCHAR with the standard analyzer, cut to :data:`TEXT_MAX_BYTES` of UTF-8),
  and Milvus derives ``sparse`` from it (a BM25 ``Function``; index SPARSE_INVERTED_INDEX, metric
  BM25). The worker never sends ``sparse``.
- ``learned``: the worker sends ``sparse`` (a sparse model's weights; metric IP).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

# pymilvus' generated protobuf modules: internal, but the columnar request needs them (see
# MilvusStore.upsert_chunks); the unit fake decodes the same request, the contract test sends it.
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from schemas.errors import ConfigError
from schemas.sparse import SparseKind

DOC_ID_MAX_LENGTH = 512
#: ``<document id>#<chunk index>``: the document id, a ``#`` and up to seven digits.
ID_MAX_LENGTH = DOC_ID_MAX_LENGTH + 8
SOURCE_MAX_LENGTH = 300
EXCERPT_CHARS = 160
#: The fields only a collection made for chunks has (an older one holds one row per document).
CHUNK_FIELDS = ("doc_id", "chunk_index", "chunk_count", "span_start", "span_end")
VERSION_FIELDS = ("source", "source_offset")
#: The most bytes of a chunk's text a ``bm25`` row keeps (Milvus' VARCHAR limit).
TEXT_MAX_BYTES = 65_535
#: One (dimension, weight) pair of a sparse row as Milvus reads it: uint32 then float32, little-endian.
_PAIR = np.dtype([("index", "<u4"), ("value", "<f4")])


#: The most bytes Milvus takes in a JSON field's value (its ``metadata``, as :func:`metadata_json` writes it).
METADATA_MAX_BYTES = 65_536


def metadata_json(metadata: dict[str, str]) -> bytes:
    """A row's ``metadata`` as the upsert sends it (ASCII JSON, no spaces)."""
    return json.dumps(metadata, separators=(",", ":")).encode() if metadata else b"{}"


def metadata_too_large(metadata: dict[str, str]) -> int | None:
    """The bytes of ``metadata``'s JSON when over :data:`METADATA_MAX_BYTES` (Milvus refuses it), else
    None. Encoded only when it might be over: a character takes at most 12 bytes there (an astral one
    as two ``\\u`` escapes), a pair 6 more (quotes, colon, comma)."""
    if not metadata:
        return None
    if sum(12 * (len(k) + len(v)) + 6 for k, v in metadata.items()) + 2 <= METADATA_MAX_BYTES:
        return None
    size = len(metadata_json(metadata))
    return size if size > METADATA_MAX_BYTES else None


def chunk_id(doc_id: str, index: int) -> str:
    """The primary key of a document's chunk."""
    return f"{doc_id}#{index}"


@dataclass
class ChunkRows:
    """Rows to upsert, as columns of equal length (``vectors``: shape ``(rows, dim)``)."""

    doc_ids: list[str]
    chunk_index: list[int]
    chunk_count: list[int]
    span_start: list[int]
    span_end: list[int]
    excerpts: list[str]
    vectors: np.ndarray
    hashes: list[str]
    metadata: list[dict[str, str]]
    sources: list[str]
    offsets: list[int]
    #: ``bm25``: each chunk's whole text (Milvus derives the sparse vector from it); else None.
    texts: list[str] | None = None
    #: ``learned``: each chunk's sparse vector as ``(indices, values)``; else None.
    sparse: list[tuple[np.ndarray, np.ndarray]] | None = None

    def __len__(self) -> int:
        return len(self.doc_ids)


#: A run of word characters and dots: where a compound identifier may be (one linear pass; a pattern
#: for the identifiers themselves backtracked quadratically on a long word: 25 s on 40,000 "é").
_RUN = re.compile(r"[\w.]+")
#: A run that is a compound identifier: dotted (``json.dumps``), snake_case (``register_instance``)
#: or camelCase (``getLogger``, ``EntryPoint``), as the analyzer's standard tokenizer keeps it whole.
_COMPOUND = re.compile(r"\w\.\w|\w_|_\w|[a-z0-9][A-Z]")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: Longer runs are not identifiers (a hash, a blob): left as they are.
_LONGEST_NAME = 256


def bm25_text(text: str) -> str:
    """What BM25 indexes (and analyses of a query): ``text``, then the words of each compound
    identifier in it (``xmlrpc.server.register_instance`` → ``xmlrpc server register instance``).
    Milvus's standard tokenizer keeps such a name as one token, which matches the whole name
    exactly but none of its words: a natural-language query about "registering an instance" then
    finds nothing in it. Measured on the bench's 2,000 functions (BM25 alone, natural-language
    queries): 0.56 of them found without the words, 0.70 with; names still 0.997."""
    parts: list[str] = []
    seen: set[str] = set()
    for run in _RUN.finditer(text):
        name = run.group().strip(".")
        if len(name) > _LONGEST_NAME or not _COMPOUND.search(name):
            continue
        for part in _PART.findall(name):
            low = part.lower()
            if low != name.lower() and low not in seen:
                seen.add(low)
                parts.append(low)
    return f"{text}\n\n{' '.join(parts)}" if parts else text


def cut_utf8(text: str, limit: int = TEXT_MAX_BYTES) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, never inside a character."""
    raw = text.encode("utf-8")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", "ignore")


def collection_schema(dim: int, sparse: SparseKind = SparseKind.OFF) -> Any:
    """The collection's fields (this module's docstring), with the sparse side ``sparse``."""
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    sparse = SparseKind(sparse)
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LENGTH)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=DOC_ID_MAX_LENGTH)
    for name in CHUNK_FIELDS[1:]:
        schema.add_field(name, DataType.INT64)
    schema.add_field("excerpt", DataType.VARCHAR, max_length=4 * EXCERPT_CHARS)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("model", DataType.VARCHAR, max_length=256)
    schema.add_field("content_hash", DataType.VARCHAR, max_length=64)
    schema.add_field("metadata", DataType.JSON)
    schema.add_field("updated_at", DataType.INT64)
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX_LENGTH)
    schema.add_field("source_offset", DataType.INT64)
    if sparse is SparseKind.BM25:
        schema.add_field("text", DataType.VARCHAR, max_length=TEXT_MAX_BYTES, enable_analyzer=True)
    if sparse is not SparseKind.OFF:
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    if sparse is SparseKind.BM25:
        schema.add_function(Function(name=SparseKind.BM25.value, function_type=FunctionType.BM25,
                                     input_field_names=["text"], output_field_names=["sparse"]))
    return schema


def add_indexes(index: Any, sparse: SparseKind = SparseKind.OFF) -> Any:
    """The collection's indexes onto ``index`` (``prepare_index_params()``): COSINE on ``vector``, and
    an inverted index on ``sparse`` with its kind's metric."""
    index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
    if SparseKind(sparse) is not SparseKind.OFF:
        index.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type=SparseKind(sparse).metric)
    return index


def sparse_kind_of(info: dict) -> SparseKind:
    """The sparse side of a collection from ``describe_collection``'s answer."""
    names = {f["name"] for f in info["fields"]}
    if "sparse" not in names:
        return SparseKind.OFF
    from pymilvus import FunctionType

    bm25 = any(fn.get("type") == FunctionType.BM25 for fn in info.get("functions") or [])
    return SparseKind.BM25 if bm25 else SparseKind.LEARNED


#: What stands for an empty sparse vector (a text where the sparse model keeps no weight): milvus-lite
#: refuses a row without a non-zero weight, so it holds the smallest normal float32 at dimension 0,
#: which adds nothing measurable to any inner product.
EMPTY_SPARSE = (np.array([0], np.int32), np.array([np.finfo(np.float32).tiny], np.float32))


def sparse_bytes(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[bytes], int]:
    """Each sparse row as the bytes Milvus reads (its pairs, dimensions ascending; an empty one as
    :data:`EMPTY_SPARSE`), and the dimension of them all (the largest index + 1)."""
    out, dim = [], 0
    for idx, val in rows:
        if not len(idx):
            idx, val = EMPTY_SPARSE
        pairs = np.empty(len(idx), _PAIR)
        order = np.argsort(idx, kind="stable")
        pairs["index"], pairs["value"] = idx[order], val[order]
        out.append(pairs.tobytes())
        if len(idx):
            dim = max(dim, int(idx.max()) + 1)
    return out, dim


def tombstone_schema() -> Any:
    """The companion collection of deleted document ids and the version of their delete. Milvus
    wants a vector field in every collection: ``marker`` is a constant 2-dim vector, never searched."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LENGTH)
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX_LENGTH)
    schema.add_field("source_offset", DataType.INT64)
    schema.add_field("updated_at", DataType.INT64)
    schema.add_field("marker", DataType.FLOAT_VECTOR, dim=2)
    return schema


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def packed_floats(vectors: np.ndarray) -> bytes:
    """``vectors`` as the wire bytes of a ``FloatArray`` (field 1, packed little-endian float32):
    parsed by protobuf in C at memory speed, where ``data.extend(list)`` converts every float in
    Python (measured: 10 ms instead of 109 ms for 4,000 × 384)."""
    raw = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    return b"\x0a" + _varint(len(raw)) + raw


def row_dicts(rows: ChunkRows, model: str, updated_at: int) -> list[dict[str, Any]]:
    """The same rows as :func:`upsert_request`, as the dicts ``MilvusClient.upsert`` takes (its public
    path, slower: pymilvus packs them field by field)."""
    out = []
    for i in range(len(rows)):
        row: dict[str, Any] = {
            "id": chunk_id(rows.doc_ids[i], rows.chunk_index[i]), "doc_id": rows.doc_ids[i],
            "chunk_index": rows.chunk_index[i], "chunk_count": rows.chunk_count[i],
            "span_start": rows.span_start[i], "span_end": rows.span_end[i], "excerpt": rows.excerpts[i],
            "vector": rows.vectors[i].tolist(), "model": model, "content_hash": rows.hashes[i],
            "metadata": rows.metadata[i] or {}, "updated_at": updated_at, "source": rows.sources[i],
            "source_offset": rows.offsets[i]}
        if rows.texts is not None:
            row["text"] = cut_utf8(bm25_text(rows.texts[i]))
        if rows.sparse is not None:
            idx, val = rows.sparse[i] if len(rows.sparse[i][0]) else EMPTY_SPARSE
            row["sparse"] = {int(k): float(v) for k, v in zip(idx, val)}
        out.append(row)
    return out


def upsert_request(collection: str, rows: ChunkRows, model: str, updated_at: int) -> Any:
    """The UpsertRequest of ``rows``, one column per field."""
    n = len(rows)
    req = milvus_pb2.UpsertRequest(collection_name=collection, num_rows=n)

    def column(name: str, dtype: int) -> Any:
        field = req.fields_data.add()
        field.field_name, field.type = name, dtype
        return field

    def strings(name: str, values: list[str]) -> None:
        column(name, schema_pb2.VarChar).scalars.string_data.data.extend(values)

    def longs(name: str, values: list[int]) -> None:
        column(name, schema_pb2.Int64).scalars.long_data.data.extend(values)

    strings("id", [chunk_id(d, i) for d, i in zip(rows.doc_ids, rows.chunk_index)])
    strings("doc_id", rows.doc_ids)
    longs("chunk_index", rows.chunk_index)
    longs("chunk_count", rows.chunk_count)
    longs("span_start", rows.span_start)
    longs("span_end", rows.span_end)
    strings("excerpt", rows.excerpts)
    vec = column("vector", schema_pb2.FloatVector).vectors
    vec.dim = int(rows.vectors.shape[1])
    vec.float_vector.MergeFromString(packed_floats(rows.vectors))
    strings("model", [model] * n)
    strings("content_hash", rows.hashes)
    column("metadata", schema_pb2.JSON).scalars.json_data.data.extend(  # most documents have none
        [metadata_json(m) for m in rows.metadata])
    longs("updated_at", [updated_at] * n)
    strings("source", rows.sources)
    longs("source_offset", rows.offsets)
    if rows.texts is not None:
        strings("text", [cut_utf8(bm25_text(t)) for t in rows.texts])
    if rows.sparse is not None:
        sparse = column("sparse", schema_pb2.SparseFloatVector).vectors
        contents, dim = sparse_bytes(rows.sparse)
        sparse.dim = dim
        sparse.sparse_float_vector.dim = dim
        sparse.sparse_float_vector.contents.extend(contents)
    return req


def check_shape(collection: str, info: dict, dim: int, sparse: SparseKind = SparseKind.OFF) -> None:
    """Raise :class:`ConfigError` unless ``info`` (``describe_collection``'s answer) is a collection
    of this shape for ``dim``-dim vectors: another dim means another model; no chunk fields, a
    collection from before chunking (a row per document), which is never mixed with chunk rows."""
    fields = {f["name"]: f for f in info["fields"]}
    if "vector" not in fields:
        raise ConfigError(f"Milvus collection {collection!r} has no 'vector' field: not an embedstream collection; "
                          "set EMBEDSTREAM_MILVUS_COLLECTION to another name.")
    have = int(fields["vector"]["params"]["dim"])
    if have != dim:
        raise ConfigError(
            f"Milvus collection {collection!r} holds {have}-dim vectors but the model makes {dim}-dim ones (after "
            "EMBEDSTREAM_TRUNCATE_DIM, if set): set EMBEDSTREAM_MILVUS_COLLECTION to a new collection, or use the "
            "model and dimension the collection was built with.")
    missing = [f for f in (*CHUNK_FIELDS, *VERSION_FIELDS) if f not in fields]
    if missing:
        raise ConfigError(
            f"Milvus collection {collection!r} was made by an embedstream from before chunking (one row per "
            f"document; no {', '.join(missing)} fields). This version writes a row per chunk and will not mix the "
            "two. Set EMBEDSTREAM_MILVUS_COLLECTION to a new name and replay the input topic into it (a new "
            "EMBEDSTREAM_GROUP_ID reads it from the start), then drop the old collection.")
    have_sparse, sparse = sparse_kind_of(info), SparseKind(sparse)
    if have_sparse is not sparse:
        raise ConfigError(
            f"Milvus collection {collection!r} has sparse side {have_sparse.value!r} but this worker writes "
            f"{sparse.value!r} "
            "(EMBEDSTREAM_SPARSE): a collection's fields are fixed when it is made. Keep the setting the "
            "collection was made with, or let the worker make the new collection behind the alias and run "
            "`embedstream migrate` to fill it and move the alias.")
