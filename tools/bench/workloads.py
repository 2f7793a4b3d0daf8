"""Texts for the benchmark workloads, built at run time from the local standard library."""

from __future__ import annotations

import random

from tools.corpus import stdlib_docstrings

#: Workload sizes (documents) for a full run and for --quick. The io run (instant model) and S4 (whose
#: 90 % run is short) get more documents than S2, so that they last long enough to outweigh the
#: pipeline's fill and drain (S4 at 90 %: Rdup90 5.4 with 3,000 documents, 7.2-7.5 with 5,000; the
#: io run: 800 documents were 0.15 s of work, too little to compare two runs by; even --quick gives
#: it 4,000, about half a second more per run; the full run 20,000, past the corpus: ``io_texts``).
FULL = {"S1": 3000, "S2": 3000, "S4": 5000, "io": 20_000, "upsert_rows": 10_000, "S5_seconds": 30.0,
        "quality_texts": 500, "raw_batch_sizes": (32, 64, 128), "long": None, "precision_queries": 200,
        "two_models": None, "recall_docs": 2000, "recall_queries": 500}
#: ``recall_docs`` / ``recall_queries``: the functions indexed for recall@10 and the queries of each
#: set asked (``tools.bench.hybrid``).
#: ``long``: how many long documents (``corpus.long_documents``, the shortest of them; None: all).
#: ``two_models``: how many of the S2 texts the two-model runs take (None: all). --quick measures one
#: raw batch size: 32, the best of 32/64/128 for S1 and S2 in the full CPU run (docs/bench/bench.json).
QUICK = {"S1": 400, "S2": 400, "S4": 300, "io": 4000, "upsert_rows": 2000, "S5_seconds": 4.0,
         "quality_texts": 200, "raw_batch_sizes": (32,), "long": 3, "precision_queries": 100, "two_models": 200,
         "recall_docs": 600, "recall_queries": 150}


def short_texts(n: int, seed: int = 1) -> list[str]:
    """S1: one sentence each (the first sentence of a docstring), ~10–40 tokens, all distinct."""
    seen: set[str] = set()
    out = []
    for _name, doc in stdlib_docstrings():
        first = doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].strip()
        if 40 <= len(first) <= 200 and first not in seen:
            seen.add(first)
            out.append(first)
    random.Random(seed).shuffle(out)
    if len(out) < n:
        raise ValueError(f"only {len(out)} short texts available, asked for {n}")
    return out[:n]


def mixed_texts(n: int, seed: int = 2) -> list[str]:
    """S2: stdlib docstrings as they are (median ~100 chars, long tail), all distinct."""
    texts = [doc for _name, doc in stdlib_docstrings()]
    random.Random(seed).shuffle(texts)
    if len(texts) < n:
        raise ValueError(f"only {len(texts)} docstrings available, asked for {n}")
    return texts[:n]


def distinct(texts: list[str], n: int) -> list[str]:
    """``n`` distinct texts from ``texts`` taken in turn, each pass after the first with a number
    appended (more documents than the corpus holds, none a repeat)."""
    return [texts[i % len(texts)] + (f" ({i // len(texts)})" if i >= len(texts) else "") for i in range(n)]


def io_texts(n: int) -> list[str]:
    """The io runs' texts (instant model): S2's docstrings, distinct past the corpus."""
    return distinct(mixed_texts(min(n, 6000)), n)


def with_repeats(n: int, fraction: float, seed: int = 3) -> list[str]:
    """S4: ``n`` texts of which ``fraction`` repeat earlier ones (Zipf-like: a few repeat often)."""
    rng = random.Random(seed)
    unique = max(1, int(round(n * (1 - fraction))))
    base = mixed_texts(unique, seed=seed)
    weights = [1.0 / (rank + 1) for rank in range(unique)]
    texts = base + [base[rng.choices(range(unique), weights)[0]] for _ in range(n - unique)]
    rng.shuffle(texts)
    return texts


def long_texts(n: int | None) -> list[str]:
    """Long documents of 2,000–10,000 words of real text on this machine (``corpus.long_documents``):
    ``n`` of the shortest, or all of them."""
    from tools.corpus import long_documents

    docs = long_documents()
    return [d.text for d in (docs if n is None else docs[-n:])]


def edited(text: str) -> str:
    """``text`` with one paragraph in its middle changed (a word added): a typical small edit."""
    paragraphs = text.split("\n\n")
    i = len(paragraphs) // 2
    paragraphs[i] = paragraphs[i] + " (edited)"
    return "\n\n".join(paragraphs)
