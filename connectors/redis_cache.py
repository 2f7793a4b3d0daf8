"""The Redis embedding cache: one round trip per group each way (MGET, and one script that SETs).

Key ``embedstream:v1:<model id>:<sha256 of the normalised text>``; value: a 6-byte header
(``b"ES"``, dtype code, pad, dim as uint16) and the float32 vector. A value whose header does not
match the model's dim is a miss. A model with a learned sparse side (:data:`WITH_SPARSE`; its model
id then names the sparse model too) caches both vectors in one value: dtype code 2, the dense vector,
then the sparse vector's dimensions (uint32) and weights (float32). Redis is only ever a speed-up:
every error or timeout (bounded by ``socket_timeout``) is a miss on read and a no-op on write, never
an exception to the caller.

Both commands are packed here and sent on a connection of the client's pool, not through
``execute_command``: every value of a group has the same length, so the values of a write are laid
out by numpy in one buffer (redis-py packed each one and ran its per-command hooks: 4.4 µs of the
sink's CPU a document on the instant-model run, py-spy's GIL samples).

A Redis Cluster (ElastiCache, Memorystore, Azure in cluster mode) refuses those two multi-key
commands across slots: the cache asks the server ``INFO cluster`` when it starts (again on a
CROSSSLOT or MOVED answer) and, on a cluster, sends single-key commands per node instead
(``connectors.redis_cluster``). No setting is needed.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from connectors.redis_cluster import ClusterRoute

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<2sBxH")
_MAGIC = b"ES"
_F32 = 1
_F32_SPARSE = 2
#: A cached value of a model with a learned sparse side: ``(dense vector, (indices, values))``.
DenseAndSparse = tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]


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


def bulk_strings(values: Iterable[bytes]) -> bytes:
    """``values`` as consecutive RESP bulk strings (the arguments of a command, after its ``*<n>``)."""
    return b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in values)


def cache_key(model_id: str, text_hash: str) -> str:
    return f"embedstream:v1:{model_id}:{text_hash}"


def pack_vector(vec: np.ndarray) -> bytes:
    vec = np.ascontiguousarray(vec, dtype="<f4")
    return _HEADER.pack(_MAGIC, _F32, vec.shape[0]) + vec.tobytes()


def packed_values(vectors: list[np.ndarray], dim: int) -> bytes:
    """``pack_vector`` of each of ``vectors`` (each of ``dim`` floats) as consecutive RESP bulk
    strings, laid out in one numpy buffer."""
    head = b"$%d\r\n" % (_HEADER.size + 4 * dim) + _HEADER.pack(_MAGIC, _F32, dim)
    rows = np.empty((len(vectors), len(head) + 4 * dim + 2), np.uint8)
    rows[:, :len(head)] = np.frombuffer(head, np.uint8)
    rows[:, len(head):-2] = np.array(vectors, dtype="<f4").view(np.uint8)  # np.stack reshapes each: 2.5× the cost
    rows[:, -2:] = np.frombuffer(b"\r\n", np.uint8)
    return rows.tobytes()


def unpack_vector(raw: bytes | None, dim: int) -> np.ndarray | None:
    """The vector in ``raw``, or None when it is absent or not a float32 vector of ``dim``."""
    if raw is None or len(raw) != _HEADER.size + 4 * dim:
        return None
    magic, dtype, got_dim = _HEADER.unpack_from(raw)
    if magic != _MAGIC or dtype != _F32 or got_dim != dim:
        return None
    return np.frombuffer(raw, dtype="<f4", offset=_HEADER.size).copy()


def pack_with_sparse(value: DenseAndSparse) -> bytes:
    """A dense vector and its sparse one as one cache value (the module doc)."""
    vec, (idx, val) = value
    return b"".join((_HEADER.pack(_MAGIC, _F32_SPARSE, vec.shape[0]), np.ascontiguousarray(vec, "<f4").tobytes(),
                     np.ascontiguousarray(idx, "<u4").tobytes(), np.ascontiguousarray(val, "<f4").tobytes()))


def unpack_with_sparse(raw: bytes | None, dim: int) -> DenseAndSparse | None:
    """What :func:`pack_with_sparse` packed, or None when ``raw`` is absent or not such a value of ``dim``."""
    dense_end = _HEADER.size + 4 * dim
    if raw is None or len(raw) < dense_end or (len(raw) - dense_end) % 8:
        return None
    magic, dtype, got_dim = _HEADER.unpack_from(raw)
    if magic != _MAGIC or dtype != _F32_SPARSE or got_dim != dim:
        return None
    n = (len(raw) - dense_end) // 8
    vec = np.frombuffer(raw, "<f4", dim, _HEADER.size).copy()
    idx = np.frombuffer(raw, "<u4", n, dense_end).astype(np.int32)
    return vec, (idx, np.frombuffer(raw, "<f4", n, dense_end + 4 * n).copy())


@dataclass(frozen=True)
class ValueFormat:
    """What a cache's values are, and how they are packed: ``pack(value)``, ``unpack(raw, dim)`` (None
    for a value not of this format and ``dim``), and ``pack_all(values, dim)`` (consecutive RESP bulk
    strings)."""

    pack: Callable[[Any], bytes]
    unpack: Callable[[bytes | None, int], Any]
    pack_all: Callable[[list, int], bytes]


#: Values are dense vectors (float32 arrays of ``dim``).
VECTORS = ValueFormat(pack_vector, unpack_vector, packed_values)
#: Values are :data:`DenseAndSparse` (a model with a learned sparse side).
WITH_SPARSE = ValueFormat(pack_with_sparse, unpack_with_sparse,
                          lambda values, dim: bulk_strings(pack_with_sparse(v) for v in values))


class RedisCache:
    """``get_many`` / ``set_many`` over one Redis; failures are misses, logged at most every 10 s."""

    def __init__(self, url: str, model_id: str, dim: int, ttl_seconds: int, timeout_ms: int = 150,
                 client=None, values: ValueFormat = VECTORS) -> None:
        """``client``: a ready Redis client to use instead of connecting to ``url`` (tests); what is
        used of it: ``connection_pool`` (``get_connection``, ``release``) and ``script_load``.
        ``values``: what the cached values are (:data:`VECTORS`, or :data:`WITH_SPARSE`)."""
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
        self.values = values
        self.ttl = ttl_seconds
        self.errors = 0
        self._last_log = 0.0
        #: ``_SET_MANY`` runs by its digest (EVALSHA); loaded again when the server answers NOSCRIPT.
        self._script_sha = hashlib.sha1(_SET_MANY.encode()).hexdigest().encode()
        #: On a Redis Cluster, how commands reach the nodes; None: one server (or not known yet).
        self.cluster: ClusterRoute | None = None
        #: When the server was last asked whether it is a cluster (None: it answered).
        self._asked: float | None = 0.0
        self._detect()

    def _detect(self) -> None:
        """Ask the server whether it is a cluster node (``INFO cluster``), at most every 10 s until it
        answers. A server that cannot say (INFO refused by an ACL, a stand-in client) is one server."""
        import redis

        self._asked = time.monotonic()
        try:
            info = self._redis.info("cluster")
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._failed("start", exc)  # asked again before a command, 10 s on
            return
        except Exception:
            info = {}
        self._asked = None
        if isinstance(info, dict) and int(info.get("cluster_enabled", 0) or 0):
            self._become_cluster()

    def _become_cluster(self) -> None:
        route = ClusterRoute(self._redis)
        route.refresh()
        self.cluster = route
        log.info("cache: a Redis Cluster of %d masters (%s): each node's keys in one pipeline", len(route.masters),
                 ", ".join(f"{h}:{p}" for h, p in route.masters))

    def _ready(self) -> None:
        """Before a command: ask again whether the server is a cluster if it has not answered yet."""
        if self._asked is not None and time.monotonic() - self._asked > 10:
            self._detect()

    def _failed(self, what: str, exc: BaseException) -> None:
        """Count a failed call (not the question whether the server is a cluster) and log it, at
        most every 10 s."""
        if what != "start":
            self.errors += 1
        now = time.monotonic()
        if now - self._last_log > 10:
            self._last_log = now
            log.warning("cache %s failed (%s: %s); carrying on without the cache", what, type(exc).__name__, exc)

    def _call(self, *command: bytes):
        """Send one command, packed in the parts ``command``, on a connection of the pool and read its
        reply. A connection that failed midway is closed (a reply left unread would answer the next
        command)."""
        import redis

        pool = self._redis.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(command, check_health=False)  # sends each part
            return conn.read_response()
        except redis.ResponseError:
            raise  # the server answered in full: the connection is fine
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _keys(self, hashes: Iterable[str]) -> bytes:
        return bulk_strings((self._prefix + h).encode() for h in hashes)

    def get_many(self, hashes: list[str]) -> list:
        """Values for ``hashes`` (None = miss; of :attr:`values`' format), in order. Never raises."""
        if not hashes:
            return []
        try:
            self._ready()
            if self.cluster is not None:
                raws = self._cluster_get(hashes)
            else:
                raws = self._call(b"*%d\r\n$4\r\nMGET\r\n" % (len(hashes) + 1), self._keys(hashes))
        except Exception as exc:  # any Redis or socket error is a miss, by contract
            self._crossed(exc)
            self._failed("read", exc)
            return [None] * len(hashes)
        unpack = self.values.unpack
        return [unpack(r if isinstance(r, bytes) else None, self.dim) for r in raws]

    def set_many(self, entries: dict) -> bool:
        """Write ``{hash: vector}`` with the TTL in one command. Returns False on failure; never raises."""
        if not entries:
            return True
        import redis

        try:
            self._ready()
            if self.cluster is not None:
                return self._cluster_set(entries)
            n = len(entries)
            command = (b"*%d\r\n" % (2 * n + 4) + bulk_strings((b"EVALSHA", self._script_sha, b"%d" % n)),
                       self._keys(entries) + bulk_strings((b"%d" % self.ttl,)),
                       self.values.pack_all(list(entries.values()), self.dim))
            try:
                self._call(*command)
            except redis.exceptions.NoScriptError:  # a restarted or flushed server: load it, once
                self._redis.script_load(_SET_MANY)
                self._call(*command)
            return True
        except Exception as exc:
            self._crossed(exc)
            self._failed("write", exc)
            return False

    def delete_many(self, hashes: Iterable[str]) -> bool:
        """Remove the entries of ``hashes`` (a deleted document's texts: ``worker.steps.writing.targets``).
        Returns False on failure (the entries then expire with their TTL); never raises."""
        keys = [(self._prefix + h).encode() for h in dict.fromkeys(hashes)]
        if not keys:
            return True
        try:
            self._ready()
            if self.cluster is not None:
                failed = next((r for r in self.cluster.run(keys, [b"*2\r\n$3\r\nDEL\r\n" + bulk_strings((k,))
                                                                  for k in keys])
                               if isinstance(r, BaseException)), None)
                if failed is not None:
                    raise failed
            else:
                self._call(b"*%d\r\n$3\r\nDEL\r\n" % (len(keys) + 1), bulk_strings(keys))
            return True
        except Exception as exc:
            self._crossed(exc)
            self._failed("delete", exc)
            return False

    def held(self, hashes: Iterable[str]) -> list[str]:
        """Which of ``hashes`` have an entry now (``EXISTS``, one key a call: a cluster's keys are in
        many slots); raises on failure (an erasure's receipt must not take an outage for "gone")."""
        self._ready()
        out = []
        for h in dict.fromkeys(hashes):
            key = (self._prefix + h).encode()
            command = b"*2\r\n$6\r\nEXISTS\r\n" + bulk_strings((key,))
            reply = self.cluster.run([key], [command])[0] if self.cluster is not None else self._call(command)
            if isinstance(reply, BaseException):
                raise reply
            if int(reply):
                out.append(h)
        return out

    def _crossed(self, exc: Exception) -> None:
        """A server that refuses keys of several slots is a cluster after all (INFO was not answered,
        or the server became one): commands go per node from the next group on."""
        import redis

        if self.cluster is None and isinstance(exc, (redis.exceptions.ClusterCrossSlotError,
                                                     redis.exceptions.MovedError)):
            try:
                self._become_cluster()
            except Exception as refused:
                self._failed("start", refused)

    def _cluster_get(self, hashes: list[str]) -> list:
        keys = [(self._prefix + h).encode() for h in hashes]
        replies = self.cluster.run(keys, [b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(k), k)  # type: ignore[union-attr]
                                          for k in keys])
        failed = next((r for r in replies if isinstance(r, BaseException)), None)
        if failed is not None:
            self._failed("read", failed)  # the other nodes' keys are still hits
        return [None if isinstance(r, BaseException) else r for r in replies]

    def _cluster_set(self, entries: dict) -> bool:
        keys = [(self._prefix + h).encode() for h in entries]
        pack = self.values.pack
        ttl = bulk_strings((b"EX", b"%d" % self.ttl))
        commands = [b"*5\r\n$3\r\nSET\r\n" + bulk_strings((k, pack(v))) + ttl for k, v in zip(keys, entries.values())]
        failed = next((r for r in self.cluster.run(keys, commands) if isinstance(r, BaseException)), None)  # type: ignore[union-attr]
        if failed is not None:
            self._failed("write", failed)
            return False
        return True

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        try:
            self._redis.close()
        except Exception:
            pass
