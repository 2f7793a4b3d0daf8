"""A small HTTP server for probes and scrapes that no client can lock out.

The worker's ``/metrics``, ``/healthz``, ``/readyz`` and the backlog exporter's ``/backlog`` are read by
the kubelet, Prometheus and KEDA: a kubelet that gets no answer restarts the pod. A server with a thread
per connection and a timeout per read lets 32 clients that each send a byte every few seconds hold
every thread. This one runs one thread with a selector, and holds three bounds:

- **a deadline per connection, for the whole exchange** (``deadline`` seconds from accept to the last
  byte of the answer), however the client paces its bytes;
- **a bound on connections**; at the bound, the oldest connection still sending its request is
  closed to make room (a probe sends its whole request at once, a trickling client is always the
  oldest), after one last read of what it sent. A connection younger than ``grace`` is never closed
  this way: its request may be a round trip behind its connect, and a burst of new connections must
  not push out a probe accepted just before them. When only such young ones (or answers being
  written) hold the slots, the server stops accepting until the oldest comes of age; new
  connections wait in the listen backlog rather than being closed;
- **a bound on a request's size** (its line and headers, 8 KiB; a body is never read).

One request per connection, answered with ``Connection: close`` (HTTP/1.0 semantics, which every
prober and scraper speaks). ``answer(path)`` runs on the server's thread and must be quick.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger(__name__)

#: Seconds a connection may take, from accept to the last byte of its answer.
REQUEST_DEADLINE_S = 5.0
#: Connections held at once; past it the oldest still reading its request is closed.
MAX_CONNECTIONS = 64
#: Bytes of request line and headers read at most.
MAX_REQUEST_BYTES = 8192
#: Seconds a new connection has to send its request before it may be closed to make room.
GRACE_S = 0.1

Answer = Callable[[str], tuple[int, str, bytes]]

@dataclass
class _Conn:
    sock: socket.socket
    started: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None  # set once the request is answered


class AnswerServer:
    """Serve GETs on ``host:port`` from a daemon thread named ``name``; ``server_address`` is the bound
    address (port 0 picks a free one); :meth:`shutdown` stops it and closes every connection."""

    def __init__(self, host: str, port: int, answer: Answer, *, name: str = "metrics",
                 deadline: float = REQUEST_DEADLINE_S, limit: int = MAX_CONNECTIONS,
                 grace: float = GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.answer, self.deadline, self.limit, self._clock = answer, deadline, limit, clock
        self.grace = min(grace, deadline)
        self._resume_at: float | None = None  # set while accepting is paused
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._conns: dict[int, _Conn] = {}  # by file descriptor, oldest first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving and close the socket and every connection (waits for the thread)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def server_close(self) -> None:
        self.shutdown()

    # The loop: everything below runs on the server's thread.

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._selector.select(timeout=self._wait()):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._step(key.fileobj.fileno(), events)  # type: ignore[union-attr]
                self._expire()
                self._resume()
        finally:
            for fd in list(self._conns):
                self._close(fd)
            if self._resume_at is None:
                self._selector.unregister(self._listener)
            self._listener.close()
            self._selector.close()

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections: take what is there, then serve
            if len(self._conns) >= self.limit and not self._make_room():
                return  # paused: the rest wait in the listen backlog
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the next turn tries again
                log.debug("accept failed: %s", exc)
                return
            sock.setblocking(False)
            fd = sock.fileno()
            self._conns[fd] = _Conn(sock, self._clock())
            self._selector.register(sock, selectors.EVENT_READ)
            self._step(fd, selectors.EVENT_READ)  # a prober's request is usually there already

    def _make_room(self) -> bool:
        """Close the oldest connection past its grace that has still not sent its whole request (read
        once more first: it may just have); whether a slot is free. When none is, pause accepting
        until the oldest young connection comes of age (or ``grace`` from now)."""
        now = self._clock()
        for fd, conn in list(self._conns.items()):  # oldest first
            if now - conn.started < self.grace:
                break
            if conn.outbox is None:
                self._step(fd, selectors.EVENT_READ)
                if fd in self._conns and self._conns[fd].outbox is None:
                    self._close(fd)
            if len(self._conns) < self.limit:
                return True
        young = [c.started for c in self._conns.values() if c.outbox is None]
        self._pause(min(young) + self.grace if young else now + self.grace)
        return False

    def _pause(self, until: float) -> None:
        if self._resume_at is None:
            self._selector.unregister(self._listener)
        self._resume_at = until

    def _resume(self) -> None:
        if self._resume_at is not None and (self._clock() >= self._resume_at or len(self._conns) < self.limit):
            self._resume_at = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _wait(self) -> float:
        """The select timeout: a turn at least every 0.2 s, sooner when accepting resumes."""
        if self._resume_at is None:
            return 0.2
        return max(0.0, min(0.2, self._resume_at - self._clock()))

    def _expire(self) -> None:
        now = self._clock()
        for fd in [fd for fd, c in self._conns.items() if now - c.started > self.deadline]:
            self._close(fd)

    def _step(self, fd: int, events: int) -> None:
        conn = self._conns.get(fd)
        if conn is None:
            return
        try:
            if conn.outbox is None:
                self._read(fd, conn)
            elif events & selectors.EVENT_WRITE:
                self._write(fd, conn)
        except OSError:  # reset by the peer, say
            self._close(fd)

    def _read(self, fd: int, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            self._close(fd)
            return
        conn.inbox += chunk
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0:
            if len(conn.inbox) > MAX_REQUEST_BYTES:
                self._reply(fd, conn, 431, "text/plain", b"request too large\n")
            return
        if end > MAX_REQUEST_BYTES:
            self._reply(fd, conn, 431, "text/plain", b"request too large\n")
            return
        line = bytes(conn.inbox[:conn.inbox.find(b"\n")]).strip().split()
        if len(line) != 3 or not line[2].startswith(b"HTTP/"):
            self._reply(fd, conn, 400, "text/plain", b"bad request\n")
            return
        method, target = line[0], line[1].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            self._reply(fd, conn, 405, "text/plain", b"only GET\n")
            return
        try:
            code, ctype, body = self.answer(target)
        except Exception:  # an answer that failed must not stop the server
            log.exception("answering GET %s failed", target[:100])
            code, ctype, body = 500, "text/plain", b"internal error\n"
        self._reply(fd, conn, code, ctype, b"" if method == b"HEAD" else body, length=len(body))

    def _reply(self, fd: int, conn: _Conn, code: int, ctype: str, body: bytes, length: int | None = None) -> None:
        head = (f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
        conn.outbox = memoryview(head.encode("latin-1") + body)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(fd, conn)

    def _write(self, fd: int, conn: _Conn) -> None:
        assert conn.outbox is not None
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._close(fd)

    def _close(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is None:
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def serve_answers(port: int, answer: Answer, host: str = "0.0.0.0", name: str = "metrics",
                  deadline: float = REQUEST_DEADLINE_S, limit: int = MAX_CONNECTIONS,
                  grace: float = GRACE_S) -> AnswerServer:
    """Serve GETs on ``host:port``, each answered by ``answer(path)`` as ``(status, content type,
    body)``; returns the running server (the worker's and the backlog exporter's)."""
    return AnswerServer(host, port, answer, name=name, deadline=deadline, limit=limit, grace=grace)
