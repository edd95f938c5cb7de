"""The API's HTTP server: uvicorn, its signals left to the daemon, and a connection closed
mid-body left to linger unread.

A response that closes its connection while the request's body is still coming (the API's
413 for a body past the limit, its 401 before a body is read) is followed by the end of
what the server sends (a FIN), and nothing more of the body is read: the connection is
closed :data:`LINGER_S` later. uvicorn closes it at once, and a close with unread bytes in
the socket is a reset, which loses the answer to a client still sending
(tests/daemon/test_api_edge.py); reading on until the client stops would read whatever it
sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    from labd.daemon.services import Services

__all__ = ["LINGER_S", "Lingering", "LingeringProtocol", "Server", "listen"]

#: How long a connection closed mid-body stays open, unread, once its answer is sent: time
#: for the client to read the answer before the close resets the connection.
LINGER_S = 1.0


class Lingering(asyncio.Transport):
    """A connection's transport as its protocol uses it: ``close()`` while ``unread()``
    (the request being answered has body still to come) ends what the server sends, stops
    reading and closes :data:`LINGER_S` later; everything else passes through."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 unread: Callable[[], bool] = lambda: False) -> None:
        super().__init__()
        self._transport, self._loop, self._unread = transport, loop, unread
        self._lingering: asyncio.TimerHandle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        if self._lingering is None and self._unread() and not self._transport.is_closing():
            self._transport.pause_reading()
            if self._transport.can_write_eof():  # not under TLS
                self._transport.write_eof()
            self._lingering = self._loop.call_later(LINGER_S, self._transport.close)
            return
        # Asked again while lingering (the server stopping): closed now.
        self._stop_lingering()
        self._transport.close()

    def abort(self) -> None:
        self._stop_lingering()
        self._transport.abort()

    def _stop_lingering(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()

    def is_closing(self) -> bool:
        return self._lingering is not None or self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None,
                                low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


class LingeringProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`Lingering` transport (``http=`` of
    uvicorn's Config)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = Lingering(transport, self.loop, self._body_unread)

    def _body_unread(self) -> bool:
        """Whether the request being answered has body still to come (its parser has not
        reached the end of it)."""
        return self.cycle is not None and self.cycle.more_body
class Server(uvicorn.Server):
    """uvicorn without its signal handling (the daemon owns signals), telling when it
    listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    def install_signal_handlers(self) -> None:
        pass

    async def serve_on(self, sock: socket.socket) -> None:
        """Serve on ``sock`` until told to exit; the socket is closed after."""
        with sock:
            await self.serve(sockets=[sock])


def listen(services: Services, host: str, port: int) -> tuple[Server, socket.socket, str]:
    """The API's server, its listening socket (bound here: a port in use is an OSError from
    start-up itself) and its URL."""
    from labd.daemon.api.app import create_app

    # proto named: asyncio's standard loop sets TCP_NODELAY on accepted connections only
    # when the listener says IPPROTO_TCP, and without it a response written in two parts
    # waits for a delayed ACK (40 ms on Linux). uvloop sets it either way.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_host, bound_port = sock.getsockname()[:2]
    api = services.api
    url = f"{'https' if api.tls else 'http'}://{bound_host}:{bound_port}"
    # log_config None: uvicorn's lines go through labd's handlers (labd.logs), not handlers
    # of its own that would bypass their format and their redaction.
    config = uvicorn.Config(create_app(services), http=LingeringProtocol, log_level="warning",
                            log_config=None, lifespan="off", ssl_certfile=api.tls_cert,
                            ssl_keyfile=api.tls_key)
    return Server(config), sock, url
