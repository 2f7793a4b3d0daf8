"""A pod as a process: the closest this machine gets to `helm install`.

The chart is rendered by Helm's engine for the local stack (its broker, Milvus and Redis), and each
rendered container's args run as `embedstream` with the container's env as the kubelet would give it:
Secrets filled from the stack, the pod's name for its field, ``$(VAR)`` references expanded. What a
cluster would add and this leaves out: the image (the checkout's worker runs), mounted volumes (none of
these releases mounts one), the network namespace (each process gets a free port where the pod would
have its own: the metrics port, the exporter's port), probes, KEDA and the scheduler.

- The default release: its lag exporter serves the group's lag before any worker runs (what the lag
  alerts read at zero replicas), its worker embeds what is produced into Milvus and the output topic,
  the exporter then reads 0, and both stop on SIGTERM with exit 0.
- A share release: the backlog exporter answers ``/backlog`` with what was produced, the worker drains
  it, the exporter then reads 0.
- The migration Job: `migrate --model <a new model>` runs to its end (exit 0) and moves the alias.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from connectors.kafka import make_producer
from connectors.milvus import MilvusAdmin
from schemas.codec import Document, encode_document
from tests.helpers import REPO, documents_in_milvus, fresh_settings, missing_tool, read_topic
from tests.unit.helm_engine import Engine, available, objects, pod_command, release_values
from tools.dev import free_port

pytestmark = pytest.mark.integration

if not available():
    missing_tool("the chart's pods need Helm's engine, helm_python (the dev extra's helm-python-sdk): `make setup` "
                 "installs it", module=True)

CHART = REPO / "helm" / "embedstream"


@pytest.fixture(scope="module")
def helm():
    engine = Engine()
    yield engine
    engine.close()


def _render(helm, values: dict) -> dict[str, dict]:
    return objects(helm.render(str(CHART), values, name="es", namespace="ml"))


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``embedstream <args>`` with exactly the pod's env (plus what a process needs to start here)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env = {**base, **env, "HF_HUB_OFFLINE": "1"}
    if "EMBEDSTREAM_METRICS_PORT" in env:  # a pod has its own network namespace; processes here share one
        env["EMBEDSTREAM_METRICS_PORT"] = str(free_port())
    return subprocess.Popen([sys.executable, "-m", "worker.commands.cli", *args], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _until(check, seconds: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        assert proc.poll() is None, f"exited {proc.returncode} while waiting for {what}: {log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds:.0f} s: {what}\n{log.read_text()[-3000:]}")


def _produce(s, n: int, prefix: str) -> set[str]:
    producer = make_producer(s.kafka_common())
    for i in range(n):
        d = Document(f"{prefix}{i}", f"a document the pod embeds, number {i}")
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    assert producer.flush(30) == 0
    return {f"{prefix}{i}" for i in range(n)}


def _in_milvus(s) -> set[str]:
    """The document ids in Milvus; none before the worker has made its collection."""
    from schemas.errors import TransientError

    try:
        return set(documents_in_milvus(s))
    except TransientError:
        return set()


def _exporter(objs: dict, secrets: dict, log: Path) -> tuple[subprocess.Popen, int]:
    """The rendered backlog exporter (``Deployment/backlog``) started, on a free port in place of the
    pod's own; returns it and that port."""
    args, env = pod_command(objs["Deployment/backlog"], secrets, "es-embedstream-backlog-6f9d8-k2m4p")
    port = free_port()
    args = [str(port) if a == str(objs["Service/backlog"]["spec"]["ports"][0]["port"]) else a for a in args]
    assert args[:2] == ["lag", "--serve"]
    return _start(args, env, log), port


def _served(port: int, path: str, key: str | None = None):
    """``path`` of the exporter: its JSON's ``key``, or the text where no key is given; None while it
    does not answer 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            body = reply.read().decode()
    except OSError:
        return None
    return json.loads(body)[key] if key else body


def _stop(proc: subprocess.Popen, log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, log.read_text()[-3000:]


def test_the_default_release_s_worker_and_the_migration_job_run_as_their_pods_would(helm, stack, tmp_path):
    from tools.derived_models import projected_model

    s = fresh_settings(stack, partitions=2, compacted_input=True)  # what `migrate` re-reads
    secrets = {("embedstream-redis", "url"): stack["EMBEDSTREAM_REDIS_URL"]}
    objs = _render(helm, release_values(s, lagExporter={"interval": 2}))
    args, env = pod_command(objs["Deployment"], secrets, "es-embedstream-5d8c7-abcde")
    assert args == ["run"] and env["EMBEDSTREAM_REDIS_URL"] == stack["EMBEDSTREAM_REDIS_URL"]
    ids = _produce(s, 12, "pod")
    log, elog = tmp_path / "worker.log", tmp_path / "exporter.log"
    exporter, port = _exporter(objs, secrets, elog)
    worker = None
    total = f'embedstream_group_topic_lag{{group="{s.group_id}",topic="{s.input_topic}"}}'
    try:
        # no worker yet (a release at zero replicas): the group never committed, so under the chart's
        # earliest every record produced is lag, and the alerts' series says so
        _until(lambda: _served(port, "/lag", "total_lag") == len(ids), 120, "the exporter's lag to read what was "
               "produced", exporter, elog)
        assert f"{total} 12.0" in _served(port, "/metrics")
        worker = _start(args, env, log)
        _until(lambda: _in_milvus(s) == ids, 180, "the documents in Milvus", worker, log)
        assert {m.key().decode() for m in read_topic(s, s.output_topic, expect=len(ids))} == ids
        _until(lambda: _served(port, "/lag", "total_lag") == 0, 120, "the lag to drain to 0", exporter, elog)
        assert f"{total} 0.0" in _served(port, "/metrics")
    finally:
        for proc, plog in ((worker, log), (exporter, elog)):
            if proc is not None and proc.poll() is None:
                _stop(proc, plog)

    before = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30).alias_target(s.milvus_collection)
    new_model = projected_model(tmp_path / "new-model", dim=128)
    objs = _render(helm, release_values(s, migration={"model": str(new_model)}))
    [job] = [obj for kind, obj in objs.items() if kind.startswith("Job")]
    args, env = pod_command(job, secrets, "es-embedstream-migrate-0a1b2c3d-xyz12")
    assert args[:3] == ["migrate", "--model", str(new_model)]
    log = tmp_path / "migrate.log"
    migrate = _start(args, env, log)
    assert migrate.wait(300) == 0, log.read_text()[-3000:]
    after = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30).alias_target(s.milvus_collection)
    assert before is not None and after not in (None, before), (before, after)  # the alias moved
    assert set(documents_in_milvus(s)) == ids  # read through the alias, from the new model's collection


def test_a_share_release_s_exporter_and_worker_run_as_their_pods_would(helm, stack, tmp_path):
    s = fresh_settings(stack, partitions=1)
    secrets = {("embedstream-redis", "url"): stack["EMBEDSTREAM_REDIS_URL"]}
    objs = _render(helm, release_values(s, kafka={"groupType": "share"}))
    ids = _produce(s, 10, "share")
    elog, wlog = tmp_path / "exporter.log", tmp_path / "worker.log"
    exporter, port = _exporter(objs, secrets, elog)
    worker = None
    try:
        def backlog() -> int | None:
            return _served(port, "/backlog", "backlog")

        _until(lambda: backlog() == len(ids), 120, "the exporter's backlog to read what was produced", exporter,
               elog)
        wargs, wenv = pod_command(objs["Deployment"], secrets, "es-embedstream-7b6c5-q8r9s")
        assert wenv["EMBEDSTREAM_GROUP_TYPE"] == "share"
        worker = _start(wargs, wenv, wlog)
        _until(lambda: _in_milvus(s) == ids, 180, "the documents in Milvus", worker, wlog)
        _until(lambda: backlog() == 0, 120, "the backlog to drain to 0", exporter, elog)
    finally:
        for proc, log in ((worker, wlog), (exporter, elog)):
            if proc is not None and proc.poll() is None:
                _stop(proc, log)


def test_helm_test_s_pod_passes_on_a_working_release_and_names_what_is_wrong_on_a_broken_one(helm, stack, tmp_path):
    """`helm test`: its pod's command, with the pod's env, exits 0 against the local stack; with a
    broker address nobody listens on it exits 2 and says which part failed."""
    s = fresh_settings(stack, partitions=2)
    secrets = {("embedstream-redis", "url"): stack["EMBEDSTREAM_REDIS_URL"]}
    args, env = pod_command(_render(helm, release_values(s))["Pod"], secrets, "es-embedstream-check")
    assert args == ["run", "--check"]
    log = tmp_path / "check.log"
    check = _start(args, env, log)
    assert check.wait(180) == 0, log.read_text()[-3000:]
    table = log.read_text()
    assert all(re.search(rf"{part}\W+ok", table) for part in ("kafka", "topics", "model", "milvus", "redis")), table
    broken = release_values(s, kafka={"bootstrapServers": f"127.0.0.1:{free_port()}"})
    args, env = pod_command(_render(helm, broken)["Pod"], secrets, "es-embedstream-check")
    check = _start(args, {**env, "EMBEDSTREAM_KAFKA__SOCKET_CONNECTION_SETUP_TIMEOUT_MS": "3000"}, log)
    assert check.wait(180) == 2, log.read_text()[-3000:]
    assert re.search(r"kafka\W+fail", log.read_text()), log.read_text()[-3000:]
