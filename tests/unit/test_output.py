"""Output formats: the values the sink writes for a document's chunks read back as its records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from connectors.registry import frame
from schemas.codec import decode_embedding
from worker.core.records import Chunk, Item, Source
from worker.steps.writing.output import JsonOutput, OutputFormat, RegistryOutput, records


def _item(chunks: int, metadata: dict[str, str]) -> Item:
    rng = np.random.default_rng(chunks)
    text = "word " * (40 * chunks)
    item = Item(Source("documents", 4, 123_456_789), "doc-é", text, "h" * 64, 10, metadata)
    item.chunks = [Chunk(k, 200 * k, 200 * (k + 1), text[200 * k:200 * (k + 1)], f"{k:064x}",
                         rng.standard_normal(8).astype(np.float32), cached=k == 1) for k in range(chunks)]
    return item


class _Registry:
    def register(self, subject: str, schema: str) -> int:
        assert subject == "out-value" and '"Embedding"' in schema
        return 77


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("metadata", [{}, {"lang": "fr", "src": "wiki"}])
def test_each_format_writes_the_records_of_a_documents_chunks(chunks, metadata):
    item = _item(chunks, metadata)
    want = records(item, "minilm", 8, 1_795_572_343_545)
    assert [r["chunk_index"] for r in want] == list(range(chunks)) and {r["chunk_count"] for r in want} == {chunks}

    def same(got: dict, rec: dict) -> None:
        assert np.array_equal(np.asarray(got.pop("vector"), dtype=np.float32), rec["vector"])
        assert got == {k: v for k, v in rec.items() if k != "vector"}

    avro = OutputFormat().values(item, "minilm", 8, 1_795_572_343_545)
    for value, rec in zip(avro, want, strict=True):
        same(decode_embedding(value), rec)
    for value, rec in zip(JsonOutput().values(item, "minilm", 8, 1_795_572_343_545), want, strict=True):
        same(json.loads(value), rec)
    registry = RegistryOutput(_Registry(), "out")  # type: ignore[arg-type]  # only register() is used
    registry.ready()
    framed = registry.values(item, "minilm", 8, 1_795_572_343_545)
    assert [v[:5] for v in framed] == [frame(77)] * chunks and [v[5:] for v in framed] == avro
