"""The recall sets of the bench's hybrid rows: one indexed text per function, its name as the
identifier query, its docstring's first sentence (left out of the text) as the natural-language one."""

from __future__ import annotations

from tools.bench.hybrid import eval_corpus, first_sentence


def test_the_first_sentence_is_cut_at_its_full_stop_and_the_rest_kept_whole():
    got = first_sentence("Return x. More text\nhere.\n\nParagraph two.")
    assert got == ("Return x.", "More text here.\n\nParagraph two.")
    assert first_sentence("One line, no stop") == ("One line, no stop", "")


def test_each_query_is_for_its_own_text_and_the_sentence_asked_is_not_in_it():
    texts, names, sentences = eval_corpus(200)
    assert len(texts) == len(names) == len(sentences) == 200 and len(set(names)) == 200
    for text, name, sentence in zip(texts, names, sentences):
        assert text.startswith(name + "\n\n") and sentence not in text and len(sentence.split()) >= 5
    assert eval_corpus(200) == (texts, names, sentences)  # the same sets on every run
