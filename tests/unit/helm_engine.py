"""Helm's engine for the chart tests, in a child process of its own.

``helm_python`` binds Helm's Go SDK through a C library, and loading it starts a Go runtime inside the
process that imports it. Inside the test process, which by the chart tests has loaded torch, OpenVINO
and librdkafka and started and stopped hundreds of threads, that runtime has crashed the whole run
with a bare segmentation fault at its first render (no Python traceback, the Go message lost in
pytest's captured stderr). Here the runtime lives in one long-lived child that answers JSON lines,
so the test process never loads it and a crash there fails the chart tests, not the suite.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import yaml

#: The child: one request per line on stdin ({"op": "render"|"lint", ...}), one answer per line on
#: stdout ({"ok": ...} or {"error": message}). Helm's own errors become answers; anything else kills
#: the child, which the parent reports.
_CHILD = r"""
import json, sys
import helm_python
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "render":
            chart = helm_python.Chart.load(req["chart"])
            out = chart.render(req["values"], name=req["name"], namespace=req["namespace"])
        else:
            out = helm_python.lint(req["chart"], req["values"], strict=req["strict"])
        answer = {"ok": out}
    except helm_python.HelmError as e:
        answer = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"""


class HelmError(Exception):
    """Helm refused the chart or its values (the child's ``helm_python.HelmError``, by its message)."""


def available() -> bool:
    """Whether ``helm_python`` is installed, found without importing it (importing starts Go here)."""
    return importlib.util.find_spec("helm_python") is not None


class Engine:
    """One child running Helm; ``render`` and ``lint`` as ``helm_python`` has them. Not thread-safe."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)

    def _ask(self, request: dict[str, Any]) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"Helm's child process died (exit {self._proc.wait()}) on {request['op']}")
        answer = json.loads(line)
        if "error" in answer:
            raise HelmError(answer["error"])
        return answer["ok"]

    def render(self, chart: str, values: dict, *, name: str, namespace: str) -> dict[str, str]:
        """Every rendered file by its path in the chart, as ``helm template`` writes them."""
        return self._ask({"op": "render", "chart": chart, "values": values, "name": name, "namespace": namespace})

    def lint(self, chart: str, values: dict, *, strict: bool = False) -> dict:
        """Helm's lint report: ``messages`` (each with ``severity``) and ``errors``."""
        return self._ask({"op": "lint", "chart": chart, "values": values, "strict": strict})

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def objects(files: dict[str, str]) -> dict[str, dict]:
    """The objects of rendered ``files`` by kind; the backlog exporter's under ``"<kind>/backlog"``."""
    objs = {}
    for name, text in files.items():
        if name.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                backlog = doc["metadata"]["name"].endswith("-backlog")
                objs[f"{doc['kind']}/backlog" if backlog else doc["kind"]] = doc
    return objs


def container_env(c: dict, value_from: Callable[[dict], str]) -> dict[str, str]:
    """A container's environment as the kubelet gives it: ``value_from(entry)`` for each entry without a
    value (a Secret's key, a field of the pod), ``$(VAR)`` references expanded."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        value = e.get("value")
        if value is None:
            value = value_from(e)
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), ""), str(value))
    return env


def release_values(s, **extra) -> dict:
    """The chart's values for a release on the stack of the settings ``s`` (its broker, topics, group,
    Milvus, and Redis through a Secret ``embedstream-redis``); ``extra``: more keys of each top-level
    value (``lagExporter={"interval": 2}``)."""
    values = {"kafka": {"bootstrapServers": s.kafka_bootstrap_servers, "inputTopic": s.input_topic,
                        "outputTopic": s.output_topic, "dlqTopic": s.dlq_topic, "groupId": s.group_id},
              "milvus": {"uri": s.milvus_uri, "collection": s.milvus_collection},
              "redis": {"enabled": True, "existingSecret": "embedstream-redis"}, "keda": {"checkCRDs": False}}
    for key, more in extra.items():
        values[key] = {**values.get(key, {}), **more}
    return values


def pod_command(obj: dict, secrets: dict[tuple[str, str], str], pod: str) -> tuple[list[str], dict[str, str]]:
    """The first container's args and env, as the kubelet gives them to the pod ``pod`` (of a
    Deployment's or a Job's template, or a Pod itself): ``secrets`` by (Secret, key)."""
    [c] = (obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"])["containers"]

    def value_from(e: dict) -> str:
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            return secrets[(ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])]
        assert ref["fieldRef"]["fieldPath"] == "metadata.name", ref
        return pod

    return list(c.get("args", [])), container_env(c, value_from)
