"""The batcher's token estimate against the real tokenizer: close to the exact count in sum."""

from __future__ import annotations

import pytest

from tools.bench.workloads import mixed_texts, short_texts

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("texts", [mixed_texts(1500), short_texts(1500)], ids=["docstrings", "sentences"])
def test_estimate_is_within_ten_percent_of_the_tokenizer_in_sum(model, texts):
    exact = sum(len(ids) for ids in model.tokenize(texts))
    estimate = sum(model.estimate_tokens(texts))
    assert 0.9 <= estimate / exact <= 1.1, (estimate, exact)


def test_a_long_text_that_fits_is_tokenized_once_and_embeds_the_same(model):
    """The chunk step's tokenizing of a text that fits whole hands its ids to the model: the same ids
    as the model's own tokenizing, the same vectors; a text that needs cutting keeps no ids."""
    import numpy as np

    long = [t for t in mixed_texts(1500) if len(t) > 300]
    texts = [t for t, ids in zip(long, model.tokenize(long)) if len(ids) < model.chunk_room][:40]
    assert len(texts) == 40
    cut = " ".join(texts)  # well over one chunk
    offsets = model.offsets_over([*texts, cut], model.chunk_room)
    assert offsets[-1] == model.token_offsets([cut])[0] and all(o is None for o in offsets[:-1])
    assert set(model.tokens.known_ids) == set(texts)
    assert [model.tokens.known_ids[t] for t in texts] == model.tokenize(texts)
    reused = model.embed(texts)
    model.tokens.known_ids = {}
    assert np.array_equal(reused, model.embed(texts))
