"""Turn a consumed Kafka message into one entry: Item, Delete or DeadLetter.

Runs on the polling thread, so it does only cheap checks; the size limit is enforced on the raw
bytes before anything is decoded or tokenised, so a 50 MB value costs one ``len``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import TIMESTAMP_CREATE_TIME

from connectors.milvus.schema import METADATA_MAX_BYTES, metadata_too_large
from connectors.registry import SchemaRegistry, schema_id
from schemas.codec import DecodeError, Tombstone, decode_document
from schemas.errors import TransientError
from worker.core.records import DeadLetter, Delete, Entry, Item, Source, content_hash, headers_size, normalise_text

log = logging.getLogger(__name__)

#: Milvus VARCHAR primary key limit (bytes) of the collection this worker creates.
MAX_ID_BYTES = 512


class Validator:
    """``validate(msg)`` → an :class:`Entry`; never raises for any message content.

    ``resolve_model(name)`` names the model of the worker's set that serves a record's ``model`` field
    (None: none does).
    Token counts are filled later, per consumed chunk, by the caller (one tokenizer call).
    """

    def __init__(self, max_bytes: int, resolve_model: Callable[[str | None], str | None],
                 keep_original: Callable[[int], bool] = lambda chars: False, *,
                 registry: SchemaRegistry | None = None, key_field: str | None = None,
                 keep_large: int | None = None, forward: Iterable[str] = (),
                 max_deliveries: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.resolve_model = resolve_model
        #: Reads registry-framed keys and values; None: no registry configured.
        self.registry = registry
        self.key_field = key_field
        #: Whether a text of so many characters might be dead-lettered later (too many chunks): its
        #: item is then marked ``large``.
        self.keep_original = keep_original
        #: Bytes of key and value past which a record's output might be over the output topic's
        #: limit (``worker.steps.writing.fit.output_room``): its item is then marked ``large`` too.
        self.keep_large = keep_large
        #: Names of the input headers copied to the output records (``EMBEDSTREAM_FORWARD_HEADERS``),
        #: matched without regard to case (HTTP's, whence the trace context comes, are case-insensitive).
        self.forward = frozenset(name.lower() for name in forward)
        #: Share groups: a record the broker delivered more times than this is dead-lettered
        #: (``delivery_count_exceeded``) before anything else is done with it; None: a consumer group.
        self.max_deliveries = max_deliveries

    def resolve_schemas(self, msgs: list) -> None:
        """Look up the writer schemas of the framed records in ``msgs`` that the registry has not
        answered for yet, so that ``validate`` never waits on the network. Raises
        ``TransientError`` while the registry is out (the caller holds ``msgs`` and retries)."""
        if self.registry is None:
            return
        try:
            self.registry.resolve({sid for m in msgs for data in (m.key(), m.value())
                                   if (sid := schema_id(data)) is not None})
        except TransientError:
            raise
        except Exception:  # never expected (the registry refuses what it cannot judge): validate() meets it
            log.exception("looking up the writer schemas of %d records failed", len(msgs))

    def validate(self, msg) -> Entry:
        """The record's entry. Raises only ``TransientError`` (the registry is out: the caller retries);
        whatever else the record's content makes any step raise is a dead letter (``decode_error``,
        naming the exception's type), never a crash of the polling thread."""
        try:
            return self._validate(msg)
        except TransientError:
            raise
        except Exception as exc:  # the last guard: a decoder's gap must not stop the worker
            ts_type, ts = msg.timestamp()
            source = Source(msg.topic(), msg.partition(), msg.offset(), ts if ts_type and ts > 0 else None)
            text = str(exc)
            return _dead(source, msg, "decode_error", f"the record could not be read ({type(exc).__name__}: "
                                                      f"{text[:200]}{'…' if len(text) > 200 else ''})")

    def _validate(self, msg) -> Entry:
        ts_type, ts = msg.timestamp()
        source = Source(msg.topic(), msg.partition(), msg.offset(), ts if ts_type and ts > 0 else None)
        key, value = msg.key(), msg.value()
        if self.max_deliveries is not None and (msg.delivery_count() or 0) > self.max_deliveries:
            return _dead(source, msg, "delivery_count_exceeded",
                         f"delivered {msg.delivery_count()} times, over EMBEDSTREAM_SHARE_MAX_DELIVERIES="
                         f"{self.max_deliveries}: each delivery before ended without an acknowledgement (a worker "
                         "that crashed or stalled on it, or an outage longer than its lock); replay it from the DLQ "
                         "once the cause is fixed")
        if value is not None and len(value) > self.max_bytes:
            return _dead(source, msg, "text_too_long", f"value is {len(value):,} bytes, over the limit of "
                                                       f"{self.max_bytes:,} (EMBEDSTREAM_MAX_TEXT_BYTES)")
        try:
            doc = decode_document(key, value, framed=self.registry, key_field=self.key_field)
        except DecodeError as exc:
            return _dead(source, msg, exc.reason, exc.message)
        if len(doc.id.encode("utf-8")) > MAX_ID_BYTES:
            return _dead(source, msg, "id_too_long", f"document id is over {MAX_ID_BYTES} bytes")
        # a record without headers (most) costs one call here, not a scan
        raw = msg.headers() if self.forward else None
        headers = self._forwarded(raw) if raw else None
        if isinstance(doc, Tombstone):
            return Delete(source, doc.id, headers=headers)
        model = self.resolve_model(doc.model)
        if model is None:
            return _dead(source, msg, "unknown_model",
                         f"record asks for model {doc.model!r}, which this worker does not serve")
        text = normalise_text(doc.text)
        if not text:
            return _dead(source, msg, "empty_text", "text is empty (or only whitespace)")
        over = metadata_too_large(doc.metadata)
        if over is not None:
            return _dead(source, msg, "metadata_too_large", f"its metadata is {over:,} bytes as JSON, over the "
                                                            f"{METADATA_MAX_BYTES:,} that Milvus takes in a JSON field")
        event_time = doc.event_time
        if event_time is None and ts_type == TIMESTAMP_CREATE_TIME:  # the producer's clock, not the broker's
            event_time = source.timestamp_ms
        item = Item(source, doc.id, text, content_hash(text), 0, doc.metadata, model=model, event_time=event_time,
                    headers=headers)
        item.original = (key, value, raw if self.forward else msg.headers())
        item.large = self.keep_original(len(text)) or (self.keep_large is not None
                                                        and self._large(key, value, headers, self.keep_large))
        return item

    @staticmethod
    def _large(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None, limit: int) -> bool:
        """Whether the record is past ``limit`` (``keep_large``), its forwarded headers counted (a
        large one alone can make the output record too large for its topic)."""
        return len(value) + len(key or b"") + (headers_size(headers) if headers else 0) > limit

    def _forwarded(self, raw: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes]] | None:
        """The headers of the record's ``raw`` headers that its output records carry (in their
        order; None: none)."""
        kept = [(k, v) for k, v in raw if k.lower() in self.forward and v is not None]
        return kept or None


def _dead(source: Source, msg, reason: str, message: str) -> DeadLetter:
    """The dead letter of ``msg``: its key, value and headers as they came, and why."""
    return DeadLetter(source, msg.key(), msg.value(), msg.headers(), reason, message)
