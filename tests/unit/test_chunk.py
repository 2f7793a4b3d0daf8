"""Chunk planning on token offsets: windows within the budget, cut at sentence or word boundaries,
overlapping, covering every token; a text that fits stays whole."""

from __future__ import annotations

import re

import pytest

from worker.steps.chunk import plan_chunks


def _words(text: str) -> list[tuple[int, int]]:
    """Offsets of a toy tokenizer: a token per word, and one per punctuation mark."""
    return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


def _tokens_in(span, offsets) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if s >= span[0] and e <= span[1]]


def test_a_text_that_fits_is_one_chunk_spanning_all_of_it():
    text = "  A short text. "
    assert plan_chunks(text, _words(text), max_tokens=10, overlap=2) == [(0, len(text))]
    assert plan_chunks("", [], max_tokens=10, overlap=2) == [(0, 0)]


@pytest.mark.parametrize("max_tokens,overlap", [(20, 4), (33, 0), (64, 32), (7, 3)])
def test_windows_stay_within_budget_cover_every_token_and_overlap(max_tokens, overlap):
    text = " ".join(f"Sentence {i} has some words in it, and then it ends." for i in range(40))
    offsets = _words(text)
    spans = plan_chunks(text, offsets, max_tokens, overlap)
    assert len(spans) > 1
    covered: set[int] = set()
    for a, b in zip(spans, spans[1:]):
        assert a[0] < b[0] and a[1] < b[1], "chunks move forward"
        if overlap:
            assert b[0] < a[1], "consecutive chunks overlap"
    for span in spans:
        toks = _tokens_in(span, offsets)
        assert 0 < len(toks) <= max_tokens
        covered.update(toks)
    assert covered == set(range(len(offsets)))
    assert spans[0][0] == 0 and spans[-1][1] == len(text)


def test_a_window_ends_at_a_sentence_end_in_its_last_quarter():
    text = ("one two three four five six seven eight. nine ten eleven twelve thirteen fourteen fifteen sixteen "
            "seventeen eighteen nineteen twenty")
    offsets = _words(text)
    first = plan_chunks(text, offsets, max_tokens=10, overlap=0)[0]
    assert text[first[0]:first[1]] == "one two three four five six seven eight."


def test_without_a_sentence_end_a_window_ends_between_words_not_inside_one():
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"
    # a tokenizer that splits each word into two pieces: 'al' + 'pha'
    offsets = []
    for m in re.finditer(r"\w+", text):
        mid = m.start() + max(1, len(m.group()) // 2)
        offsets += [(m.start(), mid), (mid, m.end())]
    for a, b in plan_chunks(text, offsets, max_tokens=7, overlap=2):
        assert (a == 0 or text[a - 1] == " ") and (b == len(text) or text[b] == " "), text[a:b]


def test_one_endless_word_is_cut_hard_and_still_covered():
    text = "x" * 100
    offsets = [(i, i + 1) for i in range(100)]
    spans = plan_chunks(text, offsets, max_tokens=30, overlap=5)
    assert spans[0] == (0, 30) and spans[-1][1] == 100
    assert all(b - a <= 30 for a, b in spans)
