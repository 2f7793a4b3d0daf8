"""RedisCache's contract: what is set is got back bit for bit, a vector of another dim is a miss, and
an unreachable Redis is only misses (counted), never an exception."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from connectors.redis_cache import RedisCache, cache_key


class DictRedis:
    """The Redis calls RedisCache makes (MGET, its SET-many script), over a dict."""

    def __init__(self, down: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.ttls: dict[str, int] = {}
        self.down = down

    def mget(self, keys):
        if self.down:
            raise ConnectionError("refused")
        return [self.data.get(k) for k in keys]

    def register_script(self, source: str):
        assert "redis.call('SET', key, ARGV[i + 1], 'EX', ttl)" in source

        def run(keys, args):
            if self.down:
                raise ConnectionError("refused")
            ttl, *values = args
            assert len(values) == len(keys)
            for key, value in zip(keys, values):
                self.data[key], self.ttls[key] = value, ttl
            return len(keys)

        return run

    def close(self):
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
