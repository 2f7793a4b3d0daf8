"""The record formats ``produce`` writes and ``tail`` reads, as their users' own tools would:

* ``avro`` — schemaless Avro with the schema files of ``schemas/`` (both sides share them);
* ``avro-registry`` — registry-framed Avro through confluent-kafka's own ``AvroSerializer`` (the
  document schema registered under ``<topic>-value``, the topic-name strategy set explicitly: the
  client's default first asks an associations endpoint) and ``AvroDeserializer`` (the writer's schema
  by id, nothing shared but the registry's URL);
* ``json`` — a JSON object with the schema's fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from schemas.codec import DOCUMENT_SCHEMA_TEXT, DecodeError, Document, decode_embedding, encode_document
from worker.settings import Settings

FORMATS = ("avro", "avro-registry", "json")


def _registry(settings: Settings):
    from connectors.registry import SchemaRegistry, client_conf

    if settings.schema_registry_url is None:
        raise ValueError("avro-registry needs a schema registry: set EMBEDSTREAM_SCHEMA_REGISTRY_URL "
                         "(`embedstream dev env` prints the local one)")
    return SchemaRegistry(client_conf(settings.schema_registry_url, settings.schema_registry), DOCUMENT_SCHEMA_TEXT)


def _document_dict(doc: Document) -> dict[str, Any]:
    return {"id": doc.id, "text": doc.text, "model": doc.model, "metadata": doc.metadata, "event_time": doc.event_time}


def document_encoder(fmt: str, settings: Settings, topic: str) -> Callable[[Document], bytes]:
    """How ``produce`` writes a document's value in format ``fmt``."""
    if fmt == "avro":
        return encode_document
    if fmt == "json":
        return lambda doc: json.dumps(_document_dict(doc), ensure_ascii=False).encode("utf-8")
    if fmt == "avro-registry":
        from confluent_kafka.schema_registry import topic_subject_name_strategy
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        ser = AvroSerializer(_registry(settings).client, DOCUMENT_SCHEMA_TEXT,
                             conf={"subject.name.strategy": topic_subject_name_strategy})
        ctx = SerializationContext(topic, MessageField.VALUE)

        def encode(doc: Document) -> bytes:
            return ser(_document_dict(doc), ctx)
        return encode
    raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def _plain(value: Any) -> Any:
    """A decoded record made JSON-able: datetimes (timestamp-millis) as epoch milliseconds."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


#: Reads an output value, given the record's headers (schemaless Avro names its writer schema there).
Decoder = Callable[[bytes, list | None], dict]


def embedding_decoder(fmt: str, settings: Settings) -> Decoder:
    """How ``tail`` reads an output value in format ``fmt``; raises :class:`DecodeError` on a value
    that is not one."""
    if fmt == "avro":
        return decode_embedding
    if fmt == "json":
        def from_json(value: bytes, headers: list | None = None) -> dict:
            try:
                obj = json.loads(value)
            except ValueError as exc:
                raise DecodeError("decode_error", f"not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise DecodeError("decode_error", "not a JSON object")
            return obj
        return from_json
    if fmt == "avro-registry":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserialize = AvroDeserializer(_registry(settings).client)

        def from_registry(value: bytes, headers: list | None = None) -> dict:
            try:
                return _plain(deserialize(value, None))
            except Exception as exc:  # the serde's SerializationError, fastavro's errors, a 404
                raise DecodeError("decode_error", f"not registry-framed Avro: {exc}") from None
        return from_registry
    raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
