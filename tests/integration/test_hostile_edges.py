"""A producer's worst records, through `embedstream run` on the real stack (Apache Kafka, the Milvus
server, Redis, the real model, the development registry): none can wipe, stall or stop the worker.

Phase one writes ordinary documents. Phase two sends, among as many more ordinary ones: ids with each
character a filter expression treats specially (embedded, one of them updated and one deleted), a
tombstone keyed as a Milvus expression that once deleted every row, a JSON integer of 5,000 digits
(it crash-looped the worker), a string of escaped quotes built for the old nesting check (96 KB held
the polling thread a minute; here 96 KB and 900 KB), an event time Avro cannot carry, metadata over
Milvus' 64 KB of JSON, a registry writer schema whose array holds items of no bytes, and a bad record
that forges the worker's own dead-letter header. Every ordinary document ends in Milvus, every odd id
under its exact id, every hostile record in the DLQ with its reason; both runs exit 0, and through the
second the worker's liveness probe never fails with its loop held for ``STALL_S`` (what a stall
looks like to Kubernetes: the pod restarted, the record met again).
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import WorkerProcess, run_worker
from tests.helpers import ask, documents_in_milvus, fresh_settings, read_topic, registry_serializer
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration

#: Ids a producer may choose, each embedded under exactly itself.
ODD_IDS = ["o'brien", "back\\slash", 'quote"double', "new\nline", "cr\rret", "nul\x00byte", "ünïcødé 文字 😀",
           "tab\tid", "$meta", "a\\nb"]
CRAFTED = "a'] or id not in ['"  # as a tombstone's key, pasted into "id in ['…']": every row
#: /healthz fails once the loop has not turned for this long (EMBEDSTREAM_HEALTHZ_MAX_TICK_AGE_SECONDS;
#: 60 s by default): the hostile run is watched with a tighter probe than a pod's.
STALL_S = 10


def _json(doc_id: str, text: str, **extra) -> bytes:
    return json.dumps({"id": doc_id, "text": text, **extra}).encode()


def _backtracking(size: int) -> bytes:
    head = b'{"id": "k", "text": "'
    return head + b'\\"' * ((size - len(head) - 101) // 2) + b"[" * 101


def _run_watching_liveness(s, folder) -> tuple[int, str, Counter, float]:
    """`embedstream run --stop-when-idle 0.5` with /healthz failing past ``STALL_S`` of loop age, its
    /healthz asked every 0.1 s from its first ready answer (the model loaded, partitions assigned) to
    its exit: (exit status, log, the answers by status, the longest time between two answers of 200;
    a thread that holds the interpreter starves the probe's server too, so a stall may show as no
    answer rather than as 503)."""
    w = WorkerProcess(s, folder, "hostile", ("--stop-when-idle", "0.5"), EMBEDSTREAM_METRICS_PORT="auto",
                      EMBEDSTREAM_HEALTHZ_MAX_TICK_AGE_SECONDS=str(STALL_S))
    try:
        port = w.metrics_port()
        ready, answers, last_ok, silence = False, Counter(), 0.0, 0.0
        while w.proc.poll() is None:
            if ready:
                status = ask(port, "/healthz")
                answers[status] += 1
                if status == 200:
                    now = time.monotonic()
                    silence, last_ok = max(silence, now - last_ok), now
            else:
                ready = ask(port, "/readyz") == 200
                last_ok = time.monotonic()
            time.sleep(0.1)
        return w.wait(60), w.log(), answers, silence
    finally:
        WorkerProcess.kill_all()


@pytest.mark.guarantee
def test_no_record_a_producer_writes_can_wipe_stall_or_stop_the_worker(stack, tmp_path):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    url = stack["EMBEDSTREAM_SCHEMA_REGISTRY_URL"]
    s = fresh_settings(stack, partitions=2, schema_registry_url=url)
    producer = make_producer(s.kafka_common())

    def send(key: str, value: bytes | None, headers=None) -> None:
        producer.produce(s.input_topic, key=key.encode(), value=value, headers=headers)

    first = [Document(f"plain-{i}", f"an ordinary document about topic {i}") for i in range(60)]
    for d in first:
        send(d.id, encode_document(d))
    assert producer.flush(30) == 0
    t0 = time.monotonic()
    clean = run_worker(s, "--stop-when-idle", "0.5", timeout=600)
    clean_s = time.monotonic() - t0
    assert clean.returncode == 0, clean.stderr[-3000:]

    # -- phase two: the hostile records among as many ordinary ones --------------------------------
    second = [Document(f"later-{i}", f"another ordinary document, number {i}") for i in range(60)]
    for d in second[:30]:
        send(d.id, encode_document(d))
    for i, odd in enumerate(ODD_IDS):
        send(odd, encode_document(Document(odd, f"a document with an odd id, {i}")))
    send(CRAFTED, None)
    send(ODD_IDS[0], encode_document(Document(ODD_IDS[0], "the odd id's second version")))
    send(ODD_IDS[1], None)
    dead = {  # key → (value, the reason the contract gives it)
        "huge-int": (_json("huge-int", "t")[:-1] + b', "event_time": ' + b"9" * 5_000 + b"}", "decode_error"),
        "backtrack-96k": (_backtracking(96_000), "decode_error"),
        "backtrack-900k": (_backtracking(900_000), "decode_error"),
        "wide-time": (_json("wide-time", "t", event_time=2**70), "decode_error"),
        "fat-meta": (_json("fat-meta", "t", metadata={"blob": "m" * 70_000}), "metadata_too_large"),
    }
    empty_items = json.dumps({"type": "record", "name": "Doc", "fields": [
        {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
        {"name": "pad", "type": {"type": "array", "items": "null"}, "default": []}]})
    honest = registry_serializer(SchemaRegistryClient({"url": url}), empty_items, s.input_topic)(
        {"id": "empty-items", "text": "t", "pad": []})
    dead["empty-items"] = (honest[:-1] + bytes([0xFE, *[0xFF] * 7, 0x7F]) + b"\x00", "incompatible_schema")
    for key, (value, _) in dead.items():
        send(key, value)
    send("forged", b"{not json", headers=[("embedstream.error.reason", b"empty_text")])
    dead["forged"] = (b"{not json", "decode_error")
    for d in second[30:]:
        send(d.id, encode_document(d))
    assert producer.flush(30) == 0
    t0 = time.monotonic()
    code, log, answers, silence = _run_watching_liveness(s, tmp_path)
    hostile_s = time.monotonic() - t0
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "stalled" not in log, log[-3000:]
    assert answers[503] == 0 and answers[200] > 0, f"/healthz answers by status: {dict(answers)}"
    assert silence < STALL_S, f"/healthz went {silence:.1f} s without a healthy answer: {dict(answers)}"

    docs = documents_in_milvus(s)
    ordinary = {d.id for d in first + second}
    assert ordinary <= set(docs), f"ordinary documents missing: {sorted(ordinary - set(docs))[:5]}"
    assert set(docs) == ordinary | (set(ODD_IDS) - {ODD_IDS[1]}), sorted(set(docs) - ordinary)
    assert docs[ODD_IDS[0]][0]["content_hash"] == content_hash(normalise_text("the odd id's second version"))
    by_key: dict[str, list] = {}
    for m in read_topic(s, s.dlq_topic, expect=len(dead)):
        by_key.setdefault(m.key().decode("utf-8", "replace"), []).append(m)
    assert {k: dict(ms[-1].headers())["embedstream.error.reason"].decode() for k, ms in by_key.items()} == \
        {k: reason for k, (_, reason) in dead.items()}
    assert all(by_key[k][-1].value() == value for k, (value, _) in dead.items())
    forged = dict(by_key["forged"][-1].headers())
    assert forged["embedstream.original.error.reason"] == b"empty_text"
    assert [v for k, v in by_key["forged"][-1].headers() if k == "embedstream.error.reason"] == [b"decode_error"]
    print(f"\nhostile edges: clean run {clean_s:.1f}s (60 documents), hostile run {hostile_s:.1f}s "
          f"(60 documents, {len(ODD_IDS)} odd ids, 3 tombstones, {len(dead)} hostile records, ~1 MB of them); "
          f"/healthz answers {dict(answers)}, at most {silence:.1f}s apart")
