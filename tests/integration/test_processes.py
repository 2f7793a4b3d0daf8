"""`run --processes 2` on the real stack: two workers of one group split the partitions, and every
document lands once, at its newest version."""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import committed_total, wait_until
from tests.helpers import CLI, REPO, documents_in_milvus, fresh_settings, read_topic, settings_env
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration


def test_two_processes_share_the_partitions_and_write_each_document_once(stack, tmp_path):
    s = fresh_settings(stack, partitions=4, processes=2, kafka={
        "session.timeout.ms": stack["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"]})
    # Both processes hold partitions before the documents come (else the first to join drains them all
    # and the other embeds nothing): the pod's parent is stopped by SIGTERM once all is committed.
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*CLI, "run"], env={**settings_env(s), "EMBEDSTREAM_LOG_FORMAT": "json"}, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)

    def lines() -> list[dict]:  # one JSON object a line, each naming the process that wrote it
        out = []
        for line in log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    try:
        def owners() -> int:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            held: dict[int, set[int]] = {}  # each process's partitions (cooperative: increments)
            for line in lines():
                found = re.match(r"(assigned|revoked|lost) \[([\d, ]*)\]", line.get("message", ""))
                if found:
                    parts = {int(p) for p in re.findall(r"\d+", found.group(2))}
                    mine = held.setdefault(line["process"], set())
                    if found.group(1) == "assigned":
                        mine |= parts
                    else:
                        mine -= parts
            return sum(1 for parts in held.values() if parts)
        wait_until(lambda: owners() == 2, 180, what="both processes to hold partitions")
        producer = make_producer(s.kafka_common())
        docs = [Document(f"doc-{i}", f"document {i} about subject {i % 37}") for i in range(400)]
        for d in docs:
            producer.produce(s.input_topic, key=d.id, value=encode_document(d))
        # a newer version of some: the newest must win
        for d in docs[:50]:
            producer.produce(s.input_topic, key=d.id, value=encode_document(Document(d.id, d.text + " (edited)")))
        assert producer.flush(30) == 0
        wait_until(lambda: committed_total(s, 4) >= 450, 300, what="every record committed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    messages = [line.get("message", "") for line in lines()]
    assert any("started 2 worker processes" in m for m in messages), messages[-20:]
    embedded = [int(n) for m in messages for n in re.findall(r"^done: (\d+) embedded", m)]
    assert len(embedded) == 2 and all(n > 0 for n in embedded), f"one process did all the work: {embedded}"

    milvus = documents_in_milvus(s)
    assert set(milvus) == {d.id for d in docs}
    assert all(len(chunks) == 1 for chunks in milvus.values())
    newest = {d.id: d.text for d in docs} | {d.id: d.text + " (edited)" for d in docs[:50]}
    assert {i: chunks[0]["content_hash"] for i, chunks in milvus.items()} == \
        {i: content_hash(normalise_text(t)) for i, t in newest.items()}
    out = read_topic(s, s.output_topic, expect=450)
    assert {m.key().decode() for m in out} == {d.id for d in docs}
