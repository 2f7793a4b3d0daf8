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
from schemas.codec import EMBEDDING_SCHEMA_TEXT, embedding_json, encode_embedding
from schemas.errors import TransientError

log = logging.getLogger(__name__)


class OutputFormat:
    """``encode(record)`` → the value bytes; ``ready()`` before the first record of a group (it may
    raise ``TransientError``)."""

    def ready(self) -> None:
        pass

    def encode(self, record: dict[str, Any]) -> bytes:
        return encode_embedding(record)


class JsonOutput(OutputFormat):
    def encode(self, record: dict[str, Any]) -> bytes:
        return embedding_json(record)


class RegistryOutput(OutputFormat):
    def __init__(self, registry: SchemaRegistry, topic: str) -> None:
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

    def encode(self, record: dict[str, Any]) -> bytes:
        return self._frame + encode_embedding(record)


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
