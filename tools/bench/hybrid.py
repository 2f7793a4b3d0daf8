"""The bench's hybrid retrieval rows (docs/benchmarks.md: recall@10, bm25 cost).

**Recall@10** of dense, sparse (BM25) and hybrid (RRF) search on two query sets built from the demo
corpus (the standard library's docstrings). Each indexed document is one function: its qualified
name, then its docstring *less its first sentence*.

- identifier queries: the function's qualified name (``json.decoder.py_scanstring``) must find it;
- natural-language queries: the docstring's first sentence (removed from the indexed text) must find it.

A query counts as found when its document is among the first 10 documents (each ranked by its best
chunk, as ``embedstream search`` ranks them). Only functions whose name is unique in the corpus are
used (a method is ``<module>.<name>``, so two classes' ``__init__`` share one), and only docstrings
with a first sentence of at least 5 words, not repeated later, and 40 characters left after it.

**bm25 cost**: the S2 texts end to end with ``EMBEDSTREAM_SPARSE=off`` and ``bm25``, back to back
(``R1_bm25`` = bm25 ÷ off docs/s, the goal ≥ 0.9).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

from schemas.sparse import SparseKind
from tools.bench import measure
from tools.corpus import stdlib_definitions
from worker.settings import Settings

K = 10
MODES = ("dense", "sparse", "hybrid")


def first_sentence(doc: str) -> tuple[str, str]:
    """``(first sentence, the rest)`` of a docstring: the first paragraph up to its first ". "."""
    head, _, tail = doc.partition("\n\n")
    head = " ".join(head.split())
    cut = head.find(". ")
    sentence, rest = (head, "") if cut < 0 else (head[:cut + 1], head[cut + 2:])
    return sentence, (rest + ("\n\n" + tail if tail else "")).strip()


def eval_corpus(n: int, seed: int = 5) -> tuple[list[str], list[str], list[str]]:
    """``(indexed texts, identifier queries, natural-language queries)`` for ``n`` functions: query
    ``i`` of each set is for text ``i``."""
    defs = [(name, doc) for name, kind, doc in stdlib_definitions() if kind == "function"]
    names = Counter(name for name, _ in defs)
    usable = []
    for name, doc in defs:
        sentence, rest = first_sentence(doc)
        if names[name] == 1 and len(sentence.split()) >= 5 and len(rest) >= 40 and sentence not in rest:
            usable.append((name, sentence, rest))
    random.Random(seed).shuffle(usable)
    if len(usable) < n:
        raise ValueError(f"only {len(usable)} functions qualify for the recall sets, asked for {n}")
    picked = usable[:n]
    return [f"{name}\n\n{rest}" for name, _, rest in picked], [p[0] for p in picked], [p[1] for p in picked]


def recall(base: Settings, emb, n: int, queries: int, say: Callable[[str], None]) -> dict:
    """Index ``n`` functions with ``EMBEDSTREAM_SPARSE=bm25`` (the worker end to end), then ask the
    first ``queries`` of each set in each mode: recall@10 by set and mode, and the indexing rate."""
    from connectors.milvus import MilvusReader
    from connectors.milvus.reads import Query
    from worker.assembly.runner import build_worker
    from worker.commands.search import best_documents
    from worker.core.records import normalise_text

    texts, identifiers, sentences = eval_corpus(n)
    s = measure.fresh_topics(base, sparse="bm25")
    prefix = "fn"
    measure.produce_texts(s, texts, prefix)
    say(f"recall@10: indexing {n} functions (name + docstring less its first sentence) with bm25")
    stats = build_worker(s, embedder=emb).run(stop_when_idle=0.3)
    reader = MilvusReader(s.milvus_uri or "", s.milvus_collection, timeout=60)
    out: dict = {"documents": n, "queries": queries, "index_docs_per_s": stats.done / stats.busy_seconds}
    try:
        for name, asked in (("identifiers", identifiers), ("natural_language", sentences)):
            asked = [normalise_text(q) for q in asked[:queries]]
            vectors = emb.embed_query(asked)
            found = dict.fromkeys(MODES, 0)
            t0 = time.perf_counter()
            for i, (q, vec) in enumerate(zip(asked, vectors)):
                for mode in MODES:
                    hits = best_documents(reader, Query(vec, q), mode, K, kind=SparseKind.BM25)  # as `search` asks
                    found[mode] += f"{prefix}-{i}" in {h["id"] for h in hits}
            out[name] = {mode: found[mode] / len(asked) for mode in MODES}
            out[name]["ms_per_search"] = (time.perf_counter() - t0) * 1000 / (len(asked) * len(MODES))
            say(f"recall@10 {name}: " + ", ".join(f"{m} {out[name][m]:.3f}" for m in MODES))
    finally:
        reader.close()
        measure.drop_collection(s)
    return out


def bm25_cost(base: Settings, emb, texts: list[str], say: Callable[[str], None], pairs: int = 2) -> dict:
    """S2 end to end with sparse off and bm25, alternated ``pairs`` times (a pair measured minutes
    apart differs by more than the cost): docs/s of each run, and bm25 ÷ off over the sums."""
    runs: dict[str, list[float]] = {"off": [], "bm25": []}
    for k in range(pairs):
        for mode in ("off", "bm25"):
            say(f"bm25 cost: S2 end to end, EMBEDSTREAM_SPARSE={mode} ({k + 1}/{pairs})")
            res = measure.worker_stream(base.model_copy(update={"sparse": mode}), emb, texts,
                                        f"s2-{mode}-{int(time.time())}")
            runs[mode].append(res.docs_per_s)
    return {"off_docs_per_s": runs["off"], "bm25_docs_per_s": runs["bm25"], "docs": len(texts),
            "ratio": sum(runs["bm25"]) / sum(runs["off"])}
