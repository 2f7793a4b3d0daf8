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
    assert env["EMBEDSTREAM_PROCESS_INDEX"] == "2"
    assert env["EMBEDSTREAM_GROUP_INSTANCE_ID"] == "pod-7-2"
    assert env["EMBEDSTREAM_KAFKA__SASL_PASSWORD"] == "s3cret" and env["EMBEDSTREAM_REDIS_URL"] == "redis://:pw@r:6379/0"
    # the child loads the same settings, but for the three that are its own
    from worker.settings import kafka_passthrough, passthrough

    child = Settings(_env_file=None, kafka=kafka_passthrough(env),
                     schema_registry=passthrough("EMBEDSTREAM_SCHEMA_REGISTRY__", env),
                     **{k[len("EMBEDSTREAM_"):].lower(): v for k, v in env.items()
                        if k.startswith("EMBEDSTREAM_") and "__" not in k})
    mine = {"processes", "metrics_port", "group_instance_id", "process_index"}
    assert child.process_index == 2
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


_SERVE = """
import http.server, os, sys
answers = {answers!r}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = answers.pop(0) if len(answers) > 1 else answers[0]
        self.send_response(code); self.end_headers(); self.wfile.write(b"x")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["EMBEDSTREAM_METRICS_PORT"])), H).serve_forever()
"""


def _free_ports(n: int) -> int:
    """A base port with the ``n`` ports from it free (bound and released: a small race, for a test)."""
    import socket

    for base in range(47000, 60000, 97):
        socks = []
        try:
            for i in range(n):
                sock = socket.socket()
                sock.bind(("127.0.0.1", base + i))
                socks.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free ports")


def test_a_child_whose_loop_stalls_stops_the_pod_though_the_probes_only_reach_process_0(monkeypatch):
    scripts = iter([_SERVE.format(answers=[200]), _SERVE.format(answers=[200, 200, 503]),
                    _SERVE.format(answers=[200])])
    monkeypatch.setattr("worker.process.processes.child_command", lambda _idle: [sys.executable, "-c", next(scripts)])
    s = _settings(shutdown_grace_seconds=5, metrics_port=_free_ports(3)).model_copy(update={"processes": 3})
    children = Processes(s, {}, health_interval_s=0.3)
    assert children.wait() == 1
    assert all(c.returncode is not None for c in children.children)  # every one stopped
    assert children._failures[1] == 3 and children._failures[0] == children._failures[2] == 0


def test_a_child_still_starting_is_not_judged(monkeypatch):
    from worker.process import processes

    monkeypatch.setattr(processes, "healthz", lambda port: False)  # nothing answers yet: loading the model
    monkeypatch.setattr("worker.process.processes.child_command",
                        lambda _idle: [sys.executable, "-c", "import time; time.sleep(1.5)"])
    children = Processes(_settings(metrics_port=9400).model_copy(update={"processes": 2}), {}, health_interval_s=0.1)
    assert children.wait() == 0 and children._failures == [0, 0]
