"""Chunk planning on token offsets: windows within the budget, cut at sentence or word boundaries,
overlapping, covering every token; a text that fits stays whole."""

from __future__ import annotations

import re

import pytest
from prometheus_client import REGISTRY

from schemas.errors import ConfigError
from tools.fake_embedder import FakeEmbedder
from worker.assembly.chain import chunker_for
from worker.core.records import Batch, DeadLetter, Item, Source, content_hash
from worker.settings import Settings
from worker.steps.model.chunk import Chunker, plan_chunks

from .fakes import share_of


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


# -- the chunk step -------------------------------------------------------------------------------

class CountingTokenizer(FakeEmbedder):
    """Counts the texts handed to the tokenizer."""

    tokenized = 0

    def token_offsets(self, texts):
        self.tokenized += len(texts)
        return super().token_offsets(texts)


def _batch(*texts: str) -> Batch:
    b = Batch()
    for i, t in enumerate(texts):
        item = Item(Source("docs", 0, i), f"d{i}", t, f"h{i}", 3, {})
        item.original = (f"d{i}".encode(), t.encode(), [("trace", b"1")])
        b.add(item)
    return b


def test_a_text_no_longer_than_the_budget_in_characters_is_never_tokenized():
    model = CountingTokenizer()
    batch = _batch("short one", "x" * 20)
    Chunker(model, "tokens", max_tokens=20, overlap=2, max_chunks=8).process(share_of([batch]))
    assert model.tokenized == 0
    assert [(c.index, c.start, c.end, c.hash) for it in batch.items for c in it.chunks] == [(0, 0, 9, "h0"),
                                                                                           (0, 0, 20, "h1")]


def test_a_long_text_becomes_chunks_and_one_that_fits_after_tokenizing_stays_whole():
    model = CountingTokenizer()
    long_text = " ".join(f"word{i}" for i in range(30))
    fits = "a b c d e f g h i j"  # 19 characters over a 10-token budget, but 10 tokens
    batch = _batch(long_text, fits, "short")
    metric = "embedstream_chunks_per_document"
    sample = REGISTRY.get_sample_value
    before = [sample(f"{metric}_bucket", {"le": le}) for le in ("1.0", "4.0", "+Inf")]
    chunked = sample("embedstream_documents_chunked_total")
    Chunker(model, "tokens", max_tokens=10, overlap=2, max_chunks=8).process(share_of([batch]))
    doc, whole, _ = batch.items
    assert model.tokenized == 2 and len(doc.chunks) == 4 and [c.index for c in doc.chunks] == [0, 1, 2, 3]
    assert all(c.text == long_text[c.start:c.end] and c.hash == content_hash(c.text) for c in doc.chunks)
    assert [(c.start, c.end, c.hash) for c in whole.chunks] == [(0, len(fits), "h1")]
    # the two long documents are counted by their chunks (4 and 1); the short one is not
    after = [sample(f"{metric}_bucket", {"le": le}) for le in ("1.0", "4.0", "+Inf")]
    assert [a - b for a, b in zip(after, before)] == [1, 2, 2]
    assert sample("embedstream_documents_chunked_total") - chunked == 1


def test_a_repeated_long_text_is_tokenized_once_and_gets_the_same_chunks():
    """The plan is remembered by content hash: a repeat in the same group or a later one (a re-sent
    document, one the cache will serve) costs no tokenizing."""
    model = CountingTokenizer()
    text = " ".join(f"word{i}" for i in range(30))
    chunker = Chunker(model, "tokens", max_tokens=10, overlap=2, max_chunks=8)

    def batch_of(*ids: str) -> Batch:
        b = Batch()
        for n, doc_id in enumerate(ids):
            b.add(Item(Source("docs", 0, n), doc_id, text, content_hash(text), 3, {}))
        return b

    first, later = batch_of("a", "b"), batch_of("c")
    chunker.process(share_of([first]))
    assert model.tokenized == 1
    chunker.process(share_of([later]))
    assert model.tokenized == 1
    spans = [[(c.index, c.start, c.end, c.hash, c.text) for c in it.chunks] for it in [*first.items, *later.items]]
    assert len(spans[0]) == 4 and spans[0] == spans[1] == spans[2]
    assert first.items[0].chunks[0] is not later.items[0].chunks[0]  # each item its own chunks (vectors)


def test_the_plan_memo_is_bounded_by_its_chunks_and_keeps_no_plan_of_a_dead_letter(monkeypatch):
    """Distinct long texts (a hostile stream) never grow the memo past ``PLAN_MEMO_CHUNKS`` chunks,
    the least recently used dropped first; a text of too many chunks is not remembered at all."""
    import worker.steps.model.chunk as chunk_module

    monkeypatch.setattr(chunk_module, "PLAN_MEMO_CHUNKS", 10)
    def one(text: str) -> Batch:
        b = Batch()
        b.add(Item(Source("docs", 0, 0), "d", text, content_hash(text), 3, {}))
        return b

    model = CountingTokenizer()
    chunker = Chunker(model, "tokens", max_tokens=10, overlap=2, max_chunks=8)
    for n in range(6):  # 4 chunks each: at most two plans fit in 10 chunks
        chunker.process(share_of([one(" ".join(f"w{n}x{i}" for i in range(30)))]))
        assert chunker._plan_chunks <= 10 and chunker._plan_chunks == sum(len(p[0]) for p in chunker._plans.values())
    assert len(chunker._plans) == 2
    newest = " ".join(f"w5x{i}" for i in range(30))
    tokenized = model.tokenized
    chunker.process(share_of([one(newest)]))
    assert model.tokenized == tokenized  # the newest plan was kept
    chunker.process(share_of([one(" ".join(f"long{i}" for i in range(100)))]))  # 13+ chunks: dead
    assert len(chunker._plans) == 2 and chunker._plan_chunks == 8


def test_too_many_chunks_turns_the_record_into_a_dead_letter_with_its_original_bytes():
    text = " ".join(f"word{i}" for i in range(100))
    batch = _batch(text, "fine")
    told: list[tuple[str, str]] = []
    share = share_of([batch])
    Chunker(FakeEmbedder(), "tokens", max_tokens=10, overlap=2, max_chunks=5,
            dead_lettered=lambda *dead: told.append(dead)).process(share)
    dead, fine = batch.entries
    assert isinstance(dead, DeadLetter) and dead.reason == "too_many_chunks"
    assert told == [("too_many_chunks", dead.message)]  # the breaker hears of it (DlqLimit.record_late)
    assert share.items == [fine]  # and the embed step never sees it
    assert (dead.key, dead.value, dead.headers) == (b"d0", text.encode(), [("trace", b"1")])
    assert "EMBEDSTREAM_MAX_CHUNKS" in dead.message and len(fine.chunks) == 1


def test_safe_chars_is_a_bound_no_text_of_fewer_characters_breaks():
    chunker = Chunker(FakeEmbedder(), "tokens", max_tokens=10, overlap=2, max_chunks=5)
    limit = next(n for n in range(1, 10_000) if n > chunker.safe_chars)
    # the most chunks a text of limit - 1 characters can make: one-character tokens
    worst = " ".join("x" * ((limit - 1) // 2))
    assert len(plan_chunks(worst, _words(worst), 10, 2)) <= 5
    assert not 10**9 > Chunker(FakeEmbedder(), "off", 10, 2, 5).safe_chars


def test_off_keeps_one_chunk_and_counts_what_the_model_cuts():
    before = REGISTRY.get_sample_value("embedstream_tokens_truncated_total") or 0.0
    batch = _batch(" ".join(f"w{i}" for i in range(25)))
    Chunker(FakeEmbedder(), "off", max_tokens=10, overlap=2, max_chunks=5).process(share_of([batch]))
    assert len(batch.items[0].chunks) == 1
    assert REGISTRY.get_sample_value("embedstream_tokens_truncated_total") - before == 15


def test_chunk_settings_the_model_cannot_serve_stop_the_start():
    model = FakeEmbedder()  # max_seq_length 256, 2 special tokens
    assert chunker_for(Settings(), model).max_tokens == 254
    with pytest.raises(ConfigError, match="EMBEDSTREAM_CHUNK_TOKENS=300 is more than the model takes: 254"):
        chunker_for(Settings(chunk_tokens=300), model)
    with pytest.raises(ConfigError, match="EMBEDSTREAM_CHUNK_OVERLAP"):
        chunker_for(Settings(chunk_tokens=40, chunk_overlap=30), model)
