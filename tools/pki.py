"""A private CA for tests: the CA, a server certificate for 127.0.0.1 and localhost, and a client
certificate, each signed by that CA (EC P-256, valid two days). Used where a test puts TLS in front
of a real server (Apache Kafka's SASL_SSL listener, Milvus behind a TLS terminator)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    #: The CA's certificate (what a client or server is told to trust).
    ca: Path
    #: The server's key (unencrypted PKCS#8), then its certificate chain, in one file.
    server: Path
    #: The client's certificate chain and its key, in files of their own (as most clients take them).
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, client: str = "embedstream-client") -> Pki:
    """Write a CA, a server and a client (common name ``client``) under ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def cert(subject: str, key, issuer_key, *, ca: bool = False, usage=None, hosts: bool = False):
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name("embedstream test CA"))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    pem = serialization.Encoding.PEM

    def key_bytes(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("embedstream test CA", ca_key, ca_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = cert("localhost", server_key, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH, hosts=True)
    user = cert(client, client_key, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    out = Pki(directory / "ca.pem", directory / "server.pem", directory / "client.pem", directory / "client-key.pem")
    out.ca.write_bytes(ca_cert.public_bytes(pem))
    out.server.write_bytes(key_bytes(server_key) + server.public_bytes(pem) + ca_cert.public_bytes(pem))
    out.client_cert.write_bytes(user.public_bytes(pem) + ca_cert.public_bytes(pem))
    out.client_key.write_bytes(key_bytes(client_key))
    return out
