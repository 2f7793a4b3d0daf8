"""Apache Kafka with its doors shut, for tests: SASL_SSL with a private CA, and its authorizer on.

One KRaft node of the project's pinned release (``tools.kafka_broker``'s jars) whose client listener is
``SASL_SSL`` (PLAIN users listed in the broker's configuration; the server's certificate signed by a CA
made here, which clients must be told of), with ``StandardAuthorizer`` and no access where no ACL
grants it. The broker and its controller talk over a loopback ``PLAINTEXT`` listener of their own as
the super user ``ANONYMOUS``; ``admin`` is the clients' super user. Used by the tests of what a platform
team's Kafka asks of the worker: a wrong password or an untrusted certificate said as such, and the
ACLs each mode needs.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tools.dev import free_port
from tools.kafka_broker import _LOG4J2, HEAP, cluster_id, java_bin, kafka_classpath, server_properties
from tools.pki import make_pki

ADMIN = ("admin", "admin-pw-0")


class SecureKafka:
    """``with SecureKafka(dir, users={"alice": "pw"}) as k:`` a running node; ``k.client(user)`` the
    librdkafka properties of a client logged in as ``user``, ``k.admin_conf`` the super user's."""

    def __init__(self, directory: Path, users: dict[str, str]) -> None:
        self.dir = Path(directory)
        self.users = {ADMIN[0]: ADMIN[1], **users}
        self.port = free_port()
        self._internal, self._controller = free_port(), free_port()
        self._proc: subprocess.Popen | None = None
        self.ca: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, user: str, password: str | None = None, ca: Path | None | bool = True) -> dict[str, str]:
        """Properties of a client logged in as ``user`` (its own password unless ``password``), trusting
        the node's CA (``ca``: True; another CA file; or False: the system's CAs only)."""
        conf = {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                "sasl.username": user, "sasl.password": password if password is not None else self.users[user]}
        if ca is True:
            conf["ssl.ca.location"] = str(self.ca)
        elif ca:
            conf["ssl.ca.location"] = str(ca)
        return conf

    @property
    def admin_conf(self) -> dict[str, str]:
        return self.client(ADMIN[0])

    def _properties(self, data: Path, server_pem: Path) -> str:
        base = server_properties(data, self._internal, self._controller)
        users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN[0]}" '
                f'password="{ADMIN[1]}" {users};')
        secured = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self._internal},SASL_SSL://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self._controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self._internal},SASL_SSL://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(server_pem),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN[0]};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }
        lines = [line for line in base.splitlines() if line.split("=", 1)[0] not in secured]
        return "\n".join([*lines, *(f"{k}={v}" for k, v in secured.items())]) + "\n"

    def __enter__(self) -> SecureKafka:
        self.dir.mkdir(parents=True, exist_ok=True)
        pki = make_pki(self.dir)
        self.ca, server_pem = pki.ca, pki.server
        data = self.dir / "data"
        props, log4j = self.dir / "server.properties", self.dir / "log4j2.properties"
        props.write_text(self._properties(data, server_pem))
        log4j.write_text(_LOG4J2.format(log=self.dir / "server.log"))
        java, classpath = java_bin(), kafka_classpath()
        flags = [java, *HEAP, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        subprocess.run([*flags, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(props)],
                       check=True, capture_output=True, timeout=120)
        self._proc = subprocess.Popen([*flags, "-XX:+UseSerialGC", "kafka.Kafka", str(props)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 90.0) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.admin_conf)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"the secured broker exited: {(self.dir / 'server.log').read_text()[-3000:]}")
            try:
                admin.list_topics(timeout=2)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("the secured broker did not answer in time") from None

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
