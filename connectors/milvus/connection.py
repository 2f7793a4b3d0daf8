"""One dedicated ``MilvusClient`` on one collection, which the write, read and administration
classes share (:meth:`MilvusConnection.sharing`) or open for themselves."""

from __future__ import annotations

import logging
import time
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


def refused(exc: Exception) -> bool:
    """Whether Milvus answered that it will never take the request as it is (its data), as opposed to
    an outage (no answer, a timeout, the server not ready, a limit on rate or memory, anything else)."""
    from pymilvus.exceptions import MilvusException, ParamError

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
    will never take it, else an outage the caller retries."""
    if refused(exc):
        message = getattr(exc, "message", None) or str(exc)
        return Refused("milvus", message if len(message) <= 500 else message[:499] + "…")
    return transient(exc)


def missing(exc: Exception) -> bool:
    """The server answered that the thing asked for does not exist."""
    text = str(exc).lower()
    return "not exist" in text or "not found" in text


def connect(uri: str, token: str | None, timeout: float) -> Any:
    """A ``MilvusClient``; a refused handshake is retried for a few seconds before the URI is called wrong."""
    from pymilvus import MilvusClient

    deadline = time.monotonic() + max(timeout, 5.0)
    delay = 0.25
    while True:
        try:
            # dedicated: pymilvus otherwise shares one channel per URI in a process, and recovers it
            # with the timeout of whichever client opened it first.
            return MilvusClient(uri=uri, token=token or "", timeout=timeout, dedicated=True,
                                grpc_options=_GRPC_OPTIONS)
        except Exception as exc:
            # A busy or just-starting server refuses the handshake now and then.
            if time.monotonic() + delay > deadline:
                raise ConfigError(f"cannot reach Milvus at {without_userinfo(uri)!r}: {exc}. Check "
                                  "EMBEDSTREAM_MILVUS_URI.") from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class _QuietProbes(logging.Filter):
    """pymilvus logs every failed call at ERROR with a traceback, before the caller sees it. Asking
    whether an alias exists is a question here, not a failure (every first start asks): its "does not
    exist" answers are dropped; every other error still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("RPC error: [describe_alias]") and "not exist" in text.split("\n", 1)[0])


logging.getLogger("pymilvus.decorators").addFilter(_QuietProbes())


class MilvusConnection:
    """A client on ``collection`` (chunk rows) and its companion ``<collection>_deleted`` (the
    version of each document id's last delete)."""

    def __init__(self, uri: str, collection: str, token: str | None = None, timeout: float = 10.0, *,
                 client: Any = None) -> None:
        self.uri = uri
        self.collection = collection
        self.tombstones = f"{collection}_deleted"
        self.timeout = timeout
        self._client = client if client is not None else connect(uri, token, timeout)

    @classmethod
    def sharing(cls: type[C], other: MilvusConnection, collection: str | None = None) -> C:
        """This job on ``other``'s client (one connection for several jobs), on ``collection`` or
        ``other``'s. Closing either closes both."""
        return cls(other.uri, collection or other.collection, timeout=other.timeout, client=other._client)

    @property
    def where(self) -> str:
        """The server's URI as messages show it (without its user info)."""
        return without_userinfo(self.uri)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
