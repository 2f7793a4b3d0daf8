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

import datetime
import ipaddress
import subprocess
import time
from pathlib import Path

from tools.dev import free_port
from tools.kafka_broker import _LOG4J2, HEAP, cluster_id, java_bin, kafka_classpath, server_properties

ADMIN = ("admin", "admin-pw-0")


def _pem_pair(directory: Path) -> tuple[Path, Path]:
    """A CA and a server certificate for 127.0.0.1 and localhost signed by it: ``(ca.pem, server.pem)``
    (the server file holds its key, unencrypted PKCS#8, then its certificate chain)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer_name, issuer_key, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "embedstream test CA")])
    ca_cert = cert("embedstream test CA", ca_key, ca_name, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = cert("localhost", key, ca_name, ca_key, False)
    pem = serialization.Encoding.PEM
    ca_path, server_path = directory / "ca.pem", directory / "server.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    server_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
                            + server.public_bytes(pem) + ca_cert.public_bytes(pem))
    return ca_path, server_path


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
        self.ca, server_pem = _pem_pair(self.dir)
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
