"""Embed step: one model call per group, repeats embedded once, fresh vectors handed to every batch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from schemas.errors import TransientError
from tools.fake_embedder import FakeEmbedder
from worker.assembly.chain import by_model, chunk_then_prepare
from worker.core.records import Batch, Item, Source
from worker.steps.model.chunk import Chunker
from worker.steps.model.embed import EmbedStep

from .fakes import share_of


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


def _step(model, cache, max_tokens: int = 254):
    """The prepare and embed stages' work: the chunk step and the lookup, then the model."""
    return _stage(Chunker(model, "tokens", max_tokens, 2, 512), EmbedStep(model, cache))


def _stage(chunker: Chunker, step: EmbedStep):
    """The prepare and embed stages' steps as ``worker.assembly.chain`` builds them (one model), run
    on the calling thread: ``process(group)`` returns each batch's fresh vectors, by model name."""
    prepare = by_model({"": chunk_then_prepare(chunker, step)}, lambda _name: True)
    embed = by_model({"": step.embed}, lambda _name: True)
    def process(group):
        return embed(group, prepare(group, [None] * len(group)))
    return type("Stages", (), {"process": staticmethod(process)})


def test_a_group_is_one_model_call_over_its_distinct_misses():
    model = FakeEmbedder()
    cached_vec = model.embed(["in redis"])[0]
    model.calls = model.texts_embedded = 0
    step = _step(model, DictCache({"h-in redis": cached_vec}))
    first, second = _batch(0, "alpha", "beta", "in redis"), _batch(3, "beta", "gamma", "alpha")
    fresh = step.process([first, second])
    assert model.calls == 1 and model.texts_embedded == 3  # alpha, beta, gamma once each
    every = [it.chunks[0] for it in first.items + second.items]
    assert [ch.cached for ch in every] == [False, False, True, False, False, False]
    assert np.allclose(every[2].vector, cached_vec)
    assert np.allclose(every[0].vector, every[5].vector)  # same text, same vector
    assert set(fresh[0][""]) == {"h-alpha", "h-beta"} and set(fresh[1][""]) == {"h-beta", "h-gamma", "h-alpha"}
    # a later group finds the same texts in the memo without the model: nothing fresh to hand on
    third = _batch(6, "gamma")
    assert step.process([third]) == [{}]
    assert model.calls == 1 and third.items[0].chunks[0].cached


def test_a_long_document_edited_in_one_place_re_embeds_only_the_chunk_that_changed():
    """Chunks are cached by their own text: the other chunks of an edited document are hits."""
    model = FakeEmbedder()
    cache = DictCache({})
    step = _step(model, cache, max_tokens=8)
    words = [f"w{i}" for i in range(40)]
    first = _batch(0, " ".join(words))
    [fresh] = step.process([first])
    [doc] = first.items
    assert len(doc.chunks) > 3 and all(not ch.cached for ch in doc.chunks)
    assert all(doc.text[ch.start:ch.end] == ch.text for ch in doc.chunks)
    cache.stored.update(fresh[""])  # the sink fills Redis with the fresh vectors
    words[-1] = "edited"
    model.calls = model.texts_embedded = 0
    second = _batch(1, " ".join(words))
    step.process([second])
    [doc2] = second.items
    assert model.texts_embedded == 1 and [ch.cached for ch in doc2.chunks] == [True] * (len(doc2.chunks) - 1) + [False]


def test_the_cache_is_skipped_while_its_lookups_cost_more_than_the_hits_save():
    from worker.steps.model.embed import PROBE_EVERY, LookupPolicy

    gpu = LookupPolicy()  # a lookup costs 50 µs a text, the model 100 µs: half the time, for no hit
    assert gpu.lookup()
    gpu.looked_up(100, 0, 0.005)
    gpu.embedded(100, 0.010)
    asked = [gpu.lookup() for _ in range(4 * PROBE_EVERY)]
    assert asked.count(True) == 4 and asked[PROBE_EVERY - 1]  # one probe in PROBE_EVERY groups
    for _ in range(5):  # the probes find repeats (90 %, break-even is 50 %): the hits pay again
        gpu.looked_up(100, 90, 0.005)
    assert all(gpu.lookup() for _ in range(PROBE_EVERY))


def test_a_cheap_lookup_is_always_made_whatever_the_hit_ratio():
    from worker.steps.model.embed import LookupPolicy

    cpu = LookupPolicy()  # 10 µs a text against 1.5 ms of model: asked even at no hit
    cpu.looked_up(100, 0, 0.001)
    cpu.embedded(100, 0.150)
    assert all(cpu.lookup() for _ in range(100))


def test_a_skipped_lookup_still_embeds_everything_and_the_vectors_go_back_to_the_cache():
    model = FakeEmbedder()
    cache = DictCache({})
    step = EmbedStep(model, cache)
    step.policy.lookup_s, step.policy.model_s, step.policy.hit_ratio = 1.0, 0.001, 0.0  # never pays
    stage = _stage(Chunker(model, "tokens", 254, 2, 512), step)
    calls = []
    cache.get_many = lambda hashes: calls.append(hashes) or [None] * len(hashes)  # type: ignore[method-assign]
    batch = _batch(0, "alpha", "beta")
    [fresh] = stage.process([batch])
    assert calls == [] and sorted(fresh[""]) == ["h-alpha", "h-beta"]
    assert all(ch.vector is not None and not ch.cached for it in batch.items for ch in it.chunks)


def test_a_failed_lookup_is_an_outage_not_a_cost_so_redis_is_asked_again_once_back():
    model = FakeEmbedder()

    class FrozenThenBack(DictCache):
        frozen = True

        def get_many(self, hashes):
            if self.frozen:
                time.sleep(0.05)  # the client's timeout
                self.errors += 1
                return [None] * len(hashes)
            return super().get_many(hashes)

    cache = FrozenThenBack({})
    step = EmbedStep(model, cache)
    stage = _stage(Chunker(model, "tokens", 254, 2, 512), step)
    stage.process([_batch(0, "alpha", "beta")])  # healthy: the costs are measured
    healthy = step.policy.lookup_s
    for i in range(5):
        stage.process([_batch(10 + 2 * i, f"frozen {i}", f"still frozen {i}")])
    assert step.policy.lookup_s == healthy  # the timeouts were not taken for the lookup's cost
    cache.frozen = False
    cache.stored["h-back"] = np.ones(model.dim, np.float32)
    batch = _batch(30, "back")
    stage.process([batch])
    assert batch.items[0].chunks[0].cached


def test_a_learned_sparse_side_rides_with_each_vector_through_the_model_the_memo_and_the_cache():
    """With a learned sparse model a text's value is (vector, sparse vector), from one model call: a
    cache hit hands both back, the memo keeps both, and both go back to the cache."""
    model = FakeEmbedder(sparse="fake-sparse")
    vec, sparse = model.embed_sparse(["in redis"])
    step = EmbedStep(model, DictCache({"h-in redis": (vec[0], sparse[0])}), memo_size=10)
    work = _stage(Chunker(model, "tokens", 254, 2, 512), step)
    first = _batch(0, "alpha", "in redis", "alpha")
    [made] = work.process([first])
    chunks = [it.chunks[0] for it in first.items]
    want_vec, want_sparse = model.embed_sparse(["alpha", "in redis"])
    assert [ch.cached for ch in chunks] == [False, True, False]
    for ch, i in zip(chunks, (0, 1, 0)):
        assert np.allclose(ch.vector, want_vec[i]) and ch.sparse is not None
        assert np.array_equal(ch.sparse[0], want_sparse[i][0]) and np.allclose(ch.sparse[1], want_sparse[i][1])
    fresh = made[""]["h-alpha"]
    assert np.allclose(fresh[0], want_vec[0]) and np.array_equal(fresh[1][0], want_sparse[0][0])
    again = _batch(3, "alpha")
    calls = model.calls
    work.process([again])
    assert model.calls == calls and np.array_equal(again.items[0].chunks[0].sparse[0], want_sparse[0][0])  # the memo


def _chunked(model, *batches: Batch) -> tuple[Batch, ...]:
    """The batches after the chunk step (each short text one chunk)."""
    Chunker(model, "tokens", 254, 2, 512).process(share_of(list(batches)))
    return batches


class Recording(FakeEmbedder):
    """Which thread prepared texts and which one ran the model on them."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, set[str]] = {"prepare": set(), "model": set()}

    def prepare(self, texts):
        self.threads["prepare"].add(threading.current_thread().name)
        return [f"<{t}>" for t in texts]  # what the model takes: not the text itself

    def embed_prepared(self, prepared):
        self.threads["model"].add(threading.current_thread().name)
        assert all(p.startswith("<") for p in prepared)
        return self.embed([p[1:-1] for p in prepared]), None


def test_the_halves_run_on_two_threads_and_the_embed_stage_may_group_batches_otherwise():
    """The prepare stage takes [first, second] as one group, the embed stage takes them one by one:
    what each batch is handed on with holds what its own chunks need, so both get every vector."""
    model = Recording()
    step = EmbedStep(model, None)
    first, second = _chunked(model, _batch(0, "alpha", "beta"), _batch(2, "beta", "gamma"))
    pending: list = []
    prepare = threading.Thread(target=lambda: pending.extend(step.prepare(share_of([first, second]))),
                               name="prepare")
    prepare.start()
    prepare.join()
    assert set(pending[0]) == {"h-alpha", "h-beta"} and set(pending[1]) == {"h-beta", "h-gamma"}
    fresh: list = []
    for batch, need in zip((first, second), pending):
        embed = threading.Thread(target=lambda b=batch, n=need: fresh.extend(step.embed(share_of([b]), [n])),
                                 name="embed")
        embed.start()
        embed.join()
    assert model.threads == {"prepare": {"prepare"}, "model": {"embed"}}
    for batch in (first, second):
        for it in batch.items:
            assert np.allclose(it.chunks[0].vector, model.embed([it.text])[0]) and not it.chunks[0].cached
    assert set(fresh[0]) == {"h-alpha", "h-beta"} and set(fresh[1]) == {"h-beta", "h-gamma"}


def test_a_repeat_embedded_after_its_lookup_comes_from_the_memo_not_the_model():
    """Group 2 is looked up while group 1 is still before the model: both miss; group 1's vector is
    in the memo by the time group 2 reaches the model."""
    model = FakeEmbedder()
    step = EmbedStep(model, DictCache({}))
    one, two = _chunked(model, _batch(0, "same"), _batch(1, "same"))
    need_one, need_two = step.prepare(share_of([one])), step.prepare(share_of([two]))
    [fresh_one], [fresh_two] = step.embed(share_of([one]), need_one), step.embed(share_of([two]), need_two)
    assert model.texts_embedded == 1
    assert two.items[0].chunks[0].cached and "h-same" not in fresh_two and "h-same" in fresh_one
    assert np.allclose(one.items[0].chunks[0].vector, two.items[0].chunks[0].vector)


def test_a_model_that_fails_to_load_is_handed_the_same_pending_at_the_retry():
    class LoadsOnSecondTry(FakeEmbedder):
        tries = 0

        def embed_prepared(self, prepared):
            self.tries += 1
            if self.tries == 1:
                raise TransientError("model", "loading: out of memory")
            return super().embed_prepared(prepared)

    model = LoadsOnSecondTry()
    step = EmbedStep(model, None)
    [batch] = _chunked(model, _batch(0, "alpha"))
    pending = step.prepare(share_of([batch]))
    with pytest.raises(TransientError):
        step.embed(share_of([batch]), pending)
    assert pending[0] and batch.items[0].chunks[0].vector is None  # the retry is handed the same
    [fresh] = step.embed(share_of([batch]), pending)
    assert batch.items[0].chunks[0].vector is not None and set(fresh) == {"h-alpha"}
