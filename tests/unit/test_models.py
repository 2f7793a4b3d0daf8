"""A set of models in one worker, on fake models: names and defaults, loading within a memory budget
(least recently used unloaded), and the chain's steps keeping each model's items to themselves."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import ConfigError
from tools.fake_embedder import FakeEmbedder
from worker.assembly.chain import by_model
from worker.assembly.naming import collection_name
from worker.assembly.runner import inflight_limit
from worker.core.records import Batch, Chunk, Item, Source, split_by_model
from worker.embedding.models import ModelSet, ModelSpec, parse_models
from worker.settings import Settings

from .fakes import prepare_and_embed


class Sized(FakeEmbedder):
    """A fake model that says how big its weights are (what the budget counts)."""

    def __init__(self, name: str, dim: int, mb: int) -> None:
        super().__init__(dim=dim, model_id=f"org/{name}")
        self.mb = mb


def _set(memory_mb=None, **sizes) -> tuple[ModelSet, list[str]]:
    loads: list[str] = []
    specs = {n: ModelSpec(path=n) for n in sizes}

    def load(spec: ModelSpec) -> Sized:
        loads.append(spec.path or "")
        name = spec.path or ""
        return Sized(name, 8 * (1 + list(sizes).index(name)), sizes[name])

    import worker.embedding.models as m

    real = m.weight_bytes
    m.weight_bytes = lambda e: e.mb * 2**20  # type: ignore[assignment]
    try:
        return ModelSet(specs, load, memory_mb), loads
    finally:
        m.weight_bytes = real


def test_parse_json_or_yaml_and_say_what_is_wrong(tmp_path):
    specs = parse_models('{"small": {"path": "/m/small", "default": true}, "big": {"precision": "bf16"}}')
    assert list(specs) == ["small", "big"] and specs["small"].default and specs["big"].precision == "bf16"
    f = tmp_path / "models.yaml"
    f.write_text("e5:\n  path: /m/e5\n  document_prompt: 'passage: '\n  truncate_dim: 256\n")
    assert parse_models(str(f))["e5"].document_prompt == "passage: "
    for bad, fragment in (('{"a": {"precision": "fp8"}}', "precision"), ('{"a": {"colour": 1}}', "colour"),
                          ("/no/such/file.yaml", "neither a JSON object nor a file"),
                          ('{"a": {"default": true}, "b": {"default": true}}', "more than one")):
        with pytest.raises(ConfigError, match=fragment):
            parse_models(bad)


def test_names_ids_and_the_default_resolve():
    models, loads = _set(a=10, b=10)
    assert loads == ["a", "b"]  # each loaded once at start-up: a wrong one fails then
    assert models.resolve(None) == models.resolve("") == "a"  # the first, with no default marked
    assert models.resolve("b") == models.resolve("org/b") == "b" and models.resolve("c") is None
    assert collection_name("embeddings", "e5-small", several=True) == "embeddings_e5_small"
    assert collection_name("emb_{model}_v2", "big", several=True) == "emb_big_v2"
    assert collection_name("embeddings", "", several=False) == "embeddings"


def test_a_model_that_does_not_fit_unloads_the_least_recently_used():
    models, loads = _set(memory_mb=25, a=10, b=10, c=10)
    assert [models.loaded(n) for n in "abc"] == [False, True, True]  # a gave way at start-up
    models.acquire("b")  # b is now the most recently used: c goes next
    models.acquire("a")
    assert [models.loaded(n) for n in "abc"] == [True, True, False] and loads[-1] == "a"
    assert models.evictions == 2 and models.loads == 4
    # a handle loads its model on use, and keeps the profile's figures meanwhile
    handle = models.handles["c"]
    assert handle.dim == models.profiles["c"].dim and not models.loaded("c")
    assert handle.embed(["x"]).shape == (1, handle.dim) and models.loaded("c")


#: What a failed allocation raised here: torch's CPU allocator (torch 2.13, this host, copied from a
#: real ``torch.empty(2**46)``), CUDA's, numpy's (a MemoryError), and an mmap without memory (ENOMEM).
_OUT_OF_MEMORY = [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                 "tried to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    MemoryError("Unable to allocate 64.0 TiB for an array"),
    OSError(12, "Cannot allocate memory"),
]


def _failing_once(models: ModelSet, name: str, exc: BaseException) -> None:
    real, failed = models._load, []

    def load(spec: ModelSpec):
        if spec.path == name and not failed:
            failed.append(exc)
            raise exc
        return real(spec)

    models._load = load


@pytest.mark.parametrize("exc", _OUT_OF_MEMORY, ids=["torch-cpu", "cuda", "numpy", "enomem"])
def test_a_load_out_of_memory_is_retried_once_every_other_model_is_unloaded(exc):
    models, loads = _set(memory_mb=25, a=10, b=10, c=10)  # b and c resident: the budget's guess
    _failing_once(models, "a", exc)  # but the memory the host really has takes a alone
    assert models.acquire("a") is not None
    assert [models.loaded(n) for n in "abc"] == [True, False, False]  # b for the budget, c for the retry
    assert models.evictions == 3 and loads[-1] == "a"


def test_a_load_that_fails_otherwise_unloads_nothing_and_is_retried_later():
    from schemas.errors import TransientError

    models, _ = _set(memory_mb=25, a=10, b=10, c=10)
    _failing_once(models, "a", RuntimeError("size mismatch for embeddings.weight"))
    with pytest.raises(TransientError, match="loading 'a': size mismatch"):
        models.acquire("a")
    assert [models.loaded(n) for n in "abc"] == [False, False, True]  # only the budget's eviction
    assert models.acquire("a") is not None  # the batch's retry


def test_preparing_texts_for_a_model_never_loads_it_and_embedding_them_does():
    """The prepare thread's calls go to the side kept from the first load (a tokenizer without
    weights): they must not load a model, nor unload the one the embed thread is running."""
    models, loads = _set(memory_mb=15, a=10, b=10)
    assert not models.loaded("a") and models.loaded("b")
    handle = models.handles["a"]
    prepared = handle.prepare(["x", "y"])
    assert handle.offsets_over(["x " * 600], 300)[0] is not None and handle.token_offsets(["x y"]) == [[(0, 1), (2, 3)]]
    assert not models.loaded("a") and models.loaded("b") and loads == ["a", "b"]
    assert handle.embed_prepared(prepared)[0].shape == (2, handle.dim) and models.loaded("a") and not models.loaded("b")


def test_a_model_over_the_budget_alone_fails_at_start_up():
    with pytest.raises(ConfigError, match="EMBEDSTREAM_MODEL_MEMORY_MB=5"):
        _set(memory_mb=5, a=10)


def _item(i: int, model: str) -> Item:
    it = Item(Source("docs", 0, i), f"d{i}", f"text {i}", f"h{i}", 3, {}, model=model)
    it.chunks = [Chunk(0, 0, len(it.text), it.text, it.hash)]
    return it


def test_each_models_step_sees_only_its_items_loaded_models_first():
    seen: list[tuple[str, list[str]]] = []

    def step(name):
        def run(share, before):
            seen.append((name, [it.id for it in share.items]))
            return [{"by": name, "before": b} for b in before]
        return run

    batch, other = Batch(), Batch()
    for i, m in enumerate("abab"):
        batch.add(_item(i, m))
    handed = by_model({"a": step("a"), "b": step("b")}, loaded=lambda n: n == "b")(
        [batch, other], [{"a": "for a", "b": "for b"}, None])
    assert seen == [("b", ["d1", "d3"]), ("a", ["d0", "d2"])]
    # each model's step is handed its own part of what came with each batch; what it returns for a
    # batch is handed on under its name (a model with nothing for a batch is left out)
    assert handed == [{"a": {"by": "a", "before": "for a"}, "b": {"by": "b", "before": "for b"}},
                      {"a": {"by": "a", "before": {}}, "b": {"by": "b", "before": {}}}]


def test_the_embed_step_fills_only_its_models_vectors():
    from worker.steps.model.embed import EmbedStep

    a, b = FakeEmbedder(dim=4, model_id="a"), FakeEmbedder(dim=6, model_id="b")
    batch = Batch()
    for i, m in enumerate("abab"):
        batch.add(_item(i, m))
    shares = split_by_model([batch])
    [fresh_a] = prepare_and_embed(EmbedStep(a, None, model="a"), shares["a"])
    [fresh_b] = prepare_and_embed(EmbedStep(b, None, model="b"), shares["b"])
    assert [np.asarray(it.chunks[0].vector).shape[0] for it in batch.items] == [4, 6, 4, 6]
    assert set(fresh_a) == {"h0", "h2"} and set(fresh_b) == {"h1", "h3"}


def test_each_model_served_may_hold_the_batches_in_flight_of_a_worker_of_one():
    two, _ = _set(a=10, b=10)
    one = ModelSet.single(FakeEmbedder(dim=8))
    assert inflight_limit(Settings(max_inflight_batches=8), one) == 8
    assert inflight_limit(Settings(max_inflight_batches=8), two) == 16
    assert inflight_limit(Settings(max_inflight_batches=3), two) == 6


def test_each_model_of_a_set_has_its_own_sparse_side_and_a_learned_one_is_asked_through_its_handle(monkeypatch):
    """``sparse`` per model (else EMBEDSTREAM_SPARSE): each handle's profile carries it, so its
    collection has that shape (its space id) and its embed step asks for sparse vectors."""
    from worker.assembly.runner import load_embedder

    specs = parse_models('{"plain": {}, "words": {"sparse": "bm25"}, "learned": {"sparse": "org/splade"}}')
    assert [s.sparse for s in specs.values()] == [None, "bm25", "org/splade"]
    models = ModelSet(specs, lambda spec: FakeEmbedder(model_id="org/m", sparse=spec.sparse or "off"))
    handles = models.handles
    assert [h.sparse.setting for h in handles.values()] == ["off", "bm25", "org/splade"]
    assert len({h.space_id for h in handles.values()}) == 3 and handles["words"].cache_id == handles["plain"].cache_id
    dense, sparse = handles["learned"].embed_sparse(["a text"])
    assert dense.shape == (1, 8) and len(sparse[0][0]) == len(sparse[0][1]) > 0
    with pytest.raises(ConfigError, match="no sparse model"):
        handles["words"].embed_sparse(["a text"])
    # the setting is each spec's default: a spec without ``sparse`` takes EMBEDSTREAM_SPARSE
    seen: dict = {}
    monkeypatch.setattr("worker.embedding.sentence.SentenceTransformerEmbedder", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr("worker.embedding.lite.lite_model", lambda *a, **kw: None)  # the whole load, always
    load_embedder(Settings(sparse="bm25"), specs["plain"])
    assert seen["sparse"].setting == "bm25"
    load_embedder(Settings(sparse="bm25"), specs["learned"])
    assert seen["sparse"].setting == "org/splade"
