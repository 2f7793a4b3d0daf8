"""The batcher's token estimate against the real tokenizer: close to the exact count in sum."""

from __future__ import annotations

import pytest

from worker.tools.bench.workloads import mixed_texts, short_texts

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("texts", [mixed_texts(1500), short_texts(1500)], ids=["docstrings", "sentences"])
def test_estimate_is_within_ten_percent_of_the_tokenizer_in_sum(model, texts):
    exact = sum(len(ids) for ids in model.tokenize(texts))
    estimate = sum(model.estimate_tokens(texts))
    assert 0.9 <= estimate / exact <= 1.1, (estimate, exact)
