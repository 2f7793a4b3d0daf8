"""The batcher's token estimate: capped like the model, and close to the real count in sum."""

from __future__ import annotations

import pytest

from worker.bench.workloads import mixed_texts, short_texts
from worker.embedding.fake import FakeEmbedder


def test_estimate_counts_special_tokens_and_caps_at_the_model_max():
    model = FakeEmbedder()
    assert model.estimate_tokens(["", "abcd" * 10, "x" * 100_000]) == [2, 12, model.max_seq_length]


@pytest.mark.integration
@pytest.mark.parametrize("texts", [mixed_texts(1500), short_texts(1500)], ids=["docstrings", "sentences"])
def test_estimate_is_within_ten_percent_of_the_tokenizer_in_sum(model, texts):
    exact = sum(len(ids) for ids in model.tokenize(texts))
    estimate = sum(model.estimate_tokens(texts))
    assert 0.9 <= estimate / exact <= 1.1, (estimate, exact)
