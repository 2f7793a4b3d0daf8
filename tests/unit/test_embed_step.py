"""Embed step: one model call per group, repeats embedded once, fresh vectors handed to every batch."""

from __future__ import annotations

import numpy as np

from worker.embedding.fake import FakeEmbedder
from worker.records import Batch, Item, Source
from worker.steps.embed import EmbedStep


class DictCache:
    """The two calls of RedisCache the embed step makes, over a dict."""

    errors = 0

    def __init__(self, stored: dict[str, np.ndarray]) -> None:
        self.stored = stored

    def get_many(self, hashes):
        return [self.stored.get(h) for h in hashes]


def _batch(offset: int, *texts: str) -> Batch:
    b = Batch()
    for i, t in enumerate(texts):
        b.add(Item(Source("docs", 0, offset + i), f"id{offset + i}", t, f"h-{t}", 3, {}))
    return b


def test_a_group_is_one_model_call_over_its_distinct_misses():
    model = FakeEmbedder()
    cached_vec = model.embed(["in redis"])[0]
    model.calls = model.texts_embedded = 0
    step = EmbedStep(model, DictCache({"h-in redis": cached_vec}))
    first, second = _batch(0, "alpha", "beta", "in redis"), _batch(3, "beta", "gamma", "alpha")
    step.process([first, second])
    assert model.calls == 1 and model.texts_embedded == 3  # alpha, beta, gamma once each
    every = first.items + second.items
    assert [it.cached for it in every] == [False, False, True, False, False, False]
    assert np.allclose(every[2].vector, cached_vec)
    assert np.allclose(every[0].vector, every[5].vector)  # same text, same vector
    assert set(first.fresh) == {"h-alpha", "h-beta"} and set(second.fresh) == {"h-beta", "h-gamma", "h-alpha"}
    # a later group finds the same texts in the memo without the model
    third = _batch(6, "gamma")
    step.process([third])
    assert model.calls == 1 and third.items[0].cached and third.fresh == {}
