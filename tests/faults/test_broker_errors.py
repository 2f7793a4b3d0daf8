"""Scenario 2, second half: broker request errors and a broker down, on librdkafka's mock cluster
(the local broker cannot inject them). While delivery fails, no commit may advance."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from prometheus_client import REGISTRY

from schemas.codec import decode_embedding
from tests.faults.harness import committed_offsets, committed_total, short_docs, wait_until
from tests.helpers import read_topic
from tools.mock_broker import MockCluster
from worker.commands.produce import document_record, produce_records
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PRODUCE = 0
NOT_ENOUGH_REPLICAS = 19  # retriable


@pytest.fixture()
def mock_settings(fault_stack):
    _, env = fault_stack
    with MockCluster() as mc:
        tag = uuid.uuid4().hex[:6]
        s = Settings(kafka_bootstrap_servers=mc.bootstraps, milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
                     redis_url=env["EMBEDSTREAM_REDIS_URL"], kafka={"session.timeout.ms": "6000"},
                     input_topic=f"in-{tag}", output_topic=f"out-{tag}", dlq_topic=f"dlq-{tag}",
                     group_id=f"g-{tag}", milvus_collection=f"mock_{tag}", metrics_port=0, max_batch_size=25,
                     commit_interval_ms=0, kafka_timeout_seconds=3, retry_backoff_max_seconds=1)
        for t in (s.input_topic, s.output_topic, s.dlq_topic):
            mc.create_topic(t, 2)
        yield mc, s


def _run_in_thread(s, model, idle: float = 3.0):
    from worker.assembly.runner import build_worker

    worker = build_worker(s, embedder=model)
    result = {}
    thread = threading.Thread(target=lambda: result.update(stats=worker.run(stop_when_idle=idle)))
    thread.start()
    return worker, thread, result


def _retries() -> float:
    return REGISTRY.get_sample_value("embedstream_retries_total", {"system": "kafka"}) or 0.0


def test_produce_errors_hold_commits_back(mock_settings, model):
    mc, s = mock_settings
    docs = short_docs(150, "perr")
    produce_records(s.kafka_common(), s.input_topic, (document_record(d) for d in docs), delivery_timeout_s=10)
    retries_before = _retries()
    mc.push_request_errors(PRODUCE, [NOT_ENOUGH_REPLICAS] * 60)
    worker, thread, result = _run_in_thread(s, model)
    wait_until(lambda: _retries() > retries_before, 60, what="a failed delivery to be retried")
    assert committed_total(s, 2) == 0, "an offset was committed while deliveries were failing"
    thread.join(240)
    assert not thread.is_alive()
    assert result["stats"].embedded == 150
    assert committed_total(s, 2) == 150
    out = read_topic(s, s.output_topic, expect=150)
    assert {m.key().decode() for m in out} == {d.id for d in docs}


class _Paced:
    """The real model, slowed to 0.5 s a batch so the stream spans the outage."""

    def __init__(self, model) -> None:
        self._m = model

    def __getattr__(self, name):
        return getattr(self._m, name)

    def embed(self, texts):
        time.sleep(0.5)
        return self._m.embed(texts)

    def embed_prepared(self, prepared):  # the worker's call
        time.sleep(0.5)
        return self._m.embed_prepared(prepared)


def test_broker_down_mid_stream(mock_settings, model):
    mc, s = mock_settings
    docs = short_docs(400, "bdown")
    produce_records(s.kafka_common(), s.input_topic, (document_record(d) for d in docs), delivery_timeout_s=10)
    worker, thread, result = _run_in_thread(s, _Paced(model), idle=5.0)
    wait_until(lambda: committed_total(s, 2) >= 75, 120, what="the first batches committed")
    retries_before = _retries()
    mc.broker_down(1)
    time.sleep(8)
    assert _retries() > retries_before, "the worker never met the outage"
    mc.broker_up(1)
    # the first commits the broker tells after the outage never run ahead of the output topic, on
    # any partition: every input offset under a partition's committed one has its output record
    committed_after = committed_offsets(s, 2)
    written: dict[int, set[int]] = {}
    for m in read_topic(s, s.output_topic, idle=0.5):
        r = decode_embedding(m.value())
        written.setdefault(r["source_partition"], set()).add(r["source_offset"])
    for p, offset in committed_after.items():
        missing = set(range(offset)) - written.get(p, set())
        assert not missing, f"partition {p} committed to {offset} with {len(missing)} offsets not on the output topic"
    assert sum(committed_after.values()) < 400, "the stream ended before the outage: it proved nothing"
    thread.join(240)
    assert not thread.is_alive()
    assert committed_total(s, 2) == 400
    out = read_topic(s, s.output_topic, expect=400)
    assert {m.key().decode() for m in out} == {d.id for d in docs}
