"""The bench's instant source: the whole worker fed from memory, writing nowhere."""

from __future__ import annotations

from tools.bench.measure import memory_stream
from tools.fake_embedder import FakeEmbedder
from worker.settings import Settings


def test_the_worker_fed_from_memory_embeds_every_document():
    texts = [f"document number {i} " + "word " * (i % 50) for i in range(3000)]
    s = Settings(metrics_port=0, max_batch_size=128)
    res = memory_stream(s, FakeEmbedder(), texts, "mem", partitions=4)
    assert res.docs == 3000 and res.seconds > 0 and res.docs_per_s > 0
    assert res.cached == 0 and res.cpu_run_seconds > 0
