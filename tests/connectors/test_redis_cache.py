"""RedisCache's contract: what is set is got back bit for bit, a vector of another dim is a miss, and
an unreachable Redis is only misses (counted), never an exception."""

from __future__ import annotations

import hashlib
import uuid

import hiredis
import numpy as np
import pytest
import redis

from connectors.redis_cache import RedisCache, bulk_strings, cache_key, pack_vector, packed_values


class DictRedis:
    """A Redis client whose server is a dict: its pool's connections read the commands RedisCache
    packs (MGET, EVALSHA of its SET-many script) as RESP, the way a server parses them."""

    def __init__(self, down: bool = False) -> None:
        self.data: dict[bytes, bytes] = {}
        self.ttls: dict[bytes, int] = {}
        self.scripts: set[bytes] = set()
        self.down = down
        self.connection_pool = self

    # -- the pool
    def get_connection(self):
        if self.down:
            raise redis.ConnectionError("refused")
        return _DictConnection(self)

    def release(self, conn) -> None:
        pass

    def script_load(self, source: str) -> bytes:
        assert "redis.call('SET', key, ARGV[i + 1], 'EX', ttl)" in source
        sha = hashlib.sha1(source.encode()).hexdigest().encode()
        self.scripts.add(sha)
        return sha

    def close(self):
        pass


class _DictConnection:
    def __init__(self, server: DictRedis) -> None:
        self.server = server
        self.reply: object = None

    def send_packed_command(self, parts: list[bytes], check_health: bool = True) -> None:
        reader = hiredis.Reader()
        reader.feed(b"".join(parts))
        command = reader.gets()
        assert reader.gets() is False, "one command at a time, nothing left over"
        name, *args = command
        data, ttls = self.server.data, self.server.ttls
        if name == b"MGET":
            self.reply = [data.get(k) for k in args]
        elif name == b"EVALSHA":
            sha, n, *rest = args
            if sha not in self.server.scripts:
                self.reply = redis.exceptions.NoScriptError("No matching script.")
                return
            n = int(n)
            keys, (ttl, *values) = rest[:n], rest[n:]
            assert len(values) == n
            for key, value in zip(keys, values):
                data[key], ttls[key] = value, int(ttl)
            self.reply = n
        else:
            raise AssertionError(f"unexpected command {name!r}")

    def read_response(self):
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    def disconnect(self) -> None:
        pass


def _cache(kind, stack_env, model: str, dim: int = 4, down: bool = False) -> RedisCache:
    if kind == "fake":
        return RedisCache("", model, dim, 60, client=DictRedis(down))
    url = "redis://127.0.0.1:1/0" if down else stack_env["EMBEDSTREAM_REDIS_URL"]
    return RedisCache(url, model, dim, 60, timeout_ms=200)


def test_set_then_get_round_trips_and_another_dim_misses(kind, stack_env):
    model = f"m-{uuid.uuid4().hex[:6]}"
    cache = _cache(kind, stack_env, model)
    vec = np.array([0.5, -0.25, 0.125, 1.0], np.float32)
    assert cache.get_many(["x", "y"]) == [None, None]
    assert cache.set_many({"x": vec})
    got = cache.get_many(["x", "y"])
    assert np.array_equal(got[0], vec) and got[1] is None
    if kind == "fake":
        other = RedisCache.__new__(RedisCache)
        other.__dict__.update(cache.__dict__, dim=8)
    else:
        other = RedisCache(stack_env["EMBEDSTREAM_REDIS_URL"], model, 8, 60)
    assert other.get_many(["x"]) == [None]
    assert cache.errors == 0


def test_an_unreachable_redis_is_misses_never_an_error(kind, stack_env):
    cache = _cache(kind, stack_env, "m", down=True)
    assert cache.get_many(["x"]) == [None]
    assert cache.set_many({"x": np.ones(4, np.float32)}) is False
    assert cache.errors == 2


@pytest.mark.integration
def test_set_many_writes_every_entry_with_the_ttl_and_survives_a_script_flush(stack):
    """Against a real Redis: one command writes every key with its TTL; a server that lost the script
    (restarted, SCRIPT FLUSH) is given it again, not counted as a failure."""
    import redis

    model = f"m-{uuid.uuid4().hex[:6]}"
    cache = RedisCache(stack["EMBEDSTREAM_REDIS_URL"], model, 4, 60, timeout_ms=500)
    vecs = {f"h{i}": np.full(4, i, np.float32) for i in range(300)}
    assert cache.set_many(vecs)
    raw = redis.Redis.from_url(stack["EMBEDSTREAM_REDIS_URL"])
    ttls = [raw.ttl(cache_key(model, h)) for h in vecs]
    assert all(0 < t <= 60 for t in ttls), sorted(set(ttls))
    assert [float(v[0]) for v in cache.get_many(list(vecs))] == [float(i) for i in range(300)]
    raw.script_flush()
    assert cache.set_many({"again": np.ones(4, np.float32)})
    assert cache.get_many(["again"])[0] is not None and cache.errors == 0


@pytest.mark.integration
@pytest.mark.parametrize("where", ["one server", "cluster"])
def test_delete_many_removes_exactly_the_named_entries_and_held_says_which_remain(where, stack, redis_cluster):
    """A deleted document's texts leave the cache (one DEL, or one per node on a cluster); the other
    model's entry under the same hash and the other texts stay; ``held`` reads what is left."""
    url = stack["EMBEDSTREAM_REDIS_URL"] if where == "one server" else redis_cluster.url
    model = f"m-{uuid.uuid4().hex[:6]}"
    cache, other = (RedisCache(url, m, 4, 60, timeout_ms=500) for m in (model, model + "-other"))
    vecs = {f"h{i}": np.full(4, i, np.float32) for i in range(40)}
    assert cache.set_many(vecs) and other.set_many({"h1": np.ones(4, np.float32)})
    gone = [f"h{i}" for i in range(0, 40, 2)]
    assert cache.held([*gone, "never"]) == gone
    assert cache.delete_many([*gone, gone[0], "never"])
    assert cache.held(list(vecs)) == [f"h{i}" for i in range(1, 40, 2)]
    assert other.held(["h1"]) == ["h1"] and cache.errors == 0
    assert cache.delete_many([])


def test_set_many_writes_the_packed_vector_of_each_key_with_the_ttl_loading_the_script_once():
    """The one buffer set_many lays out holds, for each key, exactly ``pack_vector`` of its vector
    (parsed as RESP, as a server reads it); a server without the script is given it, then written."""
    server = DictRedis()
    cache = RedisCache("", "model-é", 3, 77, client=server)
    rng = np.random.default_rng(1)
    vecs = {h: rng.standard_normal(3).astype(np.float32) for h in ("x", "a" * 64, "ß-not-hex", "")}
    assert not server.scripts
    assert cache.set_many(vecs) and cache.errors == 0
    assert len(server.scripts) == 1
    assert server.data == {cache_key("model-é", h).encode(): pack_vector(v) for h, v in vecs.items()}
    assert set(server.ttls.values()) == {77}
    got = cache.get_many([*vecs, "missing"])
    assert all(np.array_equal(g, v) for g, v in zip(got, vecs.values())) and got[-1] is None


def test_packed_values_are_the_bulk_strings_of_each_packed_vector():
    rng = np.random.default_rng(2)
    for n, dim in ((1, 1), (3, 384), (257, 8)):
        vectors = list(rng.standard_normal((n, dim)).astype(np.float32))
        assert packed_values(vectors, dim) == bulk_strings(pack_vector(v) for v in vectors)


@pytest.mark.integration
@pytest.mark.alone  # it freezes a Redis and times its timeout
def test_a_reply_that_came_too_late_never_answers_the_next_command(tmp_path):
    """A read that timed out (Redis frozen) closes its connection: once Redis answers again, the next
    read gets its own reply, never the late one (which would hand one text's vector to another)."""
    import os
    import signal
    import subprocess
    import time

    from tools.dev import free_port, redis_server_bin

    port = free_port()
    proc = subprocess.Popen([redis_server_bin(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_timeout=0.5).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        cache = RedisCache(url, "m", 4, 60, timeout_ms=200)
        a = np.array([1, 2, 3, 4], np.float32)
        assert cache.set_many({"a": a})
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            assert cache.get_many(["a"]) == [None] and cache.errors == 1
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.2)  # the late reply to the timed-out MGET reaches its socket meanwhile
        got = cache.get_many(["b", "a"])
        assert got[0] is None and np.array_equal(got[1], a) and cache.errors == 1
    finally:
        proc.kill()
        proc.wait()


def test_a_learned_sparse_side_is_cached_with_its_vector_and_never_read_as_a_dense_value():
    from connectors.redis_cache import WITH_SPARSE, pack_with_sparse, unpack_vector, unpack_with_sparse

    vec = np.arange(4, dtype=np.float32)
    value = (vec, (np.array([3, 70_000], np.int32), np.array([0.5, 1.5], np.float32)))
    server = DictRedis()
    cache = RedisCache("redis://unused", "m+sparse-x", 4, 60, client=server, values=WITH_SPARSE)
    assert cache.set_many({"h": value, "e": (vec, (np.array([], np.int32), np.array([], np.float32)))})
    [(got_vec, (idx, val)), (_, (empty, _))] = cache.get_many(["h", "e"])
    assert np.array_equal(got_vec, vec) and idx.tolist() == [3, 70_000] and val.tolist() == [0.5, 1.5]
    assert len(empty) == 0
    raw = pack_with_sparse(value)
    assert unpack_vector(raw, 4) is None and unpack_with_sparse(pack_vector(vec), 4) is None  # kinds apart
    assert unpack_with_sparse(raw, 5) is None and unpack_with_sparse(raw[:-3], 4) is None


# -- Redis Cluster ---------------------------------------------------------------------------------
@pytest.mark.integration
def test_on_a_cluster_every_key_goes_to_its_node_and_comes_back(redis_cluster):
    """Three masters: the cache finds out it is on a cluster by itself (no setting), writes each key
    on the master of its slot with the TTL, and reads every one back: no CROSSSLOT, no miss."""
    import redis

    model = f"m-{uuid.uuid4().hex[:6]}"
    before = redis_cluster.keys_by_node()
    cache = RedisCache(redis_cluster.url, model, 4, 60, timeout_ms=500)
    assert cache.cluster is not None and len(cache.cluster.masters) == 3
    vecs = {f"h{i}": np.full(4, i, np.float32) for i in range(600)}
    assert cache.set_many(vecs)
    got = cache.get_many([*vecs, "absent"])
    assert [float(v[0]) for v in got[:-1]] == [float(i) for i in range(600)] and got[-1] is None
    assert cache.errors == 0
    added = {p: n - before[p] for p, n in redis_cluster.keys_by_node().items()}
    assert sum(added.values()) == 600 and min(added.values()) > 100  # spread over the three masters
    key = cache_key(model, "h7").encode()
    node = redis.Redis(host="127.0.0.1", port=[p for p in redis_cluster.ports
                                               if redis.Redis(port=p).cluster("keyslot", key) in
                                               _slots_of(redis_cluster, p)][0])
    assert 0 < node.ttl(key) <= 60


def _slots_of(cluster, port: int) -> set[int]:
    import redis

    out: set[int] = set()
    for start, end, master, *_ in redis.Redis(port=port).execute_command("CLUSTER SLOTS"):
        if int(master[1]) == port:
            out.update(range(int(start), int(end) + 1))
    return out


@pytest.mark.integration
def test_a_cluster_taken_for_one_server_switches_on_its_first_crossslot_answer(redis_cluster):
    """A cache that could not ask at start-up (INFO refused, the server not yet a cluster) sends the
    one-server commands; the first CROSSSLOT answer is a miss, and from then on it goes per node."""
    cache = RedisCache(redis_cluster.url, f"m-{uuid.uuid4().hex[:6]}", 4, 60, timeout_ms=500)
    cache.cluster = None
    vecs = {f"h{i}": np.full(4, i, np.float32) for i in range(50)}
    assert cache.set_many(vecs) is False and cache.cluster is not None and cache.errors == 1
    assert cache.set_many(vecs) and all(v is not None for v in cache.get_many(list(vecs)))


@pytest.mark.integration
@pytest.mark.alone  # it freezes a Redis and times its timeout
def test_a_frozen_cluster_node_costs_only_its_own_keys(redis_cluster):
    """One master stopped (SIGSTOP): its keys are misses within the timeout, counted once a call;
    the other masters' keys are still hits; nothing raises. Woken, every key is a hit again."""
    import os
    import signal

    cache = RedisCache(redis_cluster.url, f"m-{uuid.uuid4().hex[:6]}", 4, 60, timeout_ms=300)
    vecs = {f"h{i}": np.full(4, i, np.float32) for i in range(300)}
    assert cache.set_many(vecs)
    frozen = redis_cluster.procs[1]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        got = cache.get_many(list(vecs))
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    hits = sum(v is not None for v in got)
    assert 100 < hits < 300 and cache.errors == 1  # two masters of three answered
    assert all(v is not None for v in cache.get_many(list(vecs)))
