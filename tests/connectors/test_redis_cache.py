"""RedisCache's contract: what is set is got back bit for bit, a vector of another dim is a miss, and
an unreachable Redis is only misses (counted), never an exception."""

from __future__ import annotations

import uuid

import numpy as np

from connectors.redis_cache import RedisCache


class DictRedis:
    """The Redis calls RedisCache makes (MGET, a pipeline of SET … EX), over a dict."""

    def __init__(self, down: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.down = down
        self._queued: list[tuple] = []

    def mget(self, keys):
        if self.down:
            raise ConnectionError("refused")
        return [self.data.get(k) for k in keys]

    def pipeline(self, transaction=False):
        return self

    def execute_command(self, *args):
        self._queued.append(args)

    def execute(self):
        queued, self._queued = self._queued, []
        if self.down:
            raise ConnectionError("refused")
        for cmd, key, value, ex, _ttl in queued:
            assert (cmd, ex) == ("SET", "EX")
            self.data[key] = value

    def close(self):
        pass


def _cache(kind, stack_env, model: str, dim: int = 4, down: bool = False) -> RedisCache:
    if kind == "fake":
        cache = RedisCache.__new__(RedisCache)
        cache._redis, cache.model_id, cache.dim, cache.ttl = DictRedis(down), model, dim, 60
        cache.errors, cache._last_log = 0, 0.0
        return cache
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
