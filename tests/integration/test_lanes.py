"""Live first, end to end: `embedstream run` with a backfill lane busy on a backlog, and live records
produced one by one meanwhile; the process's /metrics keep the live lane's series its own. Each live
record reaches the output topic within a bound that a backfill holding the model for a whole group
could not keep: the lane is given batches as large as the live lane's (``EMBEDSTREAM_BACKFILL_SHARE=1``),
and a gate that let it embed a group a turn kept live records waiting 4-7 s here; the gate's turns
(a batch into the model at a time, sized to a short hold, only while the live lane is idle) keep
them at 0.13-0.42 s."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from schemas.codec import Document, decode_embedding, encode_document
from tests.faults.harness import WorkerProcess, metric_samples, scrape, wait_until
from tests.helpers import fresh_settings, read_topic
from tools.bench.measure import commit_at_end
from tools.corpus import sample_documents
from tools.derived_models import projected_model

pytestmark = [pytest.mark.integration, pytest.mark.alone]  # it times live records: nothing beside it

#: The longest a live record may take from its produce to the output topic while the backfill works.
#: Alone, a single record takes about 0.2-0.3 s here (the 100 ms batch deadline, one forward pass,
#: one Milvus upsert); one backfill batch of the live lane's size holds the model for seconds.
LIVE_BOUND_S = 1.5
LIVE_RECORDS = 8


def _backfill_documents(port: int, live_model: str) -> float:
    """Documents the backfill lane has embedded so far (its model's count on the process's /metrics)."""
    return sum(s.value for s in metric_samples(port)
               if s.name == "embedstream_model_documents_total" and s.labels.get("model") != live_model)


def _live_outputs(s, live_model: str, keys: set[str]) -> dict:
    """The live model's record for each of ``keys`` on the output topic, read until all are there (the
    live records still on their way count as not yet there, whatever else the topic holds)."""
    found: dict = {}

    def all_in() -> bool:
        for m in read_topic(s, s.output_topic):
            if m.key().decode() in keys and decode_embedding(m.value())["model"] == live_model:
                found.setdefault(m.key().decode(), m)
        return set(found) == keys

    wait_until(all_in, 60, every=0.5, what="every live record on the output topic")
    return found


def test_a_live_record_produced_while_the_backfill_is_busy_reaches_the_output_within_a_bound(stack, model, tmp_path):
    s = fresh_settings(stack, partitions=2, precision="fp32")
    backlog = sample_documents(1500, prefix="old")
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5})
    for doc in backlog:
        producer.produce(s.input_topic, key=doc.id, value=encode_document(doc))
    assert producer.flush(30) == 0, "the backlog was not all delivered"
    commit_at_end(s)  # the live group has consumed the backlog: the backfill reads it from the start
    new_path = str(projected_model(tmp_path / "new-model", dim=model.dim))
    worker = WorkerProcess(s, tmp_path, "lanes", EMBEDSTREAM_BACKFILL_MODEL=new_path, EMBEDSTREAM_BACKFILL_SHARE="1",
                           EMBEDSTREAM_METRICS_PORT="auto")
    port = worker.metrics_port()
    wait_until(lambda: _backfill_documents(port, model.model_id) > 0, 120, what="the backfill to embed")
    before = _backfill_documents(port, model.model_id)

    sent: dict[str, float] = {}
    for i in range(LIVE_RECORDS):
        doc = Document(f"live-{i}", f"a live record, number {i}, produced while the backfill works")
        sent[doc.id] = time.time()
        producer.produce(s.input_topic, key=doc.id, value=encode_document(doc))
        producer.flush(10)
        time.sleep(0.4)
    out = _live_outputs(s, model.model_id, set(sent))
    # The backfill writes its collection only: the output topic's readers see the live model alone.
    others = [(m.key(), decode_embedding(m.value())["model"]) for m in read_topic(s, s.output_topic)
              if m.key().decode() not in sent]
    after = _backfill_documents(port, model.model_id)
    # The backfill goes on after them (it counts its documents a group at a time, so this waits for the
    # next group): it was mid-backlog throughout, neither finished nor starved.
    wait_until(lambda: _backfill_documents(port, model.model_id) > after, 120, what="the backfill to go on")
    # The member's series on the process's /metrics are the live lane's alone, the backfill's documents
    # only under their model's label.
    live_series = (scrape(port, "embedstream_messages_total", outcome="embedded"),
                   scrape(port, "embedstream_end_to_end_seconds_count"))
    worker.terminate()
    assert worker.wait(120) == 0, worker.log()[-3000:]

    assert set(out) == set(sent), sorted(out)
    assert others == [], others[:10]
    waited = {key: round(out[key].timestamp()[1] / 1000 - at, 3) for key, at in sent.items()}
    assert 0 < before <= after < len(backlog), (before, after)
    print("live records' seconds to the output:", waited)
    assert max(waited.values()) <= LIVE_BOUND_S, waited
    assert live_series == (LIVE_RECORDS, LIVE_RECORDS), live_series
