"""A reader written by hand for schemaless ``document.avsc`` records: the input's common case.

The polling thread decodes every input record; fastavro's generic reader took ~3 µs of a record's
~4 µs there (a file object, a schema walk, a dict), this reader ~1.2 µs. It only ever answers for a
record that is whole and valid: anything else (truncated, trailing bytes, a union branch that does
not exist, invalid UTF-8, a long past 64 bits) gets None, and the caller reads the value with
fastavro, whose error says what is wrong. So a value this reader accepts is one fastavro reads to
the same fields, and every error still comes from one place.
"""

from __future__ import annotations

#: A field list: id, text, model (None: the worker's default), metadata, event_time (epoch ms or None).
Fields = tuple[str, str, "str | None", dict[str, str], "int | None"]


class _Invalid(Exception):
    """Not a record this reader vouches for (fastavro will say why)."""


#: Entries a record's metadata map may hold: Milvus takes 64 KB of JSON a row, at least 6 bytes an entry
#: (``"k":"",``), so no valid record holds more; 1 MB of empty entries (2 bytes each, one key in the end)
#: held the polling thread 20 times as long as the same JSON.
MAX_METADATA_ENTRIES = 16_384


class MetadataTooLarge(Exception):
    """A record whose metadata map holds more than ``MAX_METADATA_ENTRIES`` entries (``args[0]``: how
    many were counted before stopping)."""


def _long(b: bytes, i: int) -> tuple[int, int]:
    """The zig-zag varint at ``b[i]`` → ``(value, next index)``: a 64-bit long, at most 10 bytes."""
    byte = b[i]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), i + 1
    n, shift = byte & 0x7F, 7
    while True:
        i += 1
        byte = b[i]
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            if n >> 64:
                raise _Invalid
            return (n >> 1) ^ -(n & 1), i + 1
        shift += 7
        if shift > 63:
            raise _Invalid


def _string(b: bytes, i: int) -> tuple[str, int]:
    n = b[i]
    if n < 0x80 and not n & 1:  # a length below 64 is one byte (zig-zag: even): no call for it
        n >>= 1
        i += 1
    else:
        n, i = _long(b, i)
    end = i + n
    if n < 0 or end > len(b):
        raise _Invalid
    return b[i:end].decode("utf-8"), end


def _optional(read, b: bytes, i: int):
    """A ``["null", T]`` union at ``b[i]``: branch 0 is None, branch 1 a value ``read`` reads."""
    branch, i = _long(b, i)
    if branch == 0:
        return None, i
    if branch == 1:
        return read(b, i)
    raise _Invalid


def _map(b: bytes, i: int, into: dict[str, str]) -> int:
    """Read the Avro map of strings at ``i`` into ``into``; returns the position after it. Raises
    :class:`MetadataTooLarge` past ``MAX_METADATA_ENTRIES`` entries, before reading them."""
    seen = 0
    while True:
        if b[i] == 0:
            return i + 1
        count, i = _long(b, i)
        if count < 0:  # a block with its size in bytes first
            _, i = _long(b, i)
            count = -count
        seen += count
        if seen > MAX_METADATA_ENTRIES:
            raise MetadataTooLarge(seen)
        for _ in range(count):
            k, i = _string(b, i)
            into[k], i = _string(b, i)


def read_document(value: bytes) -> Fields | None:
    """The fields of the schemaless ``document.avsc`` record that is all of ``value``, or None when
    it is not one (read it with fastavro for the reason). Raises :class:`MetadataTooLarge` where its
    metadata map claims more entries than any valid row holds (fastavro would step through them)."""
    try:
        # The id and the text inline (a call a field was a third of this reader's time): a length
        # below 64 is one byte (zig-zag: even), a longer one a varint.
        n = value[0]
        if n < 0x80 and not n & 1:
            n, i = n >> 1, 1
        else:
            n, i = _long(value, 0)
        end = i + n
        if n < 0 or end > len(value):
            return None
        doc_id = value[i:end].decode("utf-8")
        n = value[end]
        if n < 0x80 and not n & 1:
            n, i = n >> 1, end + 1
        else:
            n, i = _long(value, end)
        end = i + n
        if n < 0 or end > len(value):
            return None
        text = value[i:end].decode("utf-8")
        i = end
        # The common record has no model and no metadata (a zero byte each) and an event time or
        # none (branch 1 of its union, or 0), read here without a call.
        if value[i] == 0:
            model, i = None, i + 1
        else:
            model, i = _optional(_string, value, i)
        metadata: dict[str, str] = {}
        if value[i] == 0:
            i += 1
        else:
            i = _map(value, i, metadata)
        branch = value[i]
        if branch == 0:
            event_time, i = None, i + 1
        elif branch == 2:
            event_time, i = _long(value, i + 1)
        else:
            event_time, i = _optional(_long, value, i)
    except (_Invalid, IndexError, UnicodeDecodeError):
        return None
    if i != len(value):
        return None
    return doc_id, text, model, metadata, event_time
