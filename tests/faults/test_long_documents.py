"""Scenario 12: long documents, several chunks each, updated to versions with more or fewer chunks
while the worker is killed (-9) twice. At the end every document's rows are exactly the chunks of
its last version: the spans the chunk planner gives for its newest text, no chunk of an older one.
It runs with ``EMBEDSTREAM_SPARSE=bm25``: the sparse side (each row's text) ends the same way."""

from __future__ import annotations

import pytest

from schemas.codec import Document
from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_reader,
    produce_docs,
    record_row,
    wait_until,
)
from tests.helpers import documents_in_milvus
from tools.corpus import stdlib_docstrings
from worker.core.records import normalise_text
from worker.steps.model.chunk import plan_chunks

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CHUNK_TOKENS, OVERLAP = 64, 8


def _versions(n: int) -> tuple[list[Document], list[Document]]:
    """Two versions of ``n`` long documents: version 2 of each has a different number of paragraphs
    (about half grow, half shrink, some to a single chunk)."""
    paras = [" ".join(d.split()) for _, d in stdlib_docstrings() if 400 <= len(d) <= 1500]
    v1, v2 = [], []
    for i in range(n):
        k1, k2 = 2 + i % 4, (1 if i % 5 == 0 else 1 + (i * 7) % 6)
        v1.append(Document(f"long-{i}", "\n\n".join(paras[(i * 11 + j) % len(paras)] for j in range(k1))))
        v2.append(Document(f"long-{i}", "\n\n".join(paras[(i * 13 + 5 + j) % len(paras)] for j in range(k2))))
    return v1, v2


@pytest.mark.guarantee
def test_kill_9_while_long_documents_are_updated(fs, model, tmp_path):
    s = fs.model_copy(update={"chunk_tokens": CHUNK_TOKENS, "chunk_overlap": OVERLAP, "sparse": "bm25"})
    expected = Expected()
    v1, v2 = _versions(80)
    with committed_reader(s, PARTITIONS) as committed:
        produce_docs(s, v1, expected)
        w = WorkerProcess(s, tmp_path, "w0")
        wait_until(lambda: committed() >= 0.3 * len(v1), 180, every=0.02, what="30% of version 1 committed")
        w.kill9()
        produce_docs(s, v2, expected)  # newer versions behind what the kill left uncommitted
        w = WorkerProcess(s, tmp_path, "w1")
        wait_until(lambda: committed() >= len(v1) + 0.4 * len(v2), 180, every=0.02, what="40% of version 2 committed")
        w.kill9()
    w = WorkerProcess(s, tmp_path, "w2", ("--stop-when-idle", "0.5"))
    assert w.wait(300) == 0, w.log()[-3000:]
    report = check_nothing_lost(s, model, expected, PARTITIONS)

    # exactly the chunks of each document's last version: the planner's spans of its newest text
    docs = documents_in_milvus(s)
    newest = {d.id: normalise_text(d.text) for d in v2}
    offsets = model.token_offsets(list(newest.values()))
    for (doc, text), toks in zip(newest.items(), offsets):
        want = plan_chunks(text, toks, CHUNK_TOKENS, OVERLAP)
        assert [(r["span_start"], r["span_end"]) for r in docs[doc]] == want, doc
    chunks = sum(len(c) for c in docs.values())
    assert chunks > 2 * len(docs)
    record_row("12 long documents", f"2 kills while 80 documents ({chunks} chunks, bm25) changed length", report,
               None)
