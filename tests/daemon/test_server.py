"""The HTTP server's protocol: a response's head goes out in the same write as its body, and
a head whose body is not ready yet still goes out on its own, at once; a response that
closes its connection mid-body leaves the rest unread."""

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from labd.daemon.server import HeadWithBody, OneWriteProtocol, Server

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Recording(asyncio.Transport):
    """A transport that keeps what each write was given, one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.writes.extend(bytes(d) for d in list_of_data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


async def next_turn() -> None:
    """Let the loop run the callbacks already scheduled (a held head's flush)."""
    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(done.set)
    await asyncio.wait_for(done.wait(), 5)


async def test_a_head_and_its_body_in_one_write() -> None:
    raw = Recording()
    wrapped = HeadWithBody(raw, asyncio.get_running_loop())
    wrapped.write(HEAD)
    assert raw.writes == [] and wrapped.get_write_buffer_size() == len(HEAD)
    wrapped.write(memoryview(b"ok"))
    wrapped.write(b"more")  # not a head: straight through, after the joined write
    assert raw.writes == [HEAD + b"ok", b"more"]
    await next_turn()  # the flush scheduled for the head finds nothing held
    assert raw.writes == [HEAD + b"ok", b"more"]


async def test_a_head_alone_goes_out_at_the_next_turn() -> None:
    raw = Recording()
    wrapped = HeadWithBody(raw, asyncio.get_running_loop())
    wrapped.write(HEAD)
    await next_turn()
    assert raw.writes == [HEAD]


@pytest.mark.parametrize("end", ["close", "write_eof", "writelines"])
async def test_a_held_head_is_sent_before_the_connection_ends(end: str) -> None:
    raw = Recording()
    wrapped = HeadWithBody(raw, asyncio.get_running_loop())
    wrapped.write(HEAD)
    if end == "writelines":
        wrapped.writelines([b"a", b"b"])
        assert raw.writes == [HEAD, b"a", b"b"]
    elif end == "close":
        wrapped.close()
        assert raw.writes == [HEAD] and raw.closed
    else:
        raw.write_eof = lambda: raw.writes.append(b"<eof>")  # type: ignore[method-assign]
        wrapped.write_eof()
        assert raw.writes == [HEAD, b"<eof>"]


async def test_an_aborted_connection_drops_its_held_head() -> None:
    raw = Recording()
    wrapped = HeadWithBody(raw, asyncio.get_running_loop())
    wrapped.write(HEAD)
    wrapped.abort()
    await next_turn()
    assert raw.writes == [] and raw.aborted


class Unread(Recording):
    """A connection whose request body is still coming in: reads and the end of writing
    are recorded too."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def is_closing(self) -> bool:
        return self.closed


async def test_a_close_with_the_body_still_coming_lingers_unread() -> None:
    """The answer and the end of what the server sends, nothing more read, the socket left
    open for the client to read the answer (a close now would reset it); a second close
    (the server stopping) closes at once."""
    raw = Unread()
    wrapped = HeadWithBody(raw, asyncio.get_running_loop(), unread=lambda: True)
    wrapped.write(HEAD)
    wrapped.write(b"no")
    wrapped.close()
    assert raw.writes == [HEAD + b"no", b"<eof>"] and not raw.reading and not raw.closed
    assert wrapped.is_closing()
    wrapped.close()
    assert raw.closed and raw.writes == [HEAD + b"no", b"<eof>"]


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    return await asyncio.wait_for(reader.readuntil(marker), 10)


async def test_a_slow_body_does_not_hold_back_its_head() -> None:
    """Over a real socket: the app sends its head, then waits for the client to have read it
    before it sends the body; with a head held for the body, this would never finish."""
    head_read = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await asyncio.wait_for(head_read.wait(), 10)
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn.Config(app, http=OneWriteProtocol, lifespan="off",
                                      log_config=None, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(server.listening.wait(), 10)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        for _ in range(2):  # twice on one kept-alive connection
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await read_until(reader, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            head_read.set()
            assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"
            head_read.clear()
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()
