"""TLS in front of a plaintext TCP server, for tests: what a Milvus behind an ingress or a proxy with a
private CA looks like to the worker, built on the Milvus server this stack runs (which speaks only
plaintext gRPC).

It presents a certificate signed by a test CA (``tools.pki``), offers ALPN ``h2`` as gRPC asks, asks for a
client certificate signed by that CA when ``mutual``, and copies bytes both ways to the backend. It counts
the connections that completed the handshake, so a test can show its traffic really went through TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import threading

from tools.dev import free_port
from tools.pki import Pki


class TlsTerminator:
    """``with TlsTerminator(("127.0.0.1", 19530), pki, mutual=True) as t:`` TLS on ``t.port``."""

    def __init__(self, backend: tuple[str, int], pki: Pki, mutual: bool = False) -> None:
        self.backend = backend
        self.port = free_port()
        self.connections = 0
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(pki.server)  # the key, then the chain, in one file
        self._ctx.set_alpn_protocols(["h2"])
        if mutual:
            self._ctx.verify_mode = ssl.CERT_REQUIRED
            self._ctx.load_verify_locations(pki.ca)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-terminator", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def __enter__(self) -> TlsTerminator:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self._ctx)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1  # called only once the handshake (and the client's certificate) passed
        try:
            backend_r, backend_w = await asyncio.open_connection(*self.backend)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_copy(client_r, backend_w), _copy(backend_r, client_w))


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        try:
            dst.close()
        except (ConnectionError, OSError, RuntimeError):
            pass
