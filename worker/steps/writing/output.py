"""How values are written to the output topic (``EMBEDSTREAM_OUTPUT_FORMAT``).

* ``avro`` — schemaless Avro of ``schemas/embedding.avsc`` (the reader shares the schema file);
* ``avro-registry`` — the same bytes behind the registry frame (magic byte 0 + schema id), the
  schema registered under the topic's subject (``<topic>-value``, the topic-name strategy), so
  a consumer with confluent-kafka's ``AvroDeserializer`` needs nothing but the registry's URL;
* ``json`` — one JSON object with the same fields (the vector as a list of numbers).

The frame is built once, when the schema id is known: a record costs one concatenation more than
plain ``avro``. A registry that is out when the worker starts is registered with later, by the sink
(``ready``), whose retry covers the outage like any other.
"""

from __future__ import annotations

import logging
from typing import Any

from connectors.registry import SchemaRegistry, frame
from schemas.codec import EMBEDDING_FINGERPRINT, EMBEDDING_SCHEMA_TEXT, SCHEMA_HEADER, EmbeddingWriter, embedding_json
from schemas.errors import TransientError
from worker.core.records import Item

log = logging.getLogger(__name__)


def records(item: Item, model_id: str, dim: int, embedded_at: int) -> list[dict[str, Any]]:
    """The output records of ``item``'s chunks (the fields of ``schemas/embedding.avsc``), in order."""
    src, count = item.source, len(item.chunks)
    return [{"id": item.id, "model": model_id, "dim": dim, "vector": ch.vector, "content_hash": ch.hash,
             "cached": ch.cached, "source_topic": src.topic, "source_partition": src.partition,
             "source_offset": src.offset, "metadata": item.metadata, "embedded_at": embedded_at,
             "chunk_index": ch.index, "chunk_count": count, "span_start": ch.start, "span_end": ch.end,
             "sparse_indices": None if ch.sparse is None else ch.sparse[0],
             "sparse_values": None if ch.sparse is None else ch.sparse[1], "event_time": item.event_time}
            for ch in item.chunks]


class OutputFormat:
    """``values(item, ...)`` → the value bytes of its chunks' records; ``ready()`` before the first
    record of a group (it may raise ``TransientError``); ``headers``: what each valued record carries
    besides the model's headers."""

    #: Schemaless Avro names its writer schema in a header (a reader cannot tell it from the bytes).
    headers: list[tuple[str, bytes]] = [(SCHEMA_HEADER, EMBEDDING_FINGERPRINT.encode())]

    def __init__(self) -> None:
        self._writers: dict[tuple[str, int], EmbeddingWriter] = {}

    def ready(self) -> None:
        pass

    def values(self, item: Item, model_id: str, dim: int, embedded_at: int) -> list[bytes]:
        """The values of the output records of ``item``'s chunks, in order (its vectors filled)."""
        writer = self._writers.get((model_id, dim))
        if writer is None:
            writer = self._writers[model_id, dim] = EmbeddingWriter(model_id, dim)
        src = item.source
        doc = writer.document(item.id, src.topic, src.partition, src.offset, item.metadata, embedded_at,
                              len(item.chunks), item.event_time)
        return [writer.chunk(doc, ch.vector, ch.hash, ch.cached, ch.index, ch.start, ch.end,  # type: ignore[arg-type]
                             ch.sparse)
                for ch in item.chunks]


class JsonOutput(OutputFormat):
    headers: list[tuple[str, bytes]] = []  # JSON names its fields

    def values(self, item: Item, model_id: str, dim: int, embedded_at: int) -> list[bytes]:
        return [embedding_json(rec) for rec in records(item, model_id, dim, embedded_at)]


class RegistryOutput(OutputFormat):
    headers: list[tuple[str, bytes]] = []  # the frame's schema id names the writer schema

    def __init__(self, registry: SchemaRegistry, topic: str) -> None:
        super().__init__()
        self.registry = registry
        self.subject = f"{topic}-value"
        self._frame = b""

    def ready(self) -> None:
        """Register the output schema under the subject unless done. Raises ``ConfigError`` when
        the subject holds an incompatible schema, ``TransientError`` while the registry is out."""
        if not self._frame:
            sid = self.registry.register(self.subject, EMBEDDING_SCHEMA_TEXT)
            self._frame = frame(sid)
            log.info("output schema is id %d under subject %s", sid, self.subject)

    def values(self, item: Item, model_id: str, dim: int, embedded_at: int) -> list[bytes]:
        return [self._frame + v for v in super().values(item, model_id, dim, embedded_at)]


def output_format(name: str, topic: str, registry: SchemaRegistry | None) -> OutputFormat:
    """The format ``name`` for ``topic``; with ``avro-registry`` the schema is registered now if the
    registry answers (a refusal is a ``ConfigError`` at start-up), else on the first write."""
    if name == "json":
        return JsonOutput()
    if name == "avro-registry":
        if registry is None:
            raise ValueError("avro-registry needs a schema registry")
        out = RegistryOutput(registry, topic)
        try:
            out.ready()
        except TransientError as exc:
            log.warning("%s: the output schema will be registered once it answers", exc)
        return out
    return OutputFormat()
