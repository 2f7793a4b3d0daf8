"""Avro schemas of the input and output topics, and the codec that reads and writes them."""

from schemas.codec import (
    DecodeError,
    Document,
    Tombstone,
    decode_document,
    decode_embedding,
    encode_document,
    encode_embedding,
)

__all__ = [
    "DecodeError",
    "Document",
    "Tombstone",
    "decode_document",
    "decode_embedding",
    "encode_document",
    "encode_embedding",
]
