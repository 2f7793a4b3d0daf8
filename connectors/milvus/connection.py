"""One dedicated ``MilvusClient`` on one collection, which the write, read and administration
classes share (:meth:`MilvusConnection.sharing`) or open for themselves."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from schemas.errors import ConfigError, Refused, TransientError
from schemas.redact import without_userinfo

# pymilvus pings every 10 s even without calls; gRPC servers by default allow one ping per 5 min
# and answer more with GOAWAY "too_many_pings", dropping the channel. Every call here carries its
# own timeout, so keepalive pings add nothing: keep them rare and only during calls.
_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": 0}

C = TypeVar("C", bound="MilvusConnection")


def transient(exc: Exception) -> TransientError:
    """A failure of the server or the network: the caller retries."""
    return TransientError("milvus", f"{type(exc).__name__}: {exc}")


#: Milvus' status codes (``code``, from 2.3) for a request it will never take: invalid, missing or too
#: large a parameter.
_INPUT_CODES = frozenset({1100, 1101, 1102})
#: The older ``error_code`` values that say the same: illegal argument, dimension, row, vector id.
_INPUT_ERROR_CODES = frozenset({5, 7, 11, 12})
#: milvus-lite's answer to an invalid request: code and error code 6 (its "IllegalArgument"; no
#: Milvus server answers 6 in both).
_LITE_INPUT = 6


class CollectionGone(TransientError):
    """The collection (or its database) is not there: dropped under a running worker, say. An outage of
    the collection, not a refusal of the records: the worker prepares it again and retries."""


#: Milvus' codes for a collection, and a database, that do not exist.
_GONE_CODES = frozenset({100, 800})
_GONE = re.compile(r"(collection|database)\b.*\b(not found|does not exist|not exist|doesn't exist)", re.IGNORECASE)


def gone(exc: Exception) -> bool:
    """Whether Milvus answered that the collection or the database of the call does not exist (newer
    servers mark that as the caller's error: it is not the records')."""
    code = getattr(exc, "code", None)
    return code in _GONE_CODES or bool(_GONE.search(str(getattr(exc, "message", None) or exc)))


def refused(exc: Exception) -> bool:
    """Whether Milvus answered that it will never take the request as it is (its data), as opposed to
    an outage (no answer, a timeout, the server not ready, a limit on rate or memory, a collection or
    database that is not there, anything else)."""
    from pymilvus.exceptions import MilvusException, ParamError

    if gone(exc):
        return False
    if isinstance(exc, ParamError):  # pymilvus' own check of the data, before anything is sent
        return True
    if not isinstance(exc, MilvusException):
        return False
    if getattr(exc, "is_input_error", False):  # Milvus 2.5 marks the caller's errors so
        return True
    code, compatible = exc.code, getattr(exc, "compatible_code", None)
    return code in _INPUT_CODES or compatible in _INPUT_ERROR_CODES or code == compatible == _LITE_INPUT


def failure(exc: Exception) -> TransientError | Refused:
    """What a failed call on the data path means: :class:`Refused` (with Milvus' message) when Milvus
    will never take it, :class:`CollectionGone` when the collection or its database is not there, else
    an outage the caller retries."""
    if gone(exc):
        return CollectionGone("milvus", f"{type(exc).__name__}: {exc}")
    if refused(exc):
        message = getattr(exc, "message", None) or str(exc)
        return Refused("milvus", message if len(message) <= 500 else message[:499] + "…")
    return transient(exc)


def missing(exc: Exception) -> bool:
    """The server answered that the thing asked for does not exist."""
    text = str(exc).lower()
    return "not exist" in text or "not found" in text


#: pymilvus' TLS options by the setting that gives each.
_TLS_FILES = {"server_pem_path": "EMBEDSTREAM_MILVUS_TLS_CA_FILE", "ca_pem_path": "EMBEDSTREAM_MILVUS_TLS_CA_FILE",
              "client_pem_path": "EMBEDSTREAM_MILVUS_TLS_CERT_FILE",
              "client_key_path": "EMBEDSTREAM_MILVUS_TLS_KEY_FILE"}


def connect(uri: str, token: str | None, timeout: float, options: Mapping[str, Any] | None = None) -> Any:
    """A ``MilvusClient``; a refused handshake is retried for a few seconds before the URI is called wrong.
    ``options``: pymilvus' own for a database (``db_name``) and TLS (``secure``, ``server_pem_path`` for a
    private CA; ``ca_pem_path``, ``client_pem_path``, ``client_key_path`` for mutual TLS)."""
    from pymilvus import MilvusClient

    options = dict(options or {})
    for key, setting in _TLS_FILES.items():  # a missing file said as such, not as a failed handshake
        path = options.get(key)
        if path and not Path(str(path)).is_file():
            raise ConfigError(f"{setting}={path!r}: no such file")

    deadline = time.monotonic() + max(timeout, 5.0)
    delay = 0.25
    while True:
        try:
            # dedicated: pymilvus otherwise shares one channel per URI in a process, and recovers it
            # with the timeout of whichever client opened it first.
            client = MilvusClient(uri=uri, token=token or "", timeout=timeout, dedicated=True,
                                  grpc_options=_GRPC_OPTIONS, **options)
            if options.get("db_name"):
                # a server may take the connection and refuse each call after it: asked now, said once
                client.list_collections(timeout=timeout)
            return client
        except Exception as exc:
            if "database" in str(exc).lower() and missing(exc):
                raise ConfigError(f"Milvus at {without_userinfo(uri)!r} has no database "
                                  f"{options.get('db_name')!r}: create it, or check "
                                  "EMBEDSTREAM_MILVUS_DB_NAME (unset: Milvus' `default`)") from None
            # A busy or just-starting server refuses the handshake now and then.
            if time.monotonic() + delay > deadline:
                check = _what_to_check(exc, options, uri)
                raise ConfigError(f"cannot reach Milvus at {without_userinfo(uri)!r}: {exc}. {check}") from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _what_to_check(exc: Exception, options: Mapping[str, Any], uri: str) -> str:
    """The settings to look at for a handshake that failed with ``exc`` (TLS ones when TLS was asked for:
    gRPC says only "unavailable" of a certificate it does not trust)."""
    text = str(exc).lower()
    tls = options.get("secure") or uri.lower().startswith("https://")
    if tls or "ssl" in text or "certificate" in text or "handshake" in text:
        return ("Check EMBEDSTREAM_MILVUS_URI and the TLS settings: EMBEDSTREAM_MILVUS_TLS_CA_FILE must be the CA "
                "that signed the server's certificate, and a server that asks for a client certificate needs "
                "EMBEDSTREAM_MILVUS_TLS_CERT_FILE and _KEY_FILE.")
    return "Check EMBEDSTREAM_MILVUS_URI."


class _QuietProbes(logging.Filter):
    """pymilvus logs every failed call at ERROR with a traceback, before the caller sees it. Asking
    whether an alias exists is a question here, not a failure (every first start asks): its "does not
    exist" answers are dropped; every other error still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("RPC error: [describe_alias]") and "not exist" in text.split("\n", 1)[0])


logging.getLogger("pymilvus.decorators").addFilter(_QuietProbes())


class MilvusConnection:
    """A client on ``collection`` (chunk rows), its companion ``<collection>_deleted`` (the version
    of each document id's last delete) and, in a share group, ``<collection>_claims``."""

    def __init__(self, uri: str, collection: str, token: str | None = None, timeout: float = 10.0, *,
                 client: Any = None, options: Mapping[str, Any] | None = None) -> None:
        self.uri = uri
        self.collection = collection
        self.tombstones = f"{collection}_deleted"
        #: A share group's claims on the versions its members write (``connectors.milvus.claims``).
        self.claims_collection = f"{collection}_claims"
        self.timeout = timeout
        self._client = client if client is not None else connect(uri, token, timeout, options)

    @classmethod
    def sharing(cls: type[C], other: MilvusConnection, collection: str | None = None) -> C:
        """This job on ``other``'s client (one connection for several jobs), on ``collection`` or
        ``other``'s. Closing either closes both."""
        return cls(other.uri, collection or other.collection, timeout=other.timeout, client=other._client)

    @property
    def where(self) -> str:
        """The server's URI as messages show it (without its user info)."""
        return without_userinfo(self.uri)

    def has(self, name: str) -> bool:
        """Whether ``name`` answers as a collection: an alias of one does too (Milvus resolves it)."""
        return bool(self._client.has_collection(name, timeout=self.timeout))

    def alias_target(self, alias: str) -> str | None:
        """The collection ``alias`` points to; None when there is no alias of that name."""
        try:
            return self._client.describe_alias(alias, timeout=self.timeout)["collection_name"]
        except Exception as exc:
            if missing(exc):
                return None
            raise transient(exc) from None

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
