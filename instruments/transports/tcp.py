"""TCP socket transport (SCPI raw socket on 5025, TL1 raw on 3082, ...).

The socket is read directly (``recvmsg``) rather than through an asyncio transport, so that
each reply carries the kernel's stamp of when it arrived (see :mod:`wirestamp`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from instruments.errors import ConnectError, InstrumentClosed
from instruments.transports import wirestamp
from instruments.transports.base import BufferedTransport, ReceiveBuffer

#: The most one read takes. Read into a buffer the transport keeps: ``recvmsg(n)``
#: allocates n bytes for every call, and at this size that is a fresh mapping of memory
#: (mmap, page faults, munmap) for every reply, about 50 µs of a 100 µs round trip.
_CHUNK = 256 * 1024


class TcpTransport(BufferedTransport):
    _sock: socket.socket | None = None
    _into: memoryview
    _loop: asyncio.AbstractEventLoop
    stamped = False
    """Whether arrivals are the kernel's stamps (else: when the event loop read them)."""

    async def open(self) -> None:
        host, port = self.address.target, self.address.port or 0
        loop = asyncio.get_running_loop()
        sock = await self._connect(loop, host, port)
        # Commands are small and latency is what we measure: never wait for Nagle.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stamped = wirestamp.enable(sock)
        buffer = self._new_buffer()
        self._into = memoryview(bytearray(_CHUNK))
        loop.add_reader(sock.fileno(), self._readable, sock, buffer)
        self._sock, self._buffer = sock, buffer
        # Kept: every write would otherwise ask for the running loop, which costs a
        # getpid() system call each time (asyncio's check that no fork came between).
        self._loop = loop

    async def _connect(self, loop: asyncio.AbstractEventLoop, host: str, port: int
                       ) -> socket.socket:
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.address}: {exc.strerror or exc}") from None
        failure: OSError | None = None
        for family, kind, proto, _, where in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, where)
            except OSError as exc:
                sock.close()
                failure = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        why = (failure.strerror or str(failure)) if failure else "no address"
        raise ConnectError(f"cannot connect to {self.address}: {why}")

    def _readable(self, sock: socket.socket, buffer: ReceiveBuffer) -> None:
        try:
            count, ancillary, _, _ = sock.recvmsg_into([self._into], wirestamp.ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._stop_reading(sock)
            buffer.feed_eof(f"connection lost: {exc.strerror or exc}")
            return
        if not count:
            self._stop_reading(sock)
            buffer.feed_eof()
            return
        buffer.feed(self._into[:count],
                    wirestamp.arrival_ns(ancillary) if self.stamped else None)

    @staticmethod
    def _stop_reading(sock: socket.socket) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(sock.fileno())

    async def write(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or sock.fileno() < 0:
            raise InstrumentClosed(f"{self.address} is not open")
        try:
            # A command fits the socket's send buffer: sent here and now, without the
            # loop's coroutine around it (on the path of every round trip); only what the
            # kernel did not take waits for the socket to drain.
            try:
                sent = sock.send(data)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                await self._loop.sock_sendall(sock, memoryview(data)[sent:])
        except OSError as exc:
            raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None

    async def close(self) -> None:
        sock, self._sock = self._sock, None
        self._drop_buffer()
        if sock is not None:
            self._stop_reading(sock)
            sock.close()
