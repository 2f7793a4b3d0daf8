"""Metrics: lag from librdkafka's statistics, health and readiness."""

from __future__ import annotations

import json

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from worker.process.metrics import BatchHistogram, Health, record_lag_from_stats


def _lag(topic: str, partition: str) -> float | None:
    return REGISTRY.get_sample_value("embedstream_consumer_lag", {"topic": topic, "partition": partition})


def test_lag_comes_from_assigned_partitions_only():
    stats = {"topics": {"lagtopic": {"partitions": {
        "0": {"fetch_state": "active", "consumer_lag": 12},
        "1": {"fetch_state": "none", "consumer_lag": 99},
        "2": {"fetch_state": "active", "consumer_lag": -1},
        "-1": {"fetch_state": "active", "consumer_lag": 5},
    }}}}
    record_lag_from_stats(json.dumps(stats))
    assert _lag("lagtopic", "0") == 12
    assert _lag("lagtopic", "1") is None and _lag("lagtopic", "2") is None and _lag("lagtopic", "-1") is None
    record_lag_from_stats("not json")  # ignored, never raises


def test_a_revoked_partitions_lag_is_dropped_so_a_sum_over_members_counts_it_once():
    """After a rebalance the new owner reports the partition: the old one's series goes, at the
    revoke (forget_lag, from the loop) and whenever librdkafka still lists it as not desired."""
    from worker.process.metrics import forget_lag

    record_lag_from_stats(json.dumps({"topics": {"moving": {"partitions": {
        "0": {"fetch_state": "active", "consumer_lag": 7, "desired": True},
        "1": {"fetch_state": "active", "consumer_lag": 3, "desired": True}}}}}))
    assert _lag("moving", "0") == 7 and _lag("moving", "1") == 3
    forget_lag("moving", [0, 5])  # 5 never had a series: no error
    assert _lag("moving", "0") is None and _lag("moving", "1") == 3
    record_lag_from_stats(json.dumps({"topics": {"moving": {"partitions": {
        "1": {"fetch_state": "stopped", "consumer_lag": 3, "desired": False}}}}}))
    assert _lag("moving", "1") is None


def test_health_needs_a_recent_tick_and_readiness_needs_model_and_partitions():
    h = Health(max_tick_age=60)
    assert h.alive() and not h.ready()
    h.model_loaded, h.assigned = True, 2
    assert h.ready()
    h.last_tick -= 61
    assert not h.alive()


def test_a_batch_histogram_exposes_what_a_histogram_observing_one_value_at_a_time_does():
    """Same buckets (a value on a bound counts in it), count and sum, same exposition text."""
    values = [0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 2.5, 59.9, 60.0, 61.0, 1e9]
    values += list(np.random.default_rng(0).exponential(2.0, 500))
    buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batched = BatchHistogram("h_seconds", "doc", buckets, registry=ours)
    single = Histogram("h_seconds", "doc", buckets=buckets, registry=theirs)
    batched.observe_many(values[:7])
    batched.observe_many([])
    batched.observe(values[7])
    batched.observe_many(np.array(values[8:]))
    for v in values:
        single.observe(v)

    def samples(reg):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for m in reg.collect() for s in m.samples if not s.name.endswith("_created")}

    got, want = samples(ours), samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    text = [ln for ln in generate_latest(ours).decode().splitlines() if "_sum" not in ln]
    assert text == [ln for ln in generate_latest(theirs).decode().splitlines()
                    if "_sum" not in ln and "_created" not in ln]


def _get(port: int, path: str = "/healthz", timeout: float = 5.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_trickling_clients_never_lock_out_a_probe():
    """Clients that hold connections open by sending a byte now and then (slow loris) never keep a probe
    from its answer: at the bound on connections the oldest unfinished request is closed, and each
    connection has a deadline for its whole exchange, not per read."""
    import time

    from tests.helpers import Trickle
    from worker.process.answer_server import serve_answers

    server = serve_answers(0, lambda path: (200, "text/plain", b"ok\n"), "127.0.0.1", deadline=1.0, limit=8)
    trickle = Trickle(server.server_address[1], clients=24, every=0.05, probe_every=0.02)  # 3x the bound
    try:
        deadline = time.monotonic() + 30
        while len(trickle.probes) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        trickle.stop()
        server.shutdown()
    assert len(trickle.probes) >= 30 and set(trickle.probes) == {200}, trickle.probes


def test_a_burst_of_connections_never_pushes_out_a_probe_whose_request_is_a_moment_behind_its_connect():
    """At the bound, a connection accepted just before a burst is not closed to make room for it: it has
    ``grace`` to send its request (here it sends 0.2 s after connecting, inside a 1 s grace), and the
    burst waits in the listen backlog meanwhile. The server is held inside an answer while the probe and
    the burst connect, so all of them are accepted in one turn."""
    import socket
    import threading
    import time

    from worker.process.answer_server import serve_answers

    held, release = threading.Event(), threading.Event()

    def answer(path):
        if path == "/hold":
            held.set()
            release.wait(10)
        return 200, "text/plain", b"ok\n"

    server = serve_answers(0, answer, "127.0.0.1", deadline=5.0, limit=8, grace=1.0)
    port = server.server_address[1]
    socks = []
    try:
        holder = socket.create_connection(("127.0.0.1", port), timeout=5)
        holder.sendall(b"GET /hold HTTP/1.0\r\n\r\n")
        assert held.wait(5)
        probe = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(24)]
        release.set()
        time.sleep(0.2)  # the probe's request travels late; the server has taken the burst by now
        probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := probe.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply
    finally:
        for s in socks:
            s.close()
        server.shutdown()


def test_a_connection_is_closed_at_its_deadline_whatever_it_sends():
    import socket
    import time

    from worker.process.answer_server import serve_answers

    server = serve_answers(0, lambda path: (200, "text/plain", b"ok"), "127.0.0.1", deadline=0.5)
    port = server.server_address[1]
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 4:
        try:
            s.send(b"X")  # never a whole request
        except OSError:
            closed = True
            break
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed = True
                break
        except BlockingIOError:
            pass
        s.setblocking(True)
        time.sleep(0.05)
    assert closed and time.monotonic() - t0 < 2.0
    s.close()
    server.shutdown()


def test_the_answer_server_answers_what_it_is_asked_and_refuses_the_rest():
    import socket

    from worker.process.answer_server import MAX_REQUEST_BYTES, serve_answers

    def answer(path: str):
        if path == "/boom":
            raise RuntimeError("a failing answer")
        return (200, "text/plain", path.encode()) if path.startswith("/ok") else (404, "text/plain", b"no\n")

    server = serve_answers(0, answer, "127.0.0.1")
    port = server.server_address[1]
    assert _get(port, "/ok?x=1") == (200, b"/ok?x=1")
    assert _get(port, "/nope") == (404, b"no\n")
    assert _get(port, "/boom")[0] == 500
    assert _get(port, "/ok")[0] == 200  # still serving after an answer raised

    def raw(data: bytes) -> bytes:
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        s.sendall(data)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        s.close()
        return got

    assert raw(b"POST /ok HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert raw(b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(b"GET /" + b"a" * (MAX_REQUEST_BYTES + 10) + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 431")
    head = raw(b"HEAD /ok HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    server.shutdown()
