"""The cache's commands on a Redis Cluster: each node's share of a group in one pipeline, every node's
sent before any reply is read.

A cluster takes a multi-key command only when all its keys hash to one slot (CROSSSLOT otherwise),
and a group's keys fall in about as many slots as it has texts: the single server's one MGET and one
SET-many script cannot be sent. So each node gets a pipeline of single-key commands (GET, SET … EX)
for the keys of the slots it serves, all nodes' pipelines are written first and then read: the
group still costs one round trip, spread over the nodes, and the keys keep the contract's names
(hash tags would put a model's every key in one slot, on one node).

Which node serves a slot comes from ``CLUSTER SLOTS``. A ``MOVED`` or ``ASK`` reply (a resharding,
a failover) makes that key a miss and the map is read again before the next group. A node that is
down or slow costs the misses of its own keys only, bounded by the client's socket timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


class ClusterRoute:
    """Sends single-key commands to the nodes that serve their keys' slots.

    ``seed``: a redis-py client of any node (its connection settings are every node's: password,
    TLS, timeouts). ``client_for(host, port)``: a client of another node (default: the seed's
    settings with that address)."""

    def __init__(self, seed, client_for: Callable[[str, int], Any] | None = None) -> None:
        self._seed = seed
        self._client_for = client_for or self._like_seed
        self._clients: dict[tuple[str, int], Any] = {}
        #: Per slot, the address of the master that serves it (None: no node does).
        self._slots: list[tuple[str, int] | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self.stale = True

    def _like_seed(self, host: str, port: int):
        import redis

        kwargs = {k: v for k, v in self._seed.connection_pool.connection_kwargs.items() if k not in ("host", "port")}
        return redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=self._seed.connection_pool.connection_class, host=host, port=port, **kwargs))

    @property
    def masters(self) -> list[tuple[str, int]]:
        """The masters that serve slots, by address."""
        return sorted({a for a in self._slots if a is not None})

    def refresh(self) -> None:
        """Read which master serves each slot (``CLUSTER SLOTS``, from the seed, else any known node)."""
        last: Exception | None = None
        for client in (self._seed, *self._clients.values()):
            try:
                rows = client.execute_command("CLUSTER SLOTS")
                break
            except Exception as exc:
                last = exc
        else:
            raise last  # type: ignore[misc]
        slots: list[tuple[str, int] | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for start, end, master, *_ in rows:
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            address = (host or self._seed.connection_pool.connection_kwargs.get("host", "127.0.0.1"), int(master[1]))
            slots[int(start):int(end) + 1] = [address] * (int(end) - int(start) + 1)
        self._slots = slots
        for address in self.masters:
            if address not in self._clients:
                self._clients[address] = self._client_for(*address)
        self.stale = False

    def run(self, keys: Sequence[bytes], commands: Sequence[bytes]) -> list:
        """Send ``commands[i]`` (one packed command about ``keys[i]``) to the node of its key; each
        node's commands go as one pipeline, every pipeline before any reply is read. Returns, per
        key, its reply or the exception that stands for it (the node's error, or a redirection)."""
        if self.stale:
            self.refresh()
        by_node: dict[tuple[str, int] | None, list[int]] = {}
        for i, key in enumerate(keys):
            by_node.setdefault(self._slots[key_slot(key)], []).append(i)
        replies: list = [None] * len(keys)
        sent = []
        for address, idx in by_node.items():
            if address is None:  # a slot no master serves (a cluster being reconfigured)
                self.stale = True
                for i in idx:
                    replies[i] = LookupError("no node serves this key's slot")
                continue
            pool = self._clients[address].connection_pool
            conn = pool.get_connection()
            try:
                conn.send_packed_command([b"".join(commands[i] for i in idx)], check_health=False)
                sent.append((pool, conn, idx))
            except BaseException as exc:
                conn.disconnect()
                pool.release(conn)
                for i in idx:
                    replies[i] = exc
        for pool, conn, idx in sent:
            self._read(pool, conn, idx, replies)
        return replies

    def _read(self, pool, conn, idx: list[int], replies: list) -> None:
        """The replies of one node's pipeline, in order, into ``replies``. An error reply stands for
        its own key; a failed connection for the rest of the pipeline (and is closed: a reply left
        unread would answer the next command)."""
        import redis

        done = 0
        try:
            for i in idx:
                try:
                    replies[i] = conn.read_response()
                except redis.ResponseError as exc:
                    replies[i] = exc
                    if isinstance(exc, (redis.exceptions.MovedError, redis.exceptions.AskError)):
                        self.stale = True
                done += 1
        except BaseException as exc:
            conn.disconnect()
            for i in idx[done:]:
                replies[i] = exc
        finally:
            pool.release(conn)

    def close(self) -> None:
        for client in self._clients.values():
            try:
                client.close()
            except Exception:
                pass
