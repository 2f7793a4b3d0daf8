"""The few Kafka requests confluent-kafka does not send, spoken over a socket of our own.

confluent-kafka 2.16 has no call for a share group's offsets (``DescribeShareGroupOffsets``, KIP-932),
so :mod:`connectors.share_backlog` sends it itself. This module owns the framing: a request header
(v1 for the SASL requests, v2 for flexible ones), the two encodings (classic and compact, with
tagged fields), and a connection that authenticates the way the worker's librdkafka properties say:

- ``security.protocol``: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``;
- ``sasl.mechanism``: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` with ``sasl.username`` /
  ``sasl.password`` (OAUTHBEARER is refused with what to do);
- ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, or the same inline
  (``ssl.ca.pem``, ``ssl.certificate.pem``, ``ssl.key.pem``), ``ssl.key.password``,
  ``ssl.endpoint.identification.algorithm`` (``none`` turns host name checks off).

A broker's answers are bounded as input: a length prefix past ``MAX_RESPONSE_BYTES`` and a SCRAM
iteration count outside Kafka's own bounds are refused. Every failure is :class:`WireError` with a
sentence that says what happened.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import ssl
import struct
import tempfile
from collections.abc import Mapping

#: Mechanisms this client can authenticate with.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_ID = "embedstream-backlog"


#: The largest answer read from a broker: FindCoordinator and DescribeShareGroupOffsets answers are a
#: few KB (a length prefix of 2 GB would otherwise be buffered whole).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: The SCRAM iteration counts accepted: Kafka's own bounds for its SCRAM credentials (a broker asking
#: for 2^31 would hold the reader's CPU for hours).
SCRAM_ITERATIONS = (4096, 16384)

class WireError(RuntimeError):
    """A request could not be sent or answered; the message says why. ``retriable``: the broker may
    answer if asked again shortly (a coordinator moving or loading)."""

    def __init__(self, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class Writer:
    """Encodes one request body: classic fields (``string``) and compact ones (``compact_*``)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> Writer:
        self.buf += struct.pack(">b", v)
        return self

    def int16(self, v: int) -> Writer:
        self.buf += struct.pack(">h", v)
        return self

    def int32(self, v: int) -> Writer:
        self.buf += struct.pack(">i", v)
        return self

    def uvarint(self, v: int) -> Writer:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)
        return self

    def string(self, s: str | None) -> Writer:
        if s is None:
            return self.int16(-1)
        raw = s.encode()
        self.int16(len(raw))
        self.buf += raw
        return self

    def bytes32(self, b: bytes) -> Writer:
        self.int32(len(b))
        self.buf += b
        return self

    def compact_string(self, s: str | None) -> Writer:
        if s is None:
            return self.uvarint(0)
        raw = s.encode()
        self.uvarint(len(raw) + 1)
        self.buf += raw
        return self

    def compact_len(self, n: int | None) -> Writer:
        """An array's length, compact (``None``: a null array)."""
        return self.uvarint(0 if n is None else n + 1)

    def tags(self) -> Writer:
        return self.uvarint(0)  # no tagged fields


class Reader:
    """Decodes a response body in the order its schema lists the fields."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _take(self, fmt: str) -> int:
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def int8(self) -> int:
        return self._take(">b")

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def raw(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self.raw(n).decode()

    def bytes32(self) -> bytes:
        n = self.int32()
        return b"" if n < 0 else self.raw(n)

    def compact_string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1).decode()

    def compact_len(self) -> int:
        """An array's length, compact (a null array reads as empty)."""
        return max(self.uvarint() - 1, 0)

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.raw(self.uvarint())


def _ssl_context(props: Mapping[str, str]) -> ssl.SSLContext:
    """The TLS context librdkafka's ``ssl.*`` properties describe: files (``*.location``) or inline PEM
    (``*.pem``), as the worker's own clients take them."""
    ctx = ssl.create_default_context(cafile=props.get("ssl.ca.location") or None,
                                     cadata=props.get("ssl.ca.pem") or None)
    password = props.get("ssl.key.password") or None
    if props.get("ssl.certificate.location"):
        ctx.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location") or None, password)
    elif props.get("ssl.certificate.pem"):
        # the ssl module loads a chain from files only: a private directory for the moment it reads them
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            for path, text in ((cert, props["ssl.certificate.pem"]), (key, props.get("ssl.key.pem") or "")):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                    f.write(text)
            ctx.load_cert_chain(cert, key if props.get("ssl.key.pem") else None, password)
    if str(props.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        ctx.check_hostname = False
    return ctx


def check_supported(props: Mapping[str, str]) -> None:
    """Raise :class:`WireError` for security settings this client cannot speak, with what to do."""
    protocol = str(props.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise WireError(f"security.protocol {protocol!r} is unknown: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    if protocol.startswith("SASL"):
        mechanism = str(props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI").upper()
        if mechanism not in MECHANISMS:
            raise WireError(f"the share group's backlog is read with SASL {', '.join(MECHANISMS)}; this cluster "
                            f"uses {mechanism}: give the backlog reader a user of one of those, or scale on "
                            "CPU (keda.enabled=false, hpa.enabled=true)")


class Connection:
    """One authenticated connection to one broker; :meth:`call` sends a request and returns its body."""

    def __init__(self, host: str, port: int, props: Mapping[str, str], timeout: float = 10.0) -> None:
        check_supported(props)
        self.props, self._correlation = props, 0
        protocol = str(props.get("security.protocol", "PLAINTEXT")).upper()
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if protocol in ("SSL", "SASL_SSL"):
                sock = _ssl_context(props).wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError) as exc:
            raise WireError(f"could not reach the broker at {host}:{port} ({exc})") from None
        self.sock = sock
        if protocol.startswith("SASL"):
            self._authenticate()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, api_key: int, version: int, body: bytes, flexible: bool = True) -> Reader:
        """Send one request (header v2 when ``flexible``, else v1) and return the response body,
        past its header (v1 or v0 to match)."""
        self._correlation += 1
        header = Writer().int16(api_key).int16(version).int32(self._correlation).string(CLIENT_ID)
        if flexible:
            header.tags()
        frame = bytes(header.buf) + body
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", self._recv(4))[0]
            if not 0 <= size <= MAX_RESPONSE_BYTES:
                raise WireError(f"the broker's answer to request {api_key} v{version} claims {size:,} bytes, past "
                                f"the {MAX_RESPONSE_BYTES:,} this client reads")
            reply = Reader(self._recv(size))
        except (OSError, struct.error) as exc:
            raise WireError(f"the broker closed the connection on request {api_key} v{version} ({exc or 'closed'}): "
                            "it may not support it (share groups need Apache Kafka 4.2 or later)") from None
        if reply.int32() != self._correlation:
            raise WireError("the broker answered another request than the one sent")
        if flexible:
            reply.tags()
        return reply

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise OSError("connection closed")
            out += chunk
        return bytes(out)

    def _authenticate(self) -> None:
        props = self.props
        mechanism = str(props.get("sasl.mechanism") or props.get("sasl.mechanisms")).upper()
        reply = self.call(17, 1, bytes(Writer().string(mechanism).buf), flexible=False)  # SaslHandshake
        if (code := reply.int16()) != 0:
            raise WireError(f"the broker refused SASL {mechanism} (error {code})")
        user, password = str(props.get("sasl.username", "")), str(props.get("sasl.password", ""))
        if mechanism == "PLAIN":
            self._sasl_step(f"\0{user}\0{password}".encode())
            return
        scram = Scram(mechanism, user, password)
        server_first = self._sasl_step(scram.client_first())
        server_final = self._sasl_step(scram.client_final(server_first))
        scram.verify(server_final)

    def _sasl_step(self, token: bytes) -> bytes:
        reply = self.call(36, 1, bytes(Writer().bytes32(token).buf), flexible=False)  # SaslAuthenticate
        code, message = reply.int16(), reply.string()
        if code != 0:
            raise WireError(f"SASL authentication failed: {message or f'error {code}'}: check sasl.username and "
                            "sasl.password")
        return reply.bytes32()


class Scram:
    """The client side of SCRAM (RFC 5802) for ``SCRAM-SHA-256`` and ``SCRAM-SHA-512``."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        self.hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.user = user.replace("=", "=3D").replace(",", "=2C")
        self.password = password.encode()
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n={self.user},r={self.nonce}"

    def client_first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def client_final(self, server_first: bytes) -> bytes:
        try:
            fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
            salt, iterations = base64.b64decode(fields["s"], validate=True), int(fields["i"])
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise WireError(f"SCRAM: the broker's first message could not be read ({type(exc).__name__})") from None
        if not fields.get("r", "").startswith(self.nonce):
            raise WireError("SCRAM: the broker's nonce does not extend ours")
        if not SCRAM_ITERATIONS[0] <= iterations <= SCRAM_ITERATIONS[1]:
            raise WireError(f"SCRAM: the broker asks for {iterations:,} iterations, outside the "
                            f"{SCRAM_ITERATIONS[0]:,}–{SCRAM_ITERATIONS[1]:,} Kafka allows")
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self.hash)
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        self.auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(stored_key, self.auth_message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_key = hmac.digest(salted, b"Server Key", self.hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the broker's signature: it proves the broker knows the password too."""
        expected = base64.b64encode(hmac.digest(self.server_key, self.auth_message, self.hash)).decode()
        if server_final.decode() != f"v={expected}":
            raise WireError("SCRAM: the broker's signature does not match")


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` → address pairs (IPv6 in brackets allowed)."""
    out = []
    for item in servers.split(","):
        item = item.strip().split("://")[-1]
        host, _, port = item.rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out
