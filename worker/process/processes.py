"""Several worker processes of one consumer group in one pod: ``embedstream run --processes N``.

One Python process cannot keep a GPU busy (the GIL serialises the polling, embed and sink threads'
Python work, and a forward pass waits for the previous group's records); N processes on one GPU can.
Partitions are already the unit of parallelism, so each process is a plain worker of the group,
given its partitions by the group's assignor: nothing is shared between them but the GPU.

This module starts them and watches them:

* each child runs ``embedstream run`` with the parent's settings, passed as ``EMBEDSTREAM_*``
  variables (:meth:`Settings.environment`), except ``processes`` (1), the metrics port (the parent's
  + i; 0 stays 0) and the static member id (``<id>-<i>``: two members may not share one);
* with several GPUs listed in ``CUDA_VISIBLE_DEVICES`` (the chart lists a pod's), each child sees one
  of them, in turn, so ``gpu.count x workersPerGpu`` processes spread over every GPU the pod asked for;
* SIGTERM / SIGINT are forwarded to every child, which stops as a single worker does;
* when a child exits non-zero the others are stopped (SIGTERM, then SIGKILL after the grace) and the
  parent exits with that child's code, so the orchestrator restarts the pod; when every child exits
  0 (``--stop-when-idle``, or a stop) the parent exits 0;
* the pod's probes reach process 0's port only, so the parent asks every child's ``/healthz`` itself
  (its port: the metrics port + i): a child that answered once and then fails it (its poll loop
  stalled, or no answer at all) for ``HEALTH_FAILURES`` asks in a row is stalled; the parent stops
  them all and exits 1, and the pod restarts as a failed liveness probe would restart it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping

from worker.settings import Settings

log = logging.getLogger(__name__)

#: How often the parent looks at its children.
WATCH_INTERVAL_S = 0.2
#: How often it asks each child's /healthz, and how many failed asks in a row make a child stalled.
HEALTH_INTERVAL_S = 10.0
HEALTH_FAILURES = 3


def child_environment(s: Settings, index: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of child ``index``: ``base`` without its ``EMBEDSTREAM_*`` variables, then the
    settings of ``s`` for one process (the module doc)."""
    env = {k: v for k, v in base.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(s.environment())
    env["EMBEDSTREAM_PROCESSES"] = "1"
    env["EMBEDSTREAM_PROCESS_INDEX"] = str(index)
    port = s.metrics_port
    env["EMBEDSTREAM_METRICS_PORT"] = "auto" if port == "auto" else str(port + index) if port else "0"
    if s.group_instance_id:
        env["EMBEDSTREAM_GROUP_INSTANCE_ID"] = f"{s.group_instance_id}-{index}"
    devices = [d.strip() for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(devices) > 1:  # several GPUs: each process one of them, in turn (the chart lists the pod's)
        env["CUDA_VISIBLE_DEVICES"] = devices[index % len(devices)]
    return env


def child_command(stop_when_idle: float | None) -> list[str]:
    return [sys.executable, "-m", "worker.commands.cli", "run",
            *([] if stop_when_idle is None else ["--stop-when-idle", str(stop_when_idle)])]


class Processes:
    """The children of one ``run --processes N``; ``wait()`` returns the exit code of the whole."""

    def __init__(self, s: Settings, base_env: Mapping[str, str], stop_when_idle: float | None = None,
                 health_interval_s: float = HEALTH_INTERVAL_S) -> None:
        self.grace_s = s.shutdown_grace_seconds
        self.children = [subprocess.Popen(child_command(stop_when_idle), env=child_environment(s, i, base_env))
                         for i in range(s.processes)]
        port = s.metrics_port
        #: Each child's /healthz port (none when the metrics are off, or on ports the system picks).
        self.health_ports = [port + i for i in range(s.processes)] if isinstance(port, int) and port else []
        self.health_interval_s = health_interval_s
        self._answered = [False] * s.processes
        self._failures = [0] * s.processes
        log.info("started %d worker processes: pids %s", len(self.children), [c.pid for c in self.children])

    def forward_signals(self) -> None:
        """SIGTERM and SIGINT to the parent go to every child."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.signal(signum))

    def signal(self, signum: int) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    def wait(self) -> int:
        """Block until every child has exited 0 (returns 0), or one failed (stops the others; returns
        its code), or one stalled (stops them all; returns 1)."""
        next_health = time.monotonic() + self.health_interval_s
        while True:
            if self.health_ports and time.monotonic() >= next_health:
                next_health = time.monotonic() + self.health_interval_s
                stalled = self._stalled()
                if stalled is not None:
                    log.error("worker process %d (pid %d) failed /healthz %d times in a row (its loop stalled): "
                              "stopping every process so that the pod restarts", stalled, self.children[stalled].pid,
                              HEALTH_FAILURES)
                    self.stop()
                    return 1
            codes = [c.poll() for c in self.children]
            failed = [(i, code) for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                index, code = failed[0]
                code = code if code > 0 else 128 - code  # killed by a signal: the shell's convention
                log.error("worker process %d (pid %d) exited with code %d: stopping the others", index,
                          self.children[index].pid, code)
                self.stop()
                return code
            if all(code == 0 for code in codes):
                return 0
            time.sleep(WATCH_INTERVAL_S)

    def _stalled(self) -> int | None:
        """Ask each running child's /healthz once; the index of one that answered before and has now
        failed :data:`HEALTH_FAILURES` asks in a row (a child still starting is never judged)."""
        for i, (child, port) in enumerate(zip(self.children, self.health_ports)):
            if child.poll() is not None:
                continue
            if healthz(port):
                self._answered[i], self._failures[i] = True, 0
            elif self._answered[i]:
                self._failures[i] += 1
                if self._failures[i] >= HEALTH_FAILURES:
                    return i
        return None

    def stop(self) -> None:
        """SIGTERM to the children still running; SIGKILL to those still there after the grace."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child in self.children:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def healthz(port: int, timeout: float = 2.0) -> bool:
    """Whether the worker serving metrics on ``port`` answers its /healthz with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as answer:
            return answer.status == 200
    except (OSError, ValueError):  # refused, timed out, or an HTTP error status (urllib's HTTPError)
        return False
