"""What fits a topic: the size of a record as the broker counts it, and a dead letter cut to fit.

A record that a producer was allowed to write to the input topic (a 1 MB key, a 2 MB value on a
topic that allows 4 MB) may be too large for the dead-letter topic, whose limit is the broker's
default. Re-producing it whole would fail at every retry and stop the partition for good. So a dead
letter is cut to its topic's limit and says so in headers (:func:`dead_letter_record`):

* ``embedstream.error.truncated`` — which parts were cut: ``key``, ``value``, ``headers``
  (comma-separated);
* ``embedstream.error.original_key_size``, ``…_value_size``, ``…_headers_size`` — their sizes in
  bytes before the cut (``embedstream.error.original_size`` is the value's, as older releases wrote);
* ``embedstream.error.original_key_sha256``, ``…_value_sha256`` — hashes of the original bytes, so
  a reader can match the cut copy with the record it came from.

The contract's headers (reason, message, source) are always kept whole; the original headers go
kept whole, in order, while they fit a quarter of the room; the key gets a quarter of what is left
(more when the value needs less); the value gets the rest.

The limit of a topic is the smaller of the topic's ``max.message.bytes`` (when the broker tells it)
and the producer's ``message.max.bytes`` (``EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES``, librdkafka's
default 1,000,000): librdkafka refuses a larger record at ``produce``, the broker at delivery.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from worker.core.records import HEADER_OVERHEAD, DeadLetter, Headers, headers_size

#: librdkafka's own default of ``message.max.bytes``.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000

#: Bytes a record costs beyond its key, value and headers: the record batch's header (61 bytes) and
#: the record's varints, with room to spare for librdkafka's own worst-case estimate.
RECORD_OVERHEAD = 512
#: The dead letter's message header holds at most this many bytes.
MESSAGE_HEADER_BYTES = 4096

def record_size(key: bytes | None, value: bytes | None, headers: Headers | None = None) -> int:
    """The bytes a record takes on the wire, over-estimated by a little (never under)."""
    return len(key or b"") + len(value or b"") + headers_size(headers) + RECORD_OVERHEAD


@dataclass(frozen=True)
class TopicLimits:
    """The largest record (bytes, :func:`record_size`) each sink topic takes."""

    output: int = DEFAULT_MESSAGE_MAX_BYTES
    dlq: int = DEFAULT_MESSAGE_MAX_BYTES

    @staticmethod
    def of(producer_max: int, output_topic_max: int | None, dlq_topic_max: int | None) -> TopicLimits:
        """The limits from the producer's ``message.max.bytes`` and the topics' ``max.message.bytes``
        (None where the broker did not tell it)."""
        return TopicLimits(min(producer_max, output_topic_max or producer_max),
                           min(producer_max, dlq_topic_max or producer_max))


#: An output record's bytes beyond its id and metadata, at most: the vector as JSON numbers (26
#: characters a component at worst), the content hash, the source topic (249 characters, escaped)
#: and the other fields.
OUTPUT_FIXED_BYTES = 4096
VECTOR_COMPONENT_BYTES = 26
#: JSON escapes a byte into at most this many (``\u0000``).
ESCAPE_FACTOR = 6


#: A sparse vector's dimension as a JSON number, with its comma, at most (a uint32).
SPARSE_INDEX_BYTES = 11


def output_room(dim: int, limit: int, sparse_dims: int = 0) -> int:
    """Bytes of document id plus metadata (as UTF-8) below which an output record of a ``dim``
    vector (and a sparse vector of at most ``sparse_dims`` dimensions) fits ``limit`` in any output
    format; a record past it is measured exactly."""
    vectors = VECTOR_COMPONENT_BYTES * (dim + sparse_dims) + SPARSE_INDEX_BYTES * sparse_dims
    return max(0, (limit - vectors - OUTPUT_FIXED_BYTES - RECORD_OVERHEAD) // ESCAPE_FACTOR)


def _sha256(data: bytes | None) -> bytes:
    return hashlib.sha256(data or b"").hexdigest().encode()


def _contract_headers(d: DeadLetter) -> list[tuple[str, bytes]]:
    return [
        ("embedstream.error.reason", d.reason.encode()),
        ("embedstream.error.message", d.message.encode("utf-8", "replace")[:MESSAGE_HEADER_BYTES]),
        ("embedstream.source.topic", d.source.topic.encode()),
        ("embedstream.source.partition", str(d.source.partition).encode()),
        ("embedstream.source.offset", str(d.source.offset).encode()),
    ]


def _cut_info(d: DeadLetter, parts: list[str], headers_bytes: int) -> list[tuple[str, bytes]]:
    """The headers that say what was cut (sizes and hashes of the original parts)."""
    key, value = d.key or b"", d.value or b""
    return [
        ("embedstream.error.truncated", ",".join(parts).encode()),
        ("embedstream.error.original_key_size", str(len(key)).encode()),
        ("embedstream.error.original_value_size", str(len(value)).encode()),
        ("embedstream.error.original_size", str(len(value)).encode()),
        ("embedstream.error.original_headers_size", str(headers_bytes).encode()),
        ("embedstream.error.original_key_sha256", _sha256(d.key)),
        ("embedstream.error.original_value_sha256", _sha256(d.value)),
    ]


#: The prefix of the headers the worker writes; a producer's headers under it are renamed.
OWN_PREFIX = "embedstream."
RENAMED_PREFIX = "embedstream.original."


def _producers(name: str) -> str:
    """A producer's header name as a dead letter carries it: ``embedstream.x`` → ``embedstream.original.x``
    (matched without regard to case, as readers often match header names); any other name as it is."""
    if name[:len(OWN_PREFIX)].lower() == OWN_PREFIX:
        return RENAMED_PREFIX + name[len(OWN_PREFIX):]
    return name


def dead_letter_record(d: DeadLetter, limit: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """The key, value and headers of the dead-letter record for ``d``: the original ones with the
    contract headers added, cut to fit ``limit`` bytes (:func:`record_size`) as the module says.

    A header of the original record named ``embedstream.*`` is kept as ``embedstream.original.*``: only
    the worker writes its own names, so a producer cannot put a reason (or a source) ahead of the worker's.

    Raises ``ValueError`` when even the contract headers alone cannot fit (a limit of a few KB)."""
    original = [(_producers(name), value) for name, value in d.headers or ()]
    contract = _contract_headers(d)
    if record_size(d.key, d.value, [*original, *contract]) <= limit:
        return d.key, d.value, [*original, *contract]
    # Sized with every part named as cut: the real headers are no larger.
    info_room = headers_size(_cut_info(d, ["key", "value", "headers"], 10**12))
    room = limit - record_size(None, None, contract) - info_room
    if room < 0:
        raise ValueError(f"a limit of {limit} bytes leaves no room for the dead letter's own headers")
    kept: list[tuple[str, bytes]] = []
    used = 0
    for name, header_value in original:
        size = len(name.encode()) + len(header_value or b"") + HEADER_OVERHEAD
        if used + size > room // 4:
            break
        kept.append((name, header_value))
        used += size
    room -= used
    # A small value leaves its room to the key.
    key = (d.key or b"")[:max(room // 4, room - len(d.value or b""))] if d.key is not None else None
    room -= len(key or b"")
    value = (d.value or b"")[:max(0, room)] if d.value is not None else None
    parts = [name for name, cut in (("key", key != d.key), ("value", value != d.value),
                                    ("headers", len(kept) < len(original))) if cut]
    return key, value, [*kept, *contract, *_cut_info(d, parts, headers_size(original))]
