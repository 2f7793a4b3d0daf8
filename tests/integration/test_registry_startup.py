"""The schema registry's start-up paths through `embedstream run`: credentials the registry refuses
(exit 2 and one line), an output subject that holds an incompatible schema (exit 2 and one line
naming it), and a registry that is down at start-up (the output schema is registered on the first
write once it answers; nothing is dead-lettered meanwhile).

Each test runs its own registry (``tools.registry``, with HTTP basic authentication where asked),
so what it holds and when it answers are the test's."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from connectors.kafka import make_producer
from connectors.registry import schema_id
from schemas.codec import Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import CLI, REPO, fresh_settings, read_topic, settings_env
from tools.registry import make_server

pytestmark = pytest.mark.integration


def _registry(port: int = 0, basic_auth: str | None = None):
    server = make_server(port, None, basic_auth=basic_auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _produce(s, n: int, prefix: str) -> None:
    producer = make_producer(s.kafka_common())
    for i in range(n):
        doc = Document(f"{prefix}-{i}", f"document {i} of {prefix}")
        producer.produce(s.input_topic, key=doc.id, value=encode_document(doc))
    assert producer.flush(30) == 0


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_refused_credentials_stop_the_start_with_one_line(stack):
    server = _registry(basic_auth="embed:right")
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        s = fresh_settings(stack, partitions=1, schema_registry_url=url, output_format="avro-registry",
                           schema_registry={"basic.auth.user.info": "embed:wrong"})
        _produce(s, 3, "auth")
        res = run_worker(s, "--stop-when-idle", "2", timeout=180)
        assert res.returncode == 2, res.stderr[-3000:]
        line = _last_line(res.stderr)
        assert "refused our credentials" in line and "BASIC_AUTH_USER_INFO" in line, line
        assert "Traceback" not in res.stderr

        good = s.model_copy(update={"schema_registry": {"basic.auth.user.info": "embed:right"}})
        res = run_worker(good, "--stop-when-idle", "2", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        out = read_topic(s, s.output_topic, expect=3)
        assert {schema_id(m.value()) for m in out} == {1}, "the output is framed with the registered schema's id"
    finally:
        server.shutdown()


def test_an_incompatible_output_subject_stops_the_start_naming_it(stack):
    server = _registry()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        s = fresh_settings(stack, partitions=1, schema_registry_url=url, output_format="avro-registry")
        other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}
        SchemaRegistryClient({"url": url}).register_schema(f"{s.output_topic}-value", Schema(json.dumps(other), "AVRO"))
        _produce(s, 3, "incompatible")
        res = run_worker(s, "--stop-when-idle", "2", timeout=180)
        assert res.returncode == 2, res.stderr[-3000:]
        line = _last_line(res.stderr)
        assert f"{s.output_topic}-value" in line and "not compatible" in line, line
        assert "Traceback" not in res.stderr
        assert read_topic(s, s.output_topic, idle=1.0) == [], "nothing is written under a schema it could not register"
    finally:
        server.shutdown()


def test_a_registry_down_at_start_up_gets_the_schema_on_the_first_write(stack, tmp_path):
    """The registry's port answers nothing when the worker starts; the records wait (never
    dead-lettered) and go out framed once the registry is started there."""
    probe = _registry()  # a free port, then nothing listening on it
    port = probe.server_port
    probe.shutdown()
    probe.server_close()
    s = fresh_settings(stack, partitions=1, schema_registry_url=f"http://127.0.0.1:{port}",
                       output_format="avro-registry")
    _produce(s, 5, "late")
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*CLI, "run", "--stop-when-idle", "3"], env=settings_env(s), cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
    server = None
    try:
        deadline = time.monotonic() + 120
        while "will be registered once it answers" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        # the records reached the sink, which holds them for the registry (and says so when it retries)
        while "(nothing committed meanwhile)" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert read_topic(s, s.output_topic, idle=0.5) == []
        server = _registry(port)
        assert proc.wait(180) == 0, log_path.read_text()[-3000:]
        out = read_topic(s, s.output_topic, expect=5)
        assert len(out) == 5 and {schema_id(m.value()) for m in out} == {1}
        assert read_topic(s, s.dlq_topic, idle=0.5) == [], "a registry outage dead-lettered records"
        assert SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"}).get_subjects() == [f"{s.output_topic}-value"]
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None:
            server.shutdown()
