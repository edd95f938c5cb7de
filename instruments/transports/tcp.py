"""TCP socket transport (SCPI raw socket on 5025, TL1 raw on 3082, ...)."""

from __future__ import annotations

import asyncio
import socket

from instruments.errors import ConnectError, InstrumentClosed
from instruments.transports.base import STREAM_LIMIT, StreamTransport


class TcpTransport(StreamTransport):
    _writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        host, port = self.address.target, self.address.port
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=STREAM_LIMIT)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.address}: {exc.strerror or exc}") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Commands are small and latency is what we measure: never wait for Nagle.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader, self._writer = reader, writer

    async def write(self, data: bytes) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise InstrumentClosed(f"{self.address} is not open")
        try:
            writer.write(data)
            if writer.transport.get_write_buffer_size():
                await writer.drain()
        except OSError as exc:
            raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the peer is already gone: closed is closed
