"""The Redis embedding cache: one round trip per group each way (MGET, and one script that SETs).

Key ``embedstream:v1:<model id>:<sha256 of the normalised text>``; value: a 6-byte header
(``b"ES"``, dtype code, pad, dim as uint16) and the float32 vector. A value whose header does not
match the model's dim is a miss. Redis is only ever a speed-up: every error or timeout (bounded by
``socket_timeout``) is a miss on read and a no-op on write, never an exception to the caller.
"""

from __future__ import annotations

import logging
import struct
import time

import numpy as np

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<2sBxH")
_MAGIC = b"ES"
_F32 = 1


#: Writes a group's vectors in one command: ``KEYS`` the cache keys, ``ARGV[1]`` the TTL in seconds,
#: then one value per key. A pipeline of one SET per key cost the worker ~10 µs of CPU per document
#: (a command object packed and a reply parsed for each; profiled on the instant-model run): one
#: command packs flat and answers once.
_SET_MANY = """
local ttl = ARGV[1]
for i, key in ipairs(KEYS) do
    redis.call('SET', key, ARGV[i + 1], 'EX', ttl)
end
return #KEYS
"""


def cache_key(model_id: str, text_hash: str) -> str:
    return f"embedstream:v1:{model_id}:{text_hash}"


def pack_vector(vec: np.ndarray) -> bytes:
    vec = np.ascontiguousarray(vec, dtype="<f4")
    return _HEADER.pack(_MAGIC, _F32, vec.shape[0]) + vec.tobytes()


def unpack_vector(raw: bytes | None, dim: int) -> np.ndarray | None:
    """The vector in ``raw``, or None when it is absent or not a float32 vector of ``dim``."""
    if raw is None or len(raw) != _HEADER.size + 4 * dim:
        return None
    magic, dtype, got_dim = _HEADER.unpack_from(raw)
    if magic != _MAGIC or dtype != _F32 or got_dim != dim:
        return None
    return np.frombuffer(raw, dtype="<f4", offset=_HEADER.size).copy()


class RedisCache:
    """``get_many`` / ``set_many`` over one Redis; failures are misses, logged at most every 10 s."""

    def __init__(self, url: str, model_id: str, dim: int, ttl_seconds: int, timeout_ms: int = 150,
                 client=None) -> None:
        """``client``: a ready Redis client to use instead of connecting to ``url`` (tests)."""
        if client is None:
            import redis

            client = redis.Redis.from_url(url, socket_timeout=timeout_ms / 1000,
                                          socket_connect_timeout=timeout_ms / 1000, retry=None,
                                          health_check_interval=0)
        self._redis = client
        self.model_id = model_id
        #: Every key of this model: ``cache_key(model_id, hash)`` is this + the hash.
        self._prefix = cache_key(model_id, "")
        self.dim = dim
        self.ttl = ttl_seconds
        self.errors = 0
        self._last_log = 0.0
        #: EVALSHA of ``_SET_MANY``, loading the script again when the server answers NOSCRIPT.
        self._set_many = self._redis.register_script(_SET_MANY)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._last_log > 10:
            self._last_log = now
            log.warning("cache %s failed (%s: %s); carrying on without the cache", what, type(exc).__name__, exc)

    def get_many(self, hashes: list[str]) -> list[np.ndarray | None]:
        """Vectors for ``hashes`` (None = miss), in order. Never raises."""
        if not hashes:
            return []
        try:
            raws = self._redis.mget([self._prefix + h for h in hashes])
        except Exception as exc:  # any Redis or socket error is a miss, by contract
            self._failed("read", exc)
            return [None] * len(hashes)
        return [unpack_vector(r if isinstance(r, bytes) else None, self.dim) for r in raws]

    def set_many(self, entries: dict[str, np.ndarray]) -> bool:
        """Write ``{hash: vector}`` with the TTL in one command. Returns False on failure; never raises."""
        if not entries:
            return True
        try:
            self._set_many(keys=[self._prefix + h for h in entries],
                           args=[self.ttl, *(pack_vector(vec) for vec in entries.values())])
            return True
        except Exception as exc:
            self._failed("write", exc)
            return False

    def close(self) -> None:
        try:
            self._redis.close()
        except Exception:
            pass
