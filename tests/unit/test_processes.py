"""`run --processes N`: what each child is told, and how the parent ends."""

from __future__ import annotations

import sys

from worker.process.processes import Processes, child_environment
from worker.settings import Settings


def _settings(**kw) -> Settings:
    return Settings(kafka_bootstrap_servers="b:9092", milvus_uri="http://m:19530", redis_url="redis://:pw@r:6379/0",
                    kafka={"sasl.password": "s3cret", "session.timeout.ms": "6000"}, processes=4, **kw)


def test_each_child_gets_the_parents_settings_for_one_process_and_its_own_port_and_member_id():
    s = _settings(group_instance_id="pod-7", metrics_port=9400, max_batch_size=1024)
    env = child_environment(s, 2, {"PATH": "/bin", "EMBEDSTREAM_MODEL": "stale-from-the-parent-env"})
    assert env["PATH"] == "/bin" and "EMBEDSTREAM_MODEL" not in env
    assert env["EMBEDSTREAM_PROCESSES"] == "1" and env["EMBEDSTREAM_METRICS_PORT"] == "9402"
    assert env["EMBEDSTREAM_GROUP_INSTANCE_ID"] == "pod-7-2"
    assert env["EMBEDSTREAM_KAFKA__SASL_PASSWORD"] == "s3cret" and env["EMBEDSTREAM_REDIS_URL"] == "redis://:pw@r:6379/0"
    # the child loads the same settings, but for the three that are its own
    from worker.settings import kafka_passthrough, passthrough

    child = Settings(_env_file=None, kafka=kafka_passthrough(env),
                     schema_registry=passthrough("EMBEDSTREAM_SCHEMA_REGISTRY__", env),
                     **{k[len("EMBEDSTREAM_"):].lower(): v for k, v in env.items()
                        if k.startswith("EMBEDSTREAM_") and "__" not in k})
    mine = {"processes", "metrics_port", "group_instance_id"}
    assert {k: v for k, v in child.model_dump().items() if k not in mine} == \
        {k: v for k, v in s.model_dump().items() if k not in mine}


def test_metrics_off_stays_off_and_no_member_id_is_made_up():
    env = child_environment(_settings(metrics_port=0), 3, {})
    assert env["EMBEDSTREAM_METRICS_PORT"] == "0" and "EMBEDSTREAM_GROUP_INSTANCE_ID" not in env
    assert child_environment(_settings(metrics_port="auto"), 3, {})["EMBEDSTREAM_METRICS_PORT"] == "auto"


def test_a_failing_child_stops_the_others_and_its_code_is_the_parents(monkeypatch):
    scripts = iter(["import time; time.sleep(60)", "import sys; sys.exit(3)", "import time; time.sleep(60)"])
    monkeypatch.setattr("worker.process.processes.child_command", lambda _idle: [sys.executable, "-c", next(scripts)])
    children = Processes(_settings(shutdown_grace_seconds=5).model_copy(update={"processes": 3}), {})
    assert children.wait() == 3
    assert [c.returncode for c in children.children] == [-15, 3, -15]  # SIGTERM'd


def test_every_child_done_is_a_clean_exit(monkeypatch):
    monkeypatch.setattr("worker.process.processes.child_command", lambda _idle: [sys.executable, "-c", "pass"])
    assert Processes(_settings(), {}).wait() == 0


def test_several_gpus_are_shared_out_one_a_process_in_turn():
    s = _settings(metrics_port=9400)
    devices = [child_environment(s, i, {"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] for i in range(4)]
    assert devices == ["0", "1", "0", "1"]
    assert child_environment(s, 3, {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == "1"  # one: as given
    assert "CUDA_VISIBLE_DEVICES" not in child_environment(s, 1, {})
