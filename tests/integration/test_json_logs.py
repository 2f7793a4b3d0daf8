"""With ``EMBEDSTREAM_LOG_FORMAT=json`` every line a worker writes is one JSON object with an ISO 8601
timestamp: its own lines, librdkafka's, and the line it ends with."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration


def _json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing was written"
    out = []
    for line in lines:
        obj = json.loads(line)  # raises on a line that is not JSON
        assert datetime.datetime.fromisoformat(obj["ts"]).utcoffset() is not None, obj
        out.append(obj)
    return out


def test_librdkafkas_lines_are_json_lines_too():
    script = textwrap.dedent("""
        from connectors.kafka import make_producer
        from worker.process.logs import setup_logging
        from worker.settings import Settings
        setup_logging(Settings(kafka_bootstrap_servers="127.0.0.1:1", log_format="json"))
        producer = make_producer({"bootstrap.servers": "127.0.0.1:1"}, 2.0)
        producer.produce("t", b"v")
        producer.flush(3)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    lines = _json_lines(done.stderr)
    assert any(o["logger"] == "librdkafka" and "Connect to" in o["message"] for o in lines)


def test_the_line_a_worker_ends_with_is_json():
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", EMBEDSTREAM_MILVUS_URI="http://127.0.0.1:1",
               EMBEDSTREAM_LOG_FORMAT="json")
    done = subprocess.run([sys.executable, "-m", "worker.commands.cli", "run"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    last = _json_lines(done.stdout + done.stderr)[-1]
    assert last["level"] == "ERROR" and "no Kafka broker answered" in last["message"]
