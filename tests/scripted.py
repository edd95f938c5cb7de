"""A scripted device for protocol tests: a real TCP server that expects exact bytes and
answers with exact bytes, one connection after another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

CLOSE = object()  # as a reply: close the connection
SILENCE = b""  # as a reply: say nothing


@dataclass
class ScriptedDevice:
    """``connections`` is a list of scripts; a script is a list of (expected, reply) steps.
    Each accepted connection plays the next script."""

    connections: list[list[tuple[bytes, object]]]
    received: list[bytes] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    """time.monotonic() at which each expected request had fully arrived."""
    mismatches: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _index: int = 0

    async def __aenter__(self) -> ScriptedDevice:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def address(self) -> str:
        return address_of(self._server)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._index >= len(self.connections):
            writer.close()
            return
        script = self.connections[self._index]
        self._index += 1
        try:
            for expected, reply in script:
                got = await reader.readexactly(len(expected)) if expected else b""
                self.received.append(got)
                self.arrivals.append(time.monotonic())
                if got != expected:
                    self.mismatches.append(f"expected {expected!r}, got {got!r}")
                    break
                if reply is CLOSE:
                    writer.close()
                    return
                if isinstance(reply, bytes) and reply:
                    writer.write(reply)
                    await writer.drain()
            if self._index == len(self.connections):
                self.done.set()
            await reader.read()  # hold the line open until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            self.mismatches.append("client closed early")
        finally:
            writer.close()


def address_of(server: asyncio.Server | None) -> str:
    """``tcp://host:port`` of a test device's server, once it listens."""
    assert server is not None
    host, port = server.sockets[0].getsockname()[:2]
    return f"tcp://{host}:{port}"


def tl1_block(ctag: int | str, lines: Sequence[str] = (), *, sid: str = "SW-A",
              deny: tuple[str, str] | None = None) -> bytes:
    out = f"\r\n\n   {sid} 24-05-01 12:00:00\r\n"
    if deny:
        out += f"M  {ctag} DENY\r\n   {deny[0]}\r\n   /* {deny[1]} */\r\n;"
    else:
        out += f"M  {ctag} COMPLD\r\n" + "".join(f'   "{ln}"\r\n' for ln in lines) + ";"
    return out.encode()
