"""A scripted device for protocol tests: a real TCP server that expects exact bytes and
answers with exact bytes, one connection after another."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from instruments.transports.memory import CLOSE, SILENCE, Script

__all__ = ["CLOSE", "SILENCE", "Script", "ScriptedDevice", "address_of", "tl1_block"]


@dataclass
class ScriptedDevice(Script):
    """A :class:`~instruments.transports.memory.Script` served on a real TCP socket:
    ``connections`` is a list of scripts; a script is a list of (expected, reply) steps.
    Each accepted connection plays the next script."""

    _server: asyncio.Server | None = None

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
        await self.play(reader, writer.write, writer.close)


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
