"""Helpers shared by the integration tests: fresh topics per test, reading topics back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from connectors.kafka import create_topics, make_admin
from worker.settings import Settings

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "worker.cli"]


class CountingModel:
    """A model that counts the texts reaching it, in front of the real one (the cache tests)."""

    def __init__(self, model) -> None:
        self._model = model
        self.texts = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def embed(self, texts):
        self.texts += len(texts)
        return self._model.embed(texts)


def fresh_settings(env: dict[str, str], partitions: int = 6, **overrides) -> Settings:
    """Settings pointing at the local stack with new topics, group and collection for one test."""
    tag = uuid.uuid4().hex[:8]
    values = dict(
        kafka_bootstrap_servers=env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=env["EMBEDSTREAM_REDIS_URL"],
        milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
        kafka={"session.timeout.ms": env["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"]},
        input_topic=f"docs-{tag}",
        output_topic=f"emb-{tag}",
        dlq_topic=f"dlq-{tag}",
        group_id=f"grp-{tag}",
        milvus_collection=f"c_{tag}",
        metrics_port=0,
    )
    s = Settings(**{**values, **overrides})
    create_topics(make_admin(s.kafka_common()), [s.input_topic, s.output_topic, s.dlq_topic], partitions)
    return s


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that makes a subprocess `embedstream` see the same settings as ``s``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    for name, value in s.model_dump().items():
        if value is None or name == "kafka":
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"EMBEDSTREAM_{name.upper()}"] = str(value)
    for prop, value in s.kafka.items():
        env["EMBEDSTREAM_KAFKA__" + prop.replace(".", "_").upper()] = str(value)
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kw)


def read_topic(s: Settings, topic: str, expect: int | None = None, idle: float = 3.0,
               deadline: float = 60.0) -> list:
    """Every message of ``topic`` from the beginning: stops once ``expect`` messages were read (then
    waits ``idle`` more seconds for extras), or after ``idle`` seconds with nothing new."""
    c = Consumer({**s.kafka_common(), "group.id": f"reader-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "enable.partition.eof": False})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    out = []
    end = time.monotonic() + deadline
    last = time.monotonic()
    try:
        while time.monotonic() < end:
            msgs = c.consume(500, 0.2)
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(m.error())
                    continue
                out.append(m)
            if msgs:
                last = time.monotonic()
            if time.monotonic() - last > idle and (expect is None or len(out) >= expect):
                break
            if expect is not None and len(out) >= expect and time.monotonic() - last > min(idle, 1.0):
                break
    finally:
        c.close()
    return out
