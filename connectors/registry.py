"""The schema registry, through confluent-kafka's own client and Avro deserializer.

Records framed by a registry serializer are magic byte 0, a 4-byte big-endian schema id, then the
Avro body written with that schema. :class:`SchemaRegistry` turns the three ways reading one can fail
into this project's three kinds of failure:

* the registry does not know the id (HTTP 404) → :class:`DecodeError` ``unknown_schema``;
* the writer's schema cannot be resolved against ours (fastavro's schema resolution) →
  :class:`DecodeError` ``incompatible_schema``;
* the registry does not answer, times out, or answers 5xx/401/403 → :class:`TransientError`: the
  record is retried, never dead-lettered.

Writer schemas are cached by id (the client's cache, plus the ids known to be missing), so the
registry is asked once per schema id, not per record. :meth:`SchemaRegistry.resolve` asks for every
id of a consumed chunk up front: the polling thread can then hold that chunk while the registry is
out (``worker.core.loop``), and decoding itself never waits on the network.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer
from fastavro.read import SchemaResolutionError

from schemas.avro_shapes import zero_byte_collection
from schemas.codec import is_framed
from schemas.errors import ConfigError, DecodeError, TransientError
from schemas.redact import without_userinfo

__all__ = ["SchemaRegistry", "client_conf", "frame", "schema_id", "without_userinfo"]

log = logging.getLogger(__name__)

MAGIC = b"\x00"
#: Seconds one registry request may take before it counts as an outage (the polling thread waits
#: that long at most; the loop retries with backoff).
DEFAULT_TIMEOUT_S = 5


def schema_id(data: bytes | None) -> int | None:
    """The schema id of a registry-framed value or key, else None (too short, or no magic byte)."""
    if data is None or not is_framed(data):
        return None
    return int.from_bytes(data[1:5], "big")


def with_writer_aliases(reader: dict[str, Any], writer_text: str) -> dict[str, Any] | None:
    """``reader`` with aliases added for the fields ``writer_text`` renamed (a writer field that lists
    one of our names in its ``aliases`` and no field of that name); None when it renames nothing."""
    try:
        writer = json.loads(writer_text)
    except ValueError:
        return None
    if not isinstance(writer, dict) or writer.get("type") != "record":
        return None
    names = {f["name"] for f in writer.get("fields", [])}
    renamed = {alias: f["name"] for f in writer.get("fields", []) for alias in f.get("aliases", [])
               if alias not in names}
    if not any(f["name"] in renamed for f in reader["fields"]):
        return None
    fields = [{**f, "aliases": [*f.get("aliases", []), renamed[f["name"]]]} if f["name"] in renamed else f
              for f in reader["fields"]]
    return {**reader, "fields": fields}


def _refusal(writer_text: str) -> str | None:
    """Why no record written with ``writer_text`` is read (None: they are): an array or map of items
    that take no bytes, whose count alone could hold the polling thread for ever."""
    try:
        writer = json.loads(writer_text)
    except ValueError:
        return None  # the deserializer says what is wrong with it
    where = zero_byte_collection(writer)
    if where is None:
        return None
    return (f"its {where} takes no bytes per item, so a few bytes could claim 2^62 items; such schemas "
            "are refused (give the items a field, or use another type)")


def frame(sid: int) -> bytes:
    """The 5-byte prefix of a record written with schema ``sid``."""
    return MAGIC + sid.to_bytes(4, "big")


def client_conf(url: str, passthrough: Mapping[str, str]) -> dict[str, Any]:
    """``SchemaRegistryClient`` properties: the URL, then ``EMBEDSTREAM_SCHEMA_REGISTRY__*`` ones
    (credentials, TLS, timeouts) with numbers as numbers, as the client checks their types."""
    conf: dict[str, Any] = {"url": url, "timeout": DEFAULT_TIMEOUT_S, "max.retries": 0}
    for key, value in passthrough.items():
        conf[key] = int(value) if value.lstrip("-").isdigit() else value
    return conf


#: Schema ids the registry answered it does not know are remembered this long (a producer may
#: register the schema later) and at most this many (a topic of garbage whose first bytes spell a
#: frame names a new "schema id" with nearly every record: memory must not grow with them).
MISSING_TTL_S = 300.0
MISSING_MAX = 10_000
#: The registry is asked about at most this many ids it turns out not to know within
#: ``MISSING_TTL_S``; past that, a new id is taken as unknown without asking (its record is
#: dead-lettered ``unknown_schema``, the message says why). Random frames name a new id with nearly
#: every record: requests must be bounded by this budget, not by the number of records.
MISSING_LOOKUPS = 1_000


class SchemaRegistry:
    """Read registry-framed Avro against our schema, and register our output schema."""

    def __init__(self, conf: Mapping[str, Any], reader_schema: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        try:
            self.client = SchemaRegistryClient(dict(conf))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"schema registry settings: {exc} (check EMBEDSTREAM_SCHEMA_REGISTRY_URL and "
                              "EMBEDSTREAM_SCHEMA_REGISTRY__* properties)") from None
        self.url = without_userinfo(str(conf["url"]))
        self._reader = json.loads(reader_schema)
        self._documents = AvroDeserializer(self.client, reader_schema)
        #: Writer schemas that rename one of our fields (their field lists our name in ``aliases``)
        #: are read with our schema plus the new names as aliases (Avro resolves aliases of the reader).
        self._renamed: dict[int, AvroDeserializer] = {}
        self._generic = AvroDeserializer(self.client)
        self._known: set[int] = set()
        #: Writer schemas no record is read with, by id, and why (``schemas.avro_shapes``).
        self._refused: dict[int, str] = {}
        #: Missing schema id → (when the registry said so or it was taken as missing, whether the
        #: registry was asked), oldest first (``MISSING_TTL_S``, ``MISSING_MAX``).
        self._missing: OrderedDict[int, tuple[float, bool]] = OrderedDict()
        #: When the registry last answered "unknown" (``MISSING_LOOKUPS`` at most, oldest first).
        self._misses: deque[float] = deque(maxlen=MISSING_LOOKUPS)
        self._clock = clock

    def _remember_missing(self, sid: int, asked: bool) -> None:
        now = self._clock()
        self._missing[sid] = (now, asked)
        self._missing.move_to_end(sid)
        if asked:
            self._misses.append(now)
        while len(self._missing) > MISSING_MAX:
            self._missing.popitem(last=False)

    def _budget_spent(self) -> bool:
        """Whether the registry said "unknown" ``MISSING_LOOKUPS`` times within ``MISSING_TTL_S``."""
        misses = self._misses
        return len(misses) == MISSING_LOOKUPS and self._clock() - misses[0] <= MISSING_TTL_S

    def _fetch(self, sid: int) -> None:
        if self._budget_spent():
            self._remember_missing(sid, asked=False)
            return
        try:
            schema = self.client.get_schema(sid)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                self._remember_missing(sid, asked=True)
                return
            raise TransientError("schema registry", f"looking up schema id {sid} at {self.url}: {exc}") from None
        except Exception as exc:  # connection refused, timeouts: the HTTP library's own types
            raise TransientError("schema registry", f"looking up schema id {sid} at {self.url}: {exc!r}") from None
        reason = _refusal(schema.schema_str or "")
        if reason is not None:
            log.warning("schema id %d: %s; its records are dead-lettered (incompatible_schema)", sid, reason)
            self._refused[sid] = reason
        reader = with_writer_aliases(self._reader, schema.schema_str or "")
        if reader is not None:
            self._renamed[sid] = AvroDeserializer(self.client, json.dumps(reader))
        self._known.add(sid)

    def resolve(self, ids: Iterable[int]) -> None:
        """Make sure every schema id in ``ids`` is known or known to be missing. Raises
        :class:`TransientError` when the registry does not answer (nothing is cached then)."""
        for sid in ids:
            if sid not in self._known and not self.missing(sid):
                self._fetch(sid)

    def missing(self, sid: int) -> bool:
        """Whether the registry said lately (within ``MISSING_TTL_S``) that it does not know ``sid``."""
        said = self._missing.get(sid)
        if said is None:
            return False
        if self._clock() - said[0] > MISSING_TTL_S:
            del self._missing[sid]  # ask again: the schema may have been registered since
            return False
        return True

    def _read(self, deserializer: AvroDeserializer, data: bytes, what: str) -> Any:
        sid = schema_id(data)
        if sid is None:
            raise DecodeError("decode_error", f"{what} is not registry-framed (magic byte 0 and a schema id)")
        self.resolve([sid])
        if self.missing(sid):
            if not self._missing[sid][1]:  # taken as missing without asking
                raise DecodeError("unknown_schema", f"{what} is framed with schema id {sid}, which the registry at "
                                                    f"{self.url} was not asked about: it answered 'unknown' for "
                                                    f"{MISSING_LOOKUPS:,} ids in the last {MISSING_TTL_S:.0f} s "
                                                    "(a topic of records that are not registry-framed Avro?)")
            raise DecodeError("unknown_schema", f"{what} is framed with schema id {sid}, which the registry at "
                                                f"{self.url} does not know")
        refused = self._refused.get(sid)
        if refused is not None:
            raise DecodeError("incompatible_schema", f"{what} was written with schema id {sid}: {refused}")
        try:
            return deserializer(data, None)
        except SchemaResolutionError as exc:
            raise DecodeError("incompatible_schema", f"{what} was written with schema id {sid}, which does not "
                                                     f"resolve against schemas/document.avsc: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DecodeError("invalid_utf8", f"Avro string in the {what} is not valid UTF-8: {exc}") from None
        except Exception as exc:  # fastavro raises many types on a body that does not match its schema
            raise DecodeError("decode_error", f"{what} does not decode with its schema id {sid}: {exc!r}") from None

    def read_document(self, value: bytes) -> dict[str, Any]:
        """The value as a dict of ``document.avsc`` fields (the writer's schema resolved against ours)."""
        rec = self._read(self._renamed.get(schema_id(value) or 0, self._documents), value, "value")
        if not isinstance(rec, dict):
            raise DecodeError("incompatible_schema", "value's schema is not a record")
        return rec

    def read_key(self, key: bytes) -> Any:
        """The key as its writer wrote it (a record is a dict; a primitive is itself)."""
        return self._read(self._generic, key, "key")

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (or find it there); its id. Raises
        :class:`ConfigError` when the subject holds an incompatible schema, TransientError on an outage."""
        try:
            return self.client.register_schema(subject, Schema(schema, "AVRO"))
        except SchemaRegistryError as exc:
            if exc.http_status_code in (409, 422):
                raise ConfigError(f"the registry at {self.url} refused our output schema under subject {subject!r}: "
                                  f"{exc}. Its latest version there is not compatible with schemas/embedding.avsc: "
                                  "register a compatible one, or change the subject's compatibility level.") from None
            raise TransientError("schema registry", f"registering under {subject!r}: {exc}") from None
        except Exception as exc:
            raise TransientError("schema registry", f"registering under {subject!r} at {self.url}: {exc!r}") from None
