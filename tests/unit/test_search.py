"""Search results: documents ranked by their best chunk, the same text under several ids one row."""

from __future__ import annotations

from worker.commands.search import best_chunk_per_document


def _row(doc: str, score: float, chunk: int = 0, content: str | None = None) -> dict:
    return {"id": f"{doc}#{chunk}", "doc_id": doc, "score": score, "chunk_index": chunk, "chunk_count": 2,
            "span_start": 0, "span_end": 9, "excerpt": f"text of {content or doc}", "content_hash": content or doc}


def test_each_document_is_ranked_by_its_best_chunk():
    hits = best_chunk_per_document([_row("a", 0.9, 1), _row("b", 0.8), _row("a", 0.7, 0), _row("c", 0.6)], 2)
    assert [(h["id"], h["chunk"], h["also"]) for h in hits] == [("a", 1, []), ("b", 0, [])]


def test_the_same_text_under_other_ids_folds_into_one_row_and_the_top_k_are_different_texts():
    rows = [_row("demo-161", 0.646, content="h1"), _row("demo-2771", 0.646, content="h1"),
            _row("demo-2943", 0.646, content="h1"), _row("other", 0.5, content="h2"), _row("third", 0.4, content="h3")]
    hits = best_chunk_per_document(rows, 2)
    assert [h["id"] for h in hits] == ["demo-161", "other"]
    assert hits[0]["also"] == ["demo-2771", "demo-2943"] and hits[1]["also"] == []


def test_rows_without_a_content_hash_never_fold():
    rows = [{**_row("a", 0.9), "content_hash": None}, {**_row("b", 0.8), "content_hash": None}]
    assert [h["id"] for h in best_chunk_per_document(rows, 5)] == ["a", "b"]
