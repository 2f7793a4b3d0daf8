"""Prompts and truncated dimensions: the worker's vectors equal sentence-transformers' own
``encode_document`` / ``encode_query`` (cosine ≥ 0.999 at fp32), on models derived in the test from
the packaged MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import ConfigError
from tools.derived_models import packaged_model_path, prompted_model
from worker.assembly.chain import chunker_for
from worker.embedding.sentence import SentenceTransformerEmbedder
from worker.settings import Settings

pytestmark = pytest.mark.integration

TEXTS = ["How do I parse command-line arguments?", "Return the base name of a pathname.",
         "A queue with a fixed size that blocks producers when full. " * 6, "Résumé of the café's menu."]


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


@pytest.mark.parametrize("include_prompt", [True, False], ids=["pooled with the prompt", "prompt left out"])
def test_documents_and_queries_get_the_models_prompts(tmp_path, include_prompt):
    path = prompted_model(tmp_path / "m", {"query": "query: ", "document": "passage: "}, include_prompt)
    emb = SentenceTransformerEmbedder(str(path), "fp32", "cpu")
    assert (emb.document_prompt, emb.query_prompt) == ("passage: ", "query: ")
    st = emb.sentence_transformer
    assert _min_cos(emb.embed(TEXTS), st.encode_document(TEXTS)) >= 0.999
    assert _min_cos(emb.embed_query(TEXTS), st.encode_query(TEXTS)) >= 0.999
    # the worker's way: token ids made on the prepare thread (prompt included), passes on the embed thread
    ids = emb.preparer.prepare(TEXTS)
    assert all(isinstance(i, int) for seq in ids for i in seq)
    assert np.allclose(emb.embed_prepared(ids)[0], emb.embed(TEXTS), atol=1e-6)
    # the prompt changes the vectors, and the cache namespace with them
    bare = SentenceTransformerEmbedder(str(path), "fp32", "cpu", document_prompt="", query_prompt="")
    assert _min_cos(emb.embed(TEXTS), bare.embed(TEXTS)) < 0.999
    assert emb.cache_id != bare.cache_id == bare.model_id
    # a chunk leaves room for the prompt's tokens
    assert emb.prompt_tokens == 2 and emb.chunk_room == bare.chunk_room - 2  # passage, :
    assert chunker_for(Settings(), emb).max_tokens == emb.chunk_room


def test_a_passage_prompt_is_the_document_prompt(tmp_path):
    """e5's configuration names its document prompt "passage"; sentence-transformers 6's encode_document
    takes the empty "document" prompt it adds to every model instead: we take the configured one."""
    path = prompted_model(tmp_path / "m", {"query": "query: ", "passage": "passage: "})
    emb = SentenceTransformerEmbedder(str(path), "fp32", "cpu")
    assert emb.document_prompt == "passage: "
    assert _min_cos(emb.embed(TEXTS), emb.sentence_transformer.encode(TEXTS, prompt_name="passage")) >= 0.999


def test_overrides_and_the_default_prompt(tmp_path):
    path = prompted_model(tmp_path / "m", {"classification": "classify: ", "query": "q: "},
                          default_prompt_name="classification")
    emb = SentenceTransformerEmbedder(str(path), "fp32", "cpu")
    # the default prompt is not a document prompt (encode_document does not use it either)
    assert (emb.document_prompt, emb.query_prompt) == ("", "q: ")
    assert _min_cos(emb.embed(TEXTS), emb.sentence_transformer.encode_document(TEXTS)) >= 0.999
    mine = SentenceTransformerEmbedder(str(path), "fp32", "cpu", document_prompt="search_document: ",
                                       query_prompt="search_query: ")
    st = mine.sentence_transformer
    assert _min_cos(mine.embed(TEXTS), st.encode(TEXTS, prompt="search_document: ")) >= 0.999
    assert _min_cos(mine.embed_query(TEXTS), st.encode(TEXTS, prompt="search_query: ")) >= 0.999


def test_truncated_dimensions_are_the_leading_ones_renormalised(model):
    emb = SentenceTransformerEmbedder(None, "fp32", "cpu", truncate_dim=128)
    got = emb.embed(TEXTS)
    assert got.shape == (len(TEXTS), 128) and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert _min_cos(got, emb.sentence_transformer.encode_document(TEXTS, truncate_dim=128)) >= 0.999
    assert emb.cache_id.endswith("+dim-128")
    with pytest.raises(ConfigError, match="EMBEDSTREAM_TRUNCATE_DIM=1000"):
        SentenceTransformerEmbedder(str(packaged_model_path()), "fp32", "cpu", truncate_dim=1000)


def test_the_worker_embeds_with_the_document_prompt_and_search_with_the_query_prompt(stack, tmp_path):
    """On the real stack: Milvus holds encode_document's vectors, search ranks with encode_query's,
    the prompt keeps the cache apart, and a truncated dimension writes a collection of its own."""
    from connectors.kafka import make_producer
    from connectors.milvus import MilvusAdmin
    from schemas.codec import Document, encode_document
    from tests.faults.harness import run_worker
    from tests.helpers import documents_in_milvus, fresh_settings, run_cli, settings_env
    from worker.commands.search import search_documents

    path = prompted_model(tmp_path / "m", {"query": "query: ", "document": "passage: "})
    texts = {f"p-{i}": t for i, t in enumerate(
        [*TEXTS, "Compress data with the zlib algorithm.", "Send an e-mail message over SMTP."])}
    s = fresh_settings(stack, model=str(path), precision="fp32")
    producer = make_producer(s.kafka_common())
    for doc_id, text in texts.items():
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)))
    assert producer.flush(30) == 0
    res = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 from cache" in res.stderr  # the same texts embedded bare by other tests are not this model's

    emb = SentenceTransformerEmbedder(str(path), "fp32", "cpu")
    st = emb.sentence_transformer
    docs = documents_in_milvus(s)
    ids = sorted(docs)
    assert ids == sorted(texts)
    stored = np.array([docs[i][0]["vector"] for i in ids], dtype=np.float32)
    assert _min_cos(stored, st.encode_document([texts[i] for i in ids])) >= 0.999
    hits = search_documents(s, ["compress bytes with zlib"], top_k=2, embedder=emb)[0]
    assert hits[0]["id"] == "p-4"
    query = st.encode_query(["compress bytes with zlib"])[0]
    assert hits[0]["score"] == pytest.approx(float(query @ stored[ids.index("p-4")]), abs=2e-3)

    # 128 dimensions are another vector space: a collection of their own, the alias left where it is
    # (`migrate` moves it), and a search with them through the alias is refused, naming the dims
    store = MilvusAdmin(s.milvus_uri, s.milvus_collection)
    serving = store.alias_target(s.milvus_collection)
    env128 = {**settings_env(s), "EMBEDSTREAM_TRUNCATE_DIM": "128"}
    res = run_cli(["run", "--stop-when-idle", "1"], env128, timeout=300)
    assert res.returncode == 0 and "migrate" in res.stderr, res.stderr[-2000:]
    assert store.alias_target(s.milvus_collection) == serving
    assert len(store.collections(s.milvus_collection + "__")) == 4  # two spaces, each with its deletes
    store.close()
    res = run_cli(["search", "compress bytes with zlib"], env128, timeout=300)
    assert res.returncode == 1 and "384-dim" in res.stderr and "128" in res.stderr, res.stderr[-2000:]
