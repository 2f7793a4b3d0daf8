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

import io
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.common._httpx_compat import httpx  # whichever the client uses
from confluent_kafka.schema_registry.common.avro import parse_schema_with_repo
from fastavro.read import SchemaResolutionError

from schemas.avro_shapes import json_depth, recursive_type, zero_byte_collection
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


def with_writer_aliases(reader: dict[str, Any], writer: Any) -> dict[str, Any] | None:
    """``reader`` with aliases added for the fields ``writer`` (parsed JSON) renamed (a writer field that
    lists one of our names in its ``aliases`` and no field of that name); None when it renames nothing."""
    if not isinstance(writer, dict) or writer.get("type") != "record" or not isinstance(writer.get("fields"), list):
        return None
    fields = [f for f in writer["fields"] if isinstance(f, dict) and isinstance(f.get("name"), str)]
    names = {f["name"] for f in fields}
    renamed = {alias: f["name"] for f in fields for alias in (f.get("aliases") or ())
               if isinstance(alias, str) and alias not in names}
    if not any(f["name"] in renamed for f in reader["fields"]):
        return None
    widened = [{**f, "aliases": [*f.get("aliases", []), renamed[f["name"]]]} if f["name"] in renamed else f
               for f in reader["fields"]]
    return {**reader, "fields": widened}


#: A writer schema is refused past these (real ones are a few KB and a few levels deep): every walk of
#: a schema, ours and fastavro's, recurses, and a schema is fetched on the polling thread.
MAX_SCHEMA_CHARS = 1_000_000
MAX_SCHEMA_DEPTH = 64
#: Schemas a writer schema may reference (``references``, followed transitively).
MAX_REFERENCES = 64


def _refusal(parsed: Any) -> str | None:
    """Why no record written with ``parsed`` (fastavro's parse of the writer schema) is read (None:
    they are): a type that holds itself (the reader's recursion in C has no bound), or an array or map
    of items that take no bytes, whose count alone could hold the polling thread for ever."""
    looped = recursive_type(parsed)
    if looped is not None:
        return (f"its type {looped} holds itself: a record may nest it as deep as its bytes claim, and the "
                "reader recurses once a level, in C, until the process dies; recursive types are refused")
    where = zero_byte_collection(parsed)
    if where is None:
        return None
    return (f"its {where} takes no bytes per item, so a few bytes could claim 2^62 items; such schemas "
            "are refused (give the items a field, or use another type)")


def _shape_refusal(text: str, what: str) -> str | None:
    """Why the schema text ``text`` is refused before it is parsed (None: it may be parsed)."""
    if len(text) > MAX_SCHEMA_CHARS:
        return f"{what} is {len(text):,} characters, over the {MAX_SCHEMA_CHARS:,} a writer schema may be"
    if json_depth(text, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels"
    return None


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


class _Refused(Exception):
    """A writer schema refused, with why (its message)."""


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text[:200] + ("…" if len(text) > 200 else "")


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
        #: Writer schemas as parsed, by id, of those whose records are read whole with it first
        #: (:meth:`_read_whole`): the ones whose resolved read would skip a field.
        self._writers: dict[int, Any] = {}
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

    def _ask(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``'s answer from the registry; None where it answered 404. Raises
        :class:`TransientError` where it did not answer (a refusal, a timeout, a 5xx, 401/403)."""
        try:
            return call()
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise TransientError("schema registry", f"{what} at {self.url}: {exc}") from None
        except (httpx.HTTPError, OSError, ValueError) as exc:  # connection refused, timeouts, a page not JSON
            raise TransientError("schema registry", f"{what} at {self.url}: {exc!r}") from None

    def _fetch(self, sid: int) -> None:
        if self._budget_spent():
            self._remember_missing(sid, asked=False)
            return
        try:
            schema = self._ask(f"looking up schema id {sid}", lambda: self.client.get_schema(sid))
        except TransientError:
            raise
        except Exception as exc:  # the client could not make sense of the registry's answer for this id
            self._refuse(sid, f"the registry's answer could not be read ({type(exc).__name__}: {_short(exc)})")
            return
        if schema is None:
            self._remember_missing(sid, asked=True)
            return
        try:
            reason = self._judge(sid, schema)
        except TransientError:
            raise
        except _Refused as refused:
            reason = str(refused)
        except Exception as exc:  # whatever a hostile schema makes a walk raise: RecursionError, KeyError...
            reason = f"it could not be read as an Avro schema ({type(exc).__name__}: {_short(exc)})"
        if reason is not None:
            self._refuse(sid, reason)
        self._known.add(sid)

    def _refuse(self, sid: int, reason: str) -> None:
        """No record written with schema ``sid`` is read, for ``reason`` (decided once)."""
        log.warning("schema id %d: %s; its records are dead-lettered (incompatible_schema)", sid, reason)
        self._refused[sid] = reason
        self._known.add(sid)

    def _judge(self, sid: int, schema: Schema) -> str | None:
        """Why records written with ``schema`` are refused (None: they are read). The registry's answer
        is input like a record's bytes: bounded before any recursive walk, parsed as the deserializer
        parses it (its references resolved the same way), and walked as fastavro resolved its names."""
        kind = schema.schema_type or "AVRO"
        if not isinstance(kind, str) or kind.upper() != "AVRO":
            return f"it is a {str(kind)[:20]!r} schema; this worker reads Avro schemas only"
        rules = schema.rule_set
        if rules is not None and (rules.migration_rules or rules.domain_rules):
            return "its rule set asks readers to run rules (CEL, JSONata, encryption); this worker runs none"
        text = schema.schema_str or ""
        refusal = _shape_refusal(text, "it")
        if refusal is not None:
            return refusal
        named: dict[str, Any] = {}
        self._references(schema, named, [0])
        parsed = parse_schema_with_repo(text, named)
        refusal = _refusal(parsed)
        if refusal is not None:
            return refusal
        reader = with_writer_aliases(self._reader, json.loads(text))
        if not self._same_fields(parsed, reader or self._reader):  # the resolved read would skip some
            self._writers[sid] = parsed
        if reader is not None:
            self._renamed[sid] = AvroDeserializer(self.client, json.dumps(reader))
        return None

    def _references(self, schema: Schema, named: dict[str, Any], fetched: list[int]) -> None:
        """Fill ``named`` with the schemas ``schema`` references, transitively, as confluent-kafka's
        deserializer resolves them; at most ``MAX_REFERENCES`` fetched (a cycle ends there)."""
        for ref in schema.references or ():
            fetched[0] += 1
            if fetched[0] > MAX_REFERENCES:
                raise _Refused(f"it references more than {MAX_REFERENCES} schemas")
            if not (isinstance(ref.subject, str) and isinstance(ref.name, str) and isinstance(ref.version, int)):
                raise _Refused("it has a reference without a subject, a name or a version")
            got = self._ask(f"looking up reference {ref.subject!r} version {ref.version}",
                            partial(self.client.get_version, ref.subject, ref.version, True))
            if got is None:
                raise _Refused(f"it references {ref.subject[:100]!r} version {ref.version}, which the registry "
                               "does not know")
            text = got.schema.schema_str or ""
            refusal = _shape_refusal(text, f"its reference {ref.name[:100]!r}")
            if refusal is not None:
                raise _Refused(refusal)
            self._references(got.schema, named, fetched)
            named[ref.name] = json.loads(text)

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
            self._read_whole(sid, data)
            return deserializer(data, None)
        except SchemaResolutionError as exc:
            raise DecodeError("incompatible_schema", f"{what} was written with schema id {sid}, which does not "
                                                     f"resolve against schemas/document.avsc: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DecodeError("invalid_utf8", f"Avro string in the {what} is not valid UTF-8: {exc}") from None
        except Exception as exc:  # fastavro raises many types on a body that does not match its schema
            raise DecodeError("decode_error", f"{what} does not decode with its schema id {sid}: {exc!r}") from None

    @staticmethod
    def _same_fields(writer: Any, reader: dict[str, Any]) -> bool:
        """Whether every field of ``writer`` (parsed) is a field of ``reader`` (by name or alias) of the
        very same type: then resolving reads every byte and skips nothing (a producer writing
        ``document.avsc`` itself, the common case), and no whole read first is needed."""
        if not isinstance(writer, dict) or writer.get("type") != "record":
            return False
        ours: dict[str, Any] = fastavro.parse_schema(reader, _write_hint=False)  # type: ignore[assignment]
        by_name = {name: f["type"] for f in ours["fields"] for name in (f["name"], *f.get("aliases", ()))}
        return all(f["name"] in by_name and json.dumps(f["type"], sort_keys=True) ==
                   json.dumps(by_name[f["name"]], sort_keys=True) for f in writer["fields"])

    def _read_whole(self, sid: int, data: bytes) -> None:
        """Read ``data`` with its writer schema alone, every field and item, before the resolved read.
        Resolving against our schema *skips* the writer's other fields, and fastavro skips an item of
        fixed size (a float, a double, a ``fixed``) by seeking, without looking for the end: a few
        bytes claiming 2^62 floats in a field we do not read held the polling thread for ever. Read,
        every item takes its bytes, so an array's count is bounded by the record's size."""
        writer = self._writers.get(sid)
        if writer is not None:
            fastavro.schemaless_reader(io.BytesIO(data[5:]), writer)

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
