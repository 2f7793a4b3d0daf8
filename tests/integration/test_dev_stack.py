"""`embedstream dev`: one stack however often `up` runs, ports freed by `down`, clear start-up errors."""

from __future__ import annotations

import os
import socket

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.helpers import run_cli
from tools.dev import LocalStack

pytestmark = pytest.mark.integration


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}


def _parse(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.strip().splitlines())


def _port_free(port: int) -> bool:
    """Nothing listens on ``port``: a server could bind it (SO_REUSEADDR, as servers set it: Kafka
    closes its clients' connections as it stops, and the port keeps them in TIME_WAIT a while)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _cleanup_policies(bootstrap: str, topics: list[str]) -> dict[str, str | None]:
    """Each topic's ``cleanup.policy`` (None where the broker reports none); the client is closed after."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    out = {}
    for topic in topics:
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        config = admin.describe_configs([res])[res].result(10)
        out[topic] = config["cleanup.policy"].value if "cleanup.policy" in config else None
    del admin
    return out


def test_up_twice_is_one_stack_and_down_frees_ports(tmp_path):
    state = str(tmp_path / "st")
    first = run_cli(["dev", "up", "--state-dir", state, "--partitions", "2"], _env(), timeout=120)
    assert first.returncode == 0, first.stderr
    env = _parse(first.stdout)
    assert set(env) >= {"EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS", "EMBEDSTREAM_REDIS_URL", "EMBEDSTREAM_MILVUS_URI",
                        "EMBEDSTREAM_SCHEMA_REGISTRY_URL"}
    pids = {n: p["pid"] for n, p in LocalStack(state).status().items()}
    try:
        second = run_cli(["dev", "up", "--state-dir", state], _env(), timeout=120)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        assert _parse(second.stdout) == env
        assert {n: p["pid"] for n, p in LocalStack(state).status().items()} == pids
        status = run_cli(["dev", "status", "--state-dir", state], _env())
        assert status.returncode == 0 and status.stdout.count("running") == 4
        assert _parse(run_cli(["dev", "env", "--state-dir", state], _env()).stdout) == env
        # the input topic is compacted (what a migration replays); the others keep the broker's default
        policy = _cleanup_policies(env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"], ["documents", "embeddings"])
        assert policy["documents"] == "compact" and policy["embeddings"] in (None, "delete")
    finally:
        down = run_cli(["dev", "down", "--state-dir", state], _env())
    assert down.returncode == 0
    ports = [int(v.rsplit(":", 1)[1].split("/")[0]) for k, v in env.items()
             if k in ("EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS", "EMBEDSTREAM_REDIS_URL", "EMBEDSTREAM_MILVUS_URI",
                      "EMBEDSTREAM_SCHEMA_REGISTRY_URL")]
    assert all(_port_free(p) for p in ports)
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert run_cli(["dev", "status", "--state-dir", state], _env()).returncode == 1


def test_a_part_that_cannot_start_is_named(tmp_path):
    env = _env()
    env["CALF_TANSU_BIN"] = "/bin/false"  # the broker binary exits at once
    res = run_cli(["dev", "up", "--state-dir", str(tmp_path / "st")], env, timeout=120)
    assert res.returncode != 0
    assert "broker" in res.stderr and "log" in res.stderr
    assert LocalStack(tmp_path / "st").status() == {}  # the parts that did start were stopped


def test_busy_port_is_refused_with_its_name(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        res = run_cli(["dev", "up", "--state-dir", str(tmp_path / "st"), "--redis-port", str(busy)], _env())
    assert res.returncode != 0
    assert "redis" in res.stderr and str(busy) in res.stderr


def test_up_with_apache_kafka_serves_transactions_and_topic_ids(local_stack, tmp_path):
    """`dev up --broker kafka`: Apache Kafka (KRaft) from Maven's jars, with the three topics, the
    input compacted, transactions and topic ids; `status` names it; `down` stops it. The suite's own
    stack is one (``tests/conftest.py`` starts it through the code of `dev up`): it is read through
    `dev env` and `dev status` and left up; on a suite run on another broker, one is started here and
    stopped."""
    from confluent_kafka import Producer

    from connectors.kafka import topic_ids

    session, _ = local_stack
    own = session.broker_kind() != "kafka"
    state = str(tmp_path / "kafka") if own else str(session.state_dir)
    if own:
        up = run_cli(["dev", "up", "--broker", "kafka", "--state-dir", state, "--partitions", "2"], _env(),
                     timeout=300)
        assert up.returncode == 0, up.stderr
        env = _parse(up.stdout)
    else:
        again = run_cli(["dev", "up", "--broker", "kafka", "--state-dir", state], _env(), timeout=60)
        assert again.returncode == 0 and "already running" in again.stderr, again.stderr
        env = _parse(run_cli(["dev", "env", "--state-dir", state], _env()).stdout)
        assert env == _parse(again.stdout)
    bootstrap = env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"]
    try:
        status = run_cli(["dev", "status", "--state-dir", state], _env())
        assert status.returncode == 0 and "broker (kafka)" in status.stdout, status.stdout
        assert "kafka.Kafka" in " ".join(LocalStack(state).parts()["broker"].cmd)
        assert _cleanup_policies(bootstrap, ["documents", "embeddings"]) == {"documents": "compact",
                                                                           "embeddings": "delete"}
        assert set(topic_ids({"bootstrap.servers": bootstrap}, ["documents", "embeddings", "documents.dlq"])) == {
            "documents", "embeddings", "documents.dlq"}
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"dev-stack-probe-{tmp_path.name}"})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("embeddings", b"x")
        p.commit_transaction(30)
    finally:
        if own:
            down = run_cli(["dev", "down", "--state-dir", state], _env(), timeout=60)
    if own:
        assert down.returncode == 0 and "broker" in down.stderr
        assert _port_free(int(bootstrap.rsplit(":", 1)[1]))
