"""The share group's backlog without a broker: the wire encodings, SCRAM against RFC 7677's example,
the DescribeShareGroupOffsets answer decoded from bytes built field by field, how a partition counts,
and what the exporter serves while reads fail and once they succeed. On Apache Kafka itself:
``tests/faults/test_share_group.py``."""

from __future__ import annotations

import json

import pytest

from connectors.kafka_wire import Reader, Scram, WireError, Writer, bootstrap_addresses, check_supported
from connectors.share_backlog import (
    GROUP_ID_NOT_FOUND,
    PartitionBacklog,
    ShareOffsets,
    describe_share_offsets,
    partition_backlog,
)
from worker.process.backlog_server import BacklogExporter


def test_writer_and_reader_agree_on_every_encoding():
    w = Writer().int8(-3).int16(300).int32(-70000).uvarint(300).string("ab").string(None).compact_string("héllo")
    w.compact_string(None).compact_len(2).compact_len(None).bytes32(b"\x00\x01").tags()
    r = Reader(bytes(w.buf))
    assert (r.int8(), r.int16(), r.int32(), r.uvarint()) == (-3, 300, -70000, 300)
    assert (r.string(), r.string(), r.compact_string(), r.compact_string()) == ("ab", None, "héllo", None)
    assert (r.compact_len(), r.compact_len(), r.bytes32()) == (2, 0, b"\x00\x01")
    r.tags()
    assert r.pos == len(w.buf)
    assert bytes(Writer().uvarint(300).buf) == b"\xac\x02"  # Kafka's unsigned varint: 7 bits a byte, low first


def test_scram_sha_256_matches_rfc_7677s_exchange():
    scram = Scram("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.client_first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert scram.client_final(server_first) == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(WireError, match="signature"):
        scram.verify(b"v=AAAA")
    with pytest.raises(WireError, match="nonce"):
        Scram("SCRAM-SHA-512", "user", "pencil", nonce="abc").client_final(b"r=xyz,s=AAAA,i=4096")
    assert Scram("SCRAM-SHA-512", "a=b,c", "p").first_bare.startswith("n=a=3Db=2Cc,")  # RFC 5802's escapes


def test_security_settings_the_backlog_reader_cannot_speak_are_refused_with_what_to_do():
    for ok in ({}, {"security.protocol": "SSL"}, {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
               {"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN"}):
        check_supported(ok)
    with pytest.raises(WireError, match="OAUTHBEARER.*SCRAM|SCRAM.*OAUTHBEARER"):
        check_supported({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    with pytest.raises(WireError, match="GSSAPI"):
        check_supported({"security.protocol": "SASL_PLAINTEXT"})  # librdkafka's default mechanism
    assert bootstrap_addresses("a:9092, [::1]:9093,PLAINTEXT://b:1") == [("a", 9092), ("::1", 9093), ("b", 1)]


class _Answer:
    """A connection whose answer is given bytes; it keeps what was asked."""

    def __init__(self, body: bytes) -> None:
        self.body, self.asked = body, []

    def call(self, api_key, version, body, flexible=True):
        self.asked.append((api_key, version, body))
        return Reader(self.body)


def _offsets_answer(partitions, group_error: int = 0) -> bytes:
    w = Writer().int32(0).compact_len(1).compact_string("g").compact_len(1).compact_string("docs")
    w.buf += bytes(16)  # topic id
    w.compact_len(len(partitions))
    for p, start, lag, err in partitions:
        w.int32(p).buf += start.to_bytes(8, "big", signed=True)
        w.int32(0).buf += lag.to_bytes(8, "big", signed=True)
        w.int16(err).compact_string("no" if err else None).tags()
    w.tags().int16(group_error).compact_string(None).tags().tags()
    return bytes(w.buf)


def test_the_offsets_answer_decodes_per_partition_and_an_unknown_group_is_none():
    conn = _Answer(_offsets_answer([(0, 50, 10, 0), (1, -1, -1, 0)]))
    assert describe_share_offsets(conn, "g", "docs", [0, 1]) == {0: ShareOffsets(50, 10), 1: ShareOffsets(-1, -1)}
    [(api, version, body)] = conn.asked
    assert (api, version) == (90, 1)
    asked = Reader(body)
    assert (asked.compact_len(), asked.compact_string(), asked.compact_len(), asked.compact_string()) == (
        1, "g", 1, "docs")
    assert [asked.compact_len(), asked.int32(), asked.int32()] == [2, 0, 1]
    assert describe_share_offsets(_Answer(_offsets_answer([], GROUP_ID_NOT_FOUND)), "g", "docs", [0]) is None
    with pytest.raises(WireError, match=r"docs\[0\]: no"):
        describe_share_offsets(_Answer(_offsets_answer([(0, 0, 0, 3)])), "g", "docs", [0])
    with pytest.raises(WireError) as found:
        describe_share_offsets(_Answer(_offsets_answer([], 14)), "g", "docs", [0])
    assert found.value.retriable


def test_a_partition_counts_its_lag_and_one_not_started_counts_from_the_earliest_offset():
    assert partition_backlog(100, 20, None) == (None, 80)  # a group no member has joined: all of it
    assert partition_backlog(100, 20, ShareOffsets(-1, -1)) == (None, 80)  # joined, not yet on this partition
    assert partition_backlog(100, 20, ShareOffsets(60, 7)) == (60, 7)  # the broker's lag (in flight included)
    assert partition_backlog(100, 20, ShareOffsets(60, -1)) == (60, 40)  # no lag known: past the start offset
    assert partition_backlog(100, 70, ShareOffsets(60, -1)) == (60, 30)  # records below the log start are gone


def test_the_exporter_answers_503_until_a_read_succeeds_then_the_backlog_and_its_gauges():
    answers: list = [RuntimeError("coordinator moving")]
    found = [PartitionBacklog("docs", 0, 100, 60, 7), PartitionBacklog("docs", 1, 50, None, 50)]

    def read():
        item = answers.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    exporter = BacklogExporter(read, "g", "docs")
    assert exporter.answer("/backlog")[0] == 503  # nothing read yet: KEDA counts a failure, never a 0
    exporter.refresh()
    code, _, body = exporter.answer("/backlog")
    assert code == 503 and "coordinator moving" in json.loads(body)["error"]
    assert exporter.answer("/healthz")[0] == 503
    answers.append(found)
    exporter.refresh()
    code, ctype, body = exporter.answer("/backlog")
    assert (code, ctype) == (200, "application/json") and json.loads(body)["backlog"] == 57
    metrics = exporter.answer("/metrics")[2].decode()
    assert 'embedstream_share_backlog{group="g",partition="1",topic="docs"} 50.0' in metrics
    assert 'embedstream_share_topic_backlog{group="g",topic="docs"} 57.0' in metrics
    assert "embedstream_share_backlog_read_failures_total 1.0" in metrics
    assert exporter.answer("/healthz")[0] == 200 and exporter.answer("/nope")[0] == 404


def test_a_consumer_groups_exporter_serves_its_lag_under_names_of_its_own():
    """The same exporter for a consumer group (``lag --serve`` without a share group): its lag at
    ``/lag`` and as ``embedstream_group_*``, never under the workers' ``embedstream_consumer_lag`` (the
    alerts sum that over the release's pods, the exporter's among them)."""
    from connectors.lag import PartitionLag
    from worker.process.backlog_server import GROUP

    lags = [PartitionLag("docs", 0, 120, 100, 20), PartitionLag("docs", 1, 40, None, 35, start_offset=5)]
    exporter = BacklogExporter(lambda: lags, "emb", "docs", kind=GROUP)
    assert exporter.answer("/lag")[0] == 503
    exporter.refresh()
    code, _, body = exporter.answer("/lag")
    found = json.loads(body)
    assert code == 200 and found["total_lag"] == 55 and (found["group"], found["topic"]) == ("emb", "docs")
    assert [p["lag"] for p in found["partitions"]] == [20, 35]
    metrics = exporter.answer("/metrics")[2].decode()
    assert 'embedstream_group_lag{group="emb",partition="1",topic="docs"} 35.0' in metrics
    assert 'embedstream_group_topic_lag{group="emb",topic="docs"} 55.0' in metrics
    assert "embedstream_group_lag_read_failures_total 0.0" in metrics
    assert "embedstream_consumer_lag" not in metrics and "share" not in metrics
    assert exporter.answer("/backlog")[0] == 404 and b"/lag" in exporter.answer("/backlog")[2]


def test_a_brokers_answers_are_bounded_as_input():
    """A length prefix of 2 GB is refused before anything is buffered; a SCRAM iteration count past
    Kafka's bounds (2^31 would hold the CPU for hours) or a first message that does not parse is a
    WireError; the parse error of one bootstrap broker's answer moves on to the next broker."""
    import socket
    import threading

    from connectors.kafka_wire import MAX_RESPONSE_BYTES, Connection
    from connectors.share_backlog import read_share_offsets

    with pytest.raises(WireError, match="iterations"):
        Scram("SCRAM-SHA-512", "u", "p", nonce="abc").client_final(b"r=abcd,s=AAAA,i=2147483647")
    for bad in (b"r=abcd,s=!!,i=4096", b"garbage", b"r=abcd,s=AAAA,i=many", b"\xff"):
        with pytest.raises(WireError, match="could not be read"):
            Scram("SCRAM-SHA-512", "u", "p", nonce="abc").client_final(bad)

    def broker(answer: bytes) -> int:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(4)

        def serve() -> None:
            for _ in range(4):
                conn, _ = server.accept()
                conn.recv(4096)
                conn.sendall(answer)
                conn.close()
        threading.Thread(target=serve, daemon=True).start()
        return server.getsockname()[1]

    huge = broker((2**31 - 1).to_bytes(4, "big"))
    with Connection("127.0.0.1", huge, {}, timeout=5) as conn, pytest.raises(WireError, match="claims"):
        conn.call(10, 4, b"")
    assert MAX_RESPONSE_BYTES < 2**31 - 1
    # an answer of the right size and correlation whose body is cut short: a parse error, then the next
    garbled = broker((6).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x00\x01")
    with pytest.raises(WireError) as both:
        read_share_offsets({"bootstrap.servers": f"127.0.0.1:{garbled},127.0.0.1:{huge}"}, "g", "t", [0], timeout=1)
    assert "cannot read" in str(both.value) and "claims" in str(both.value)  # both brokers were asked


def test_inline_pem_settings_make_the_tls_context_as_files_do():
    """``ssl.ca.pem``, ``ssl.certificate.pem`` and ``ssl.key.pem`` (librdkafka's inline forms) are
    taken, not ignored: the CA is trusted, the client certificate loaded; a broken PEM is an error."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from connectors.kafka_wire import _ssl_context

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "embedstream-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    ctx = _ssl_context({"ssl.ca.pem": cert_pem, "ssl.certificate.pem": cert_pem, "ssl.key.pem": key_pem})
    assert any(c.get("subject") == ((("commonName", "embedstream-test"),),) for c in ctx.get_ca_certs())
    with pytest.raises(ssl.SSLError):
        _ssl_context({"ssl.certificate.pem": cert_pem, "ssl.key.pem": "-----BEGIN PRIVATE KEY-----\nAAAA\n"})
