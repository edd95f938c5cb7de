"""TCP socket transport (SCPI raw socket on 5025, TL1 raw on 3082, ...)."""

from __future__ import annotations

import asyncio
import socket

from instruments.errors import ConnectError, InstrumentClosed
from instruments.transports.base import BufferedTransport, ReceiveBuffer


class _Receiver(asyncio.Protocol):
    def __init__(self, buffer: ReceiveBuffer) -> None:
        self.buffer = buffer

    def data_received(self, data: bytes) -> None:
        self.buffer.feed(data)

    def eof_received(self) -> bool:
        self.buffer.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.buffer.feed_eof(f"connection lost: {exc}" if exc else None)


class TcpTransport(BufferedTransport):
    _transport: asyncio.Transport | None = None

    async def open(self) -> None:
        host, port = self.address.target, self.address.port or 0
        buffer = ReceiveBuffer(self.address)
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _Receiver(buffer), host, port)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.address}: {exc.strerror or exc}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Commands are small and latency is what we measure: never wait for Nagle.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport, self._buffer = transport, buffer

    async def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise InstrumentClosed(f"{self.address} is not open")
        transport.write(data)

    async def close(self) -> None:
        transport, self._transport, self._buffer = self._transport, None, None
        if transport is not None:
            transport.abort()
