"""Milvus beyond the defaults, through `embedstream run` on the real stack: a database other than
`default`, and TLS with a private CA, server-only and mutual.

The stack's Milvus server speaks plaintext gRPC; a TLS terminator in front of it (``tools.tls_terminator``)
presents a certificate signed by a CA made for the test and, in mutual mode, asks for a client certificate
signed by it. Each run's rows are then read straight from the server, and the terminator's count of
completed handshakes shows the worker's traffic went through TLS."""

from __future__ import annotations

import uuid
from urllib.parse import urlparse

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import documents_in_milvus, fresh_settings
from tools.pki import make_pki
from tools.tls_terminator import TlsTerminator

pytestmark = pytest.mark.integration


def _with_documents(stack, n: int = 8, **update):
    s = fresh_settings(stack, partitions=1)
    producer = make_producer(s.kafka_common())
    for i in range(n):
        d = Document(f"d{i}", f"a document about option number {i}")
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    assert producer.flush(30) == 0
    return s.model_copy(update=update) if update else s


def _last_line(log: str) -> str:
    return [line for line in log.splitlines() if line.strip()][-1]


def test_a_database_other_than_default_holds_the_collection_and_a_missing_one_is_one_line(stack):
    from connectors.milvus.connection import connect

    plain = _with_documents(stack)
    db = f"tenant_{uuid.uuid4().hex[:8]}"
    # Opened as the worker opens them (no idle keepalive pings, which milvus-lite answers with GOAWAY
    # "too_many_pings"; a refused handshake retried): a raw client failed here once in a full run.
    admin = connect(plain.milvus_uri, None, 30)
    admin.create_database(db)
    in_db = connect(plain.milvus_uri, None, 30, {"db_name": db})
    try:
        s = plain.model_copy(update={"milvus_db_name": db})
        res = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert set(documents_in_milvus(s)) == {f"d{i}" for i in range(8)}
        # the collection (named from the alias and the model) and its companion, in that database only
        ours = [n for n in in_db.list_collections() if n.startswith(f"{s.milvus_collection}__")]
        assert len(ours) == 2, ours
        assert not [n for n in admin.list_collections() if n.startswith(s.milvus_collection)]

        missing = plain.model_copy(update={"milvus_db_name": f"absent_{uuid.uuid4().hex[:6]}"})
        res = run_worker(missing, "--stop-when-idle", "0.5", timeout=120)
        assert res.returncode == 2, res.stderr[-3000:]
        assert "EMBEDSTREAM_MILVUS_DB_NAME" in _last_line(res.stderr), _last_line(res.stderr)
    finally:
        for name in in_db.list_collections():
            in_db.drop_collection(name)
        in_db.close()
        admin.drop_database(db)
        admin.close()


def test_tls_with_a_private_ca_server_only_and_mutual(stack, tmp_path):
    pki = make_pki(tmp_path / "pki")
    server = urlparse(stack["EMBEDSTREAM_MILVUS_URI"])
    backend = (server.hostname or "127.0.0.1", server.port or 19530)

    with TlsTerminator(backend, pki) as tls:  # the server's certificate, from a private CA
        s = _with_documents(stack)
        run = s.model_copy(update={"milvus_uri": f"https://127.0.0.1:{tls.port}", "milvus_tls_ca_file": str(pki.ca)})
        res = run_worker(run, "--stop-when-idle", "0.5", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert set(documents_in_milvus(s)) == {f"d{i}" for i in range(8)} and tls.connections > 0

        untrusting = run.model_copy(update={"milvus_tls_ca_file": None})  # the system's CAs only
        res = run_worker(untrusting, "--stop-when-idle", "0.5", timeout=120)
        assert res.returncode == 2, res.stderr[-3000:]
        assert "EMBEDSTREAM_MILVUS_TLS_CA_FILE" in _last_line(res.stderr), _last_line(res.stderr)

    with TlsTerminator(backend, pki, mutual=True) as tls:  # and the client's, signed by the same CA
        s = _with_documents(stack)
        base = {"milvus_uri": f"https://127.0.0.1:{tls.port}", "milvus_tls_ca_file": str(pki.ca)}
        res = run_worker(s.model_copy(update=base), "--stop-when-idle", "0.5", timeout=120)
        assert res.returncode == 2, res.stderr[-3000:]  # no client certificate: the handshake is refused
        assert "EMBEDSTREAM_MILVUS_TLS_CERT_FILE" in _last_line(res.stderr), _last_line(res.stderr)
        assert tls.connections == 0

        mutual = s.model_copy(update={**base, "milvus_tls_cert_file": str(pki.client_cert),
                                      "milvus_tls_key_file": str(pki.client_key)})
        res = run_worker(mutual, "--stop-when-idle", "0.5", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert set(documents_in_milvus(s)) == {f"d{i}" for i in range(8)} and tls.connections > 0
