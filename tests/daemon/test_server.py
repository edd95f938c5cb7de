"""The HTTP server's connections: a response that closes its connection mid-body leaves the
rest unread and lingers, so that the client reads the answer before the close; any other
close is at once, and writes pass straight through."""

import asyncio
import socket
from typing import Any

import uvicorn

from labd.daemon.server import Lingering, LingeringProtocol, Server

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Recording(asyncio.Transport):
    """A transport that keeps what each write was given, one entry per write, and whether
    it still reads, was closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.writes.extend(bytes(d) for d in list_of_data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_pass_through_and_a_close_with_nothing_unread_is_at_once() -> None:
    raw = Recording()
    wrapped = Lingering(raw, asyncio.get_running_loop(), unread=lambda: False)
    wrapped.write(HEAD)
    wrapped.write(memoryview(b"ok"))
    wrapped.writelines([b"a", b"b"])
    assert raw.writes == [HEAD, b"ok", b"a", b"b"]
    wrapped.close()
    assert raw.closed and raw.reading and raw.writes[-1] == b"b"


async def test_a_close_with_the_body_still_coming_lingers_unread() -> None:
    """The answer and the end of what the server sends, nothing more read, the socket left
    open for the client to read the answer (a close now would reset it); a second close
    (the server stopping) closes at once."""
    raw = Recording()
    wrapped = Lingering(raw, asyncio.get_running_loop(), unread=lambda: True)
    wrapped.write(HEAD + b"no")
    wrapped.close()
    assert raw.writes == [HEAD + b"no", b"<eof>"] and not raw.reading and not raw.closed
    assert wrapped.is_closing()
    wrapped.close()
    assert raw.closed and raw.writes == [HEAD + b"no", b"<eof>"]


async def test_an_abort_while_lingering_ends_the_connection_at_once() -> None:
    raw = Recording()
    wrapped = Lingering(raw, asyncio.get_running_loop(), unread=lambda: True)
    wrapped.close()
    wrapped.abort()
    assert raw.aborted and not raw.closed


async def test_the_server_says_when_it_listens_and_serves_on_its_socket() -> None:
    """Over a real socket, on the lingering protocol: two requests on one kept-alive
    connection, each answered whole."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn.Config(app, http=LingeringProtocol, lifespan="off",
                                   log_config=None, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(server.listening.wait(), 10)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        for _ in range(2):
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()
