"""Precision int8: the packaged model exported to ONNX and quantized once, cached, gated against fp32,
and run by the worker on the real stack."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from worker.embedding import int8
from worker.embedding.forward import largest_shapes

# onnxruntime comes with the dev extra (embedstream[int8]): a checkout without it fails here, not skips.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache_home():
    """The session's model cache (tests/conftest.py: shared by every test and session, one export)."""
    return Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture(scope="module")
def int8_model(cache_home):
    from worker.embedding.sentence import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(None, "int8", "cpu")


@pytest.fixture(scope="module")
def fp32_model():
    from worker.embedding.sentence import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(None, "fp32", "cpu")


def test_the_export_is_cached_gated_and_close_to_fp32(int8_model, fp32_model, cache_home):
    from tools.corpus import sample_documents
    from tools.derived_models import packaged_model_path
    from worker.core.records import normalise_text
    from worker.embedding import int8
    from worker.embedding.sentence import SentenceTransformerEmbedder

    engine = int8.engine()
    folder = cache_home / "embedstream" / "int8" / int8.model_key(packaged_model_path(), engine)
    exported = [folder / int8.FILES[engine]]
    # one model, one export, and OpenVINO's compiled copy of it beside them
    files = {"openvino": ["compiled", "export.json", "model-int8.bin", "model-int8.xml", "model.onnx"],
             "onnxruntime": ["export.json", "model-int8.onnx", "model.onnx"]}[engine]
    assert sorted(p.name for p in folder.iterdir()) == files
    assert not list(folder.parent.glob(f"{folder.name}.tmp-*"))  # no half-written export left
    assert int8_model.int8_quality.passes
    assert int8_model.cache_id.endswith("+int8") and not fp32_model.cache_id.endswith("+int8")

    texts = [normalise_text(d.text)[:2000] for d in sample_documents(200, prefix="q")]
    got, ref = int8_model.embed(texts), fp32_model.embed(texts)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cos = (got * ref).sum(1)
    print(f"int8 vs fp32 on {len(texts)} docstrings: mean {cos.mean():.4f} min {cos.min():.4f}")
    assert cos.mean() >= int8.MIN_MEAN_COSINE and cos.min() >= int8.MIN_COSINE

    # a second start reuses the export (same file, not rewritten) and computes the same vectors for the
    # same batch. Across batches they may differ a little: onnxruntime quantizes activations with one
    # range per tensor, so a text's companions in its forward pass move its vector (OpenVINO's ranges
    # are fixed at calibration; only the padding differs).
    mtime = exported[0].stat().st_mtime_ns
    again = SentenceTransformerEmbedder(None, "int8", "cpu")
    assert exported[0].stat().st_mtime_ns == mtime
    assert np.allclose(again.embed(texts[:20]), int8_model.embed(texts[:20]), atol=1e-6)
    across = (again.embed(texts[:20]) * got[:20]).sum(1)
    print(f"the same texts in other batches: cosine min {across.min():.4f}")
    assert across.min() >= int8.MIN_COSINE


def test_the_worker_runs_int8_on_the_real_stack(stack, int8_model, fp32_model):
    from connectors.kafka import make_producer
    from schemas.codec import Document, encode_document
    from tests.helpers import documents_in_milvus, fresh_settings
    from worker.assembly.runner import build_worker

    s = fresh_settings(stack, precision="int8")
    texts = {f"i8-{i}": f"Item {i}: the worker embeds this sentence with an int8 model." for i in range(30)}
    producer = make_producer(s.kafka_common())
    for doc_id, text in texts.items():
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)))
    assert producer.flush(30) == 0
    stats = build_worker(s, embedder=int8_model).run(stop_when_idle=2.0)
    assert stats.done == len(texts)
    docs = documents_in_milvus(s)
    ids = sorted(docs)
    assert ids == sorted(texts)
    stored = np.array([docs[i][0]["vector"] for i in ids], dtype=np.float32)
    ref = fp32_model.embed([texts[i] for i in ids])
    assert (stored * ref).sum(1).min() >= int8.MIN_COSINE


def test_the_bench_s_raw_encode_runs_the_int8_model(int8_model, fp32_model):
    from tools.bench import measure
    from tools.corpus import sample_documents

    texts = [d.text[:1000] for d in sample_documents(40, prefix="r")]
    st = int8_model.sentence_transformer
    with measure.library_encode_at_int8(int8_model):
        library = st.encode(texts, normalize_embeddings=True)
    assert (library * int8_model.embed(texts)).sum(1).min() > 0.999  # the same int8 model, batched its way
    assert "forward" not in vars(st[0])  # torch's transformer again once closed
    torch_fp32 = st.encode(texts, normalize_embeddings=True)
    assert (torch_fp32 * fp32_model.embed(texts)).sum(1).min() > 0.999
    with measure.library_encode_at_int8(fp32_model):  # nothing to swap at other precisions
        assert "forward" not in vars(fp32_model.sentence_transformer[0])


def test_the_int8_warmup_runs_the_largest_forward_passes_once(int8_model, fp32_model):
    from tools.bench.measure import model_tokens

    before = model_tokens()[1]  # padded tokens through the models so far
    fp32_model.warmup()
    small = model_tokens()[1] - before
    assert small < 10  # one short text
    before = model_tokens()[1]
    int8_model.warmup()
    forward = int8_model.forward
    shapes = largest_shapes(forward.tokens.max_seq_length, forward.sub_batch_size, forward.sub_batch_tokens)
    assert shapes == [(16, 256), (128, 32)]  # the packaged model's: 256 tokens, 4,096 a pass, 128 texts
    assert model_tokens()[1] - before == small + sum(count * length for count, length in shapes)


def test_a_model_derived_by_a_projection_shares_its_bases_export(tmp_path):
    """The bench's and the tests' second model is MiniLM plus a projection: the same transformer,
    so one int8 export serves both (an export is ~20 s on this host)."""
    from tools.derived_models import packaged_model_path, projected_model

    derived = projected_model(tmp_path / "proj")
    assert (derived / "2_Dense").is_dir()
    assert int8.model_key(derived) == int8.model_key(packaged_model_path())
