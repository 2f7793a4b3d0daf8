"""A gRPC proxy that can hold one call's answer, for tests: a worker whose Milvus read has reached the
server but whose answer has not come back, while the test freezes it, lets another member write, and
then lets the (now stale) answer through. No signal or timing from outside can stop a process at such
a point of its own code; a held answer can.

It sits between the worker and the Milvus server and copies HTTP/2 frames both ways. It reads the
client's header blocks (HPACK, ``hpack``) to learn each call's method. Once ``arm("Query")`` was
called, the next call to that method goes on to the server, and from then on nothing the server sends
reaches the client (frames are held whole, in order) until ``release()``. While it holds, it answers
the client's keep-alive PINGs itself (gRPC closes a connection whose PING goes unanswered for 5 s,
which would turn the held answer into an error the worker retries) and does not pass them on.
"""

from __future__ import annotations

import asyncio
import struct
import threading

from hpack import Decoder

from tools.dev import free_port

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS, _PING, _CONTINUATION = 0x1, 0x6, 0x9
_END_HEADERS, _PADDED, _PRIORITY, _ACK = 0x4, 0x8, 0x20, 0x1


async def _frames(reader: asyncio.StreamReader):
    """``(type, flags, stream, payload, raw)`` for each frame, until the stream ends."""
    while True:
        try:
            head = await reader.readexactly(9)
            length = int.from_bytes(head[:3], "big")
            payload = await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return
        stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
        yield head[3], head[4], stream, payload, head + payload


def _header_block(kind: int, flags: int, payload: bytes) -> bytes:
    """The HPACK bytes of a HEADERS or CONTINUATION frame's payload (padding and priority left out)."""
    if kind != _HEADERS:
        return payload
    start, end = 0, len(payload)
    if flags & _PADDED:
        start, end = 1, len(payload) - payload[0]
    if flags & _PRIORITY:
        start += 5
    return payload[start:end]


class GrpcHold:
    """``with GrpcHold(("127.0.0.1", 19530)) as h:`` the proxy on ``h.port``; ``h.arm("Query")``, then
    ``h.held.wait()``; ``h.release()``. ``h.calls`` counts the calls seen, by method."""

    def __init__(self, backend: tuple[str, int]) -> None:
        self.backend = backend
        self.port = free_port()
        self.calls: dict[str, int] = {}
        #: set once an armed call went to the server and its answer is being held
        self.held = threading.Event()
        self.pings_answered = 0
        self._armed: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-hold", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None

    def __enter__(self) -> GrpcHold:
        self._thread.start()

        async def start() -> asyncio.AbstractServer:
            self._flowing = asyncio.Event()
            self._flowing.set()
            return await asyncio.start_server(self._serve, "127.0.0.1", self.port)

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

        async def stop() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def arm(self, method: str) -> None:
        """Hold the answers from the next call to ``method`` (its last path segment, e.g. ``Query``) on."""
        self.held.clear()
        self._armed = method

    def release(self) -> None:
        """Let everything held through, and every later answer."""
        self._armed = None
        if self._flowing is not None:
            self._loop.call_soon_threadsafe(self._flowing.set)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            backend_r, backend_w = await asyncio.open_connection(*self.backend)
        except OSError:
            client_w.close()
            return
        lock = asyncio.Lock()  # the client's writer: the answers and this proxy's own PING ACKs, whole frames
        await asyncio.gather(self._requests(client_r, backend_w, client_w, lock),
                             self._answers(backend_r, client_w, lock))

    async def _requests(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: asyncio.StreamWriter,
                        lock: asyncio.Lock) -> None:
        assert self._flowing is not None
        decoder = Decoder()
        decoder.max_allowed_table_size = 1 << 20
        block = b""
        try:
            preface = await src.readexactly(len(_PREFACE))
            dst.write(preface)
            async for kind, flags, _, payload, raw in _frames(src):
                if kind == _PING and not flags & _ACK and not self._flowing.is_set():
                    async with lock:
                        client.write(raw[:4] + bytes([_ACK]) + raw[5:])
                        await client.drain()
                    self.pings_answered += 1
                    continue
                if kind in (_HEADERS, _CONTINUATION):
                    block += _header_block(kind, flags, payload)
                    if flags & _END_HEADERS:
                        self._seen(dict(decoder.decode(block)).get(":path", ""))
                        block = b""
                dst.write(raw)
                await dst.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            _close(dst)

    def _seen(self, path: str) -> None:
        method = path.rsplit("/", 1)[-1]
        self.calls[method] = self.calls.get(method, 0) + 1
        if self._armed is not None and method == self._armed:
            self._armed = None
            assert self._flowing is not None
            self._flowing.clear()  # before the request's frames go on: no answer can slip through
            self.held.set()

    async def _answers(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        assert self._flowing is not None
        try:
            async for *_, raw in _frames(src):  # the server sends no preface: its SETTINGS come first
                await self._flowing.wait()
                async with lock:
                    dst.write(raw)
                    await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            _close(dst)


def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except (ConnectionError, OSError, RuntimeError):
        pass
