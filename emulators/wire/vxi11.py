"""Serving an SCPI interface over VXI-11, VISA's older ``TCPIP::…::inst0::INSTR``.

VXI-11 is ONC RPC over TCP: a client asks the portmapper (RPC program 100000 on port 111)
where the device's core channel listens, then calls ``create_link``, ``device_write`` and
``device_read`` on it. The portmapper must have port 111 to itself, so an emulator serves
VXI-11 on a loopback address of its own (``127.0.0.2`` by default), never the machine's:
binding port 111 takes root (or CAP_NET_BIND_SERVICE). What pyvisa-py sends is in
docs/protocols.md §11. Every record is bounded (64 KiB), a call whose arguments do not
parse is answered ``GARBAGE_ARGS``, and an unknown procedure ``PROC_UNAVAIL``.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from emulators.wire.faults import Faults
from emulators.wire.numbers import MAX_MESSAGE_BYTES
from emulators.wire.server import Interface, Session, answer

PORTMAPPER, PMAP_VERSION, GETPORT = 100000, 2, 3
CORE, CORE_VERSION = 0x0607AF, 1
CREATE_LINK, DEVICE_WRITE, DEVICE_READ, DEVICE_READSTB = 10, 11, 12, 13
DEVICE_TRIGGER, DEVICE_CLEAR, DEVICE_REMOTE, DEVICE_LOCAL = 14, 15, 16, 17
DEVICE_LOCK, DEVICE_UNLOCK, DESTROY_LINK = 18, 19, 23
#: accept_stat values (RFC 5531).
SUCCESS, PROG_UNAVAIL, PROC_UNAVAIL, GARBAGE_ARGS = 0, 1, 3, 4
#: Device_ErrorCode values (VXI-11 B.5.2).
NO_ERROR, INVALID_LINK, IO_TIMEOUT = 0, 4, 15
END_FLAG, REASON_END = 0x08, 0x04
IPPROTO_TCP = 6


class _Garbage(Exception):
    """Arguments that do not parse as the procedure's."""


class _Reader:
    """XDR, read from one call's bytes; running past them is :class:`_Garbage`."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def uint(self) -> int:
        if self.at + 4 > len(self.data):
            raise _Garbage
        (value,) = struct.unpack_from(">I", self.data, self.at)
        self.at += 4
        return int(value)

    def opaque(self) -> bytes:
        size = self.uint()
        end = self.at + size
        if end > len(self.data):
            raise _Garbage
        value = self.data[self.at:end]
        self.at = end + (-size % 4)
        return value


def _uints(*values: int) -> bytes:
    return struct.pack(f">{len(values)}I", *(v & 0xFFFF_FFFF for v in values))


def _opaque(data: bytes) -> bytes:
    return _uints(len(data)) + data + b"\0" * (-len(data) % 4)


@dataclass
class _Link:
    session: Session
    pending: bytearray = field(default_factory=bytearray)
    reply: bytes = b""


class Vxi11Endpoint:
    """Serves one SCPI interface over VXI-11 on ``host`` (a loopback address of its own):
    the portmapper on port 111, the core channel on a free port. Its ``address`` is the
    VISA resource a client opens, as ``visa://TCPIP::HOST::inst0::INSTR``."""

    serve = "vxi11"

    def __init__(self, interface: Interface, faults: Faults, *, host: str = "127.0.0.2",
                 port: int = 0) -> None:
        self.interface, self.faults = interface, faults
        self.host, self.port = host, port
        self.address = ""
        self._servers: list[asyncio.Server] = []
        self._links: dict[int, _Link] = {}
        self._ids = itertools.count(1)
        self._writers: set[asyncio.StreamWriter] = set()
        self._channels: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        core = await asyncio.start_server(self._serving(self._core, CORE, CORE_VERSION),
                                          self.host, self.port)
        self.port = core.sockets[0].getsockname()[1]
        try:
            mapper = await asyncio.start_server(
                self._serving(self._portmapper, PORTMAPPER, PMAP_VERSION), self.host, 111)
        except OSError:
            core.close()
            raise
        self._servers = [core, mapper]
        self.address = f"visa://TCPIP::{self.host}::inst0::INSTR"
        return self.address

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        self.drop_all()
        if self._channels:
            await asyncio.wait(list(self._channels), timeout=2)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []
        self._links.clear()

    def drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    def _serving(self, call: Callable[[int, _Reader], Awaitable[tuple[int, bytes]]],
                 program: int, version: int
                 ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                               Awaitable[None]]:
        """A connection's loop: one RPC record in, one reply out, until it closes."""
        async def converse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                           ) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._channels.add(task)
            self._writers.add(writer)
            links: set[int] = set()
            try:
                while (record := await _record(reader)) is not None:
                    call_in = _Reader(record)
                    try:
                        xid, kind, _, asked, asked_version, procedure = (
                            call_in.uint() for _ in range(6))
                        for _ in range(2):  # credentials, verifier: not checked
                            call_in.uint()
                            call_in.opaque()
                    except _Garbage:
                        return  # not an RPC call at all: nothing to answer it with
                    if kind != 0:
                        return
                    accepted, results = PROG_UNAVAIL, b""
                    if (asked, asked_version) == (program, version):
                        try:
                            accepted, results = await call(procedure, call_in)
                        except _Garbage:
                            accepted, results = GARBAGE_ARGS, b""
                        if (program, procedure, accepted) == (CORE, CREATE_LINK, SUCCESS):
                            links.add(struct.unpack_from(">I", results, 4)[0])
                    reply = _uints(xid, 1, 0, 0, 0, accepted) + results
                    writer.write(struct.pack(">I", 0x8000_0000 | len(reply)) + reply)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                for lid in links:
                    link = self._links.pop(lid, None)
                    if link is not None:
                        link.session.closed()
                self._writers.discard(writer)
                if task is not None:
                    self._channels.discard(task)
                writer.close()
        return converse

    async def _portmapper(self, procedure: int, args: _Reader) -> tuple[int, bytes]:
        if procedure == 0:
            return SUCCESS, b""
        if procedure != GETPORT:
            return PROC_UNAVAIL, b""
        program, version, protocol, _ = (args.uint() for _ in range(4))
        known = (program, version, protocol) == (CORE, CORE_VERSION, IPPROTO_TCP)
        return SUCCESS, _uints(self.port if known else 0)

    async def _core(self, procedure: int, args: _Reader) -> tuple[int, bytes]:
        if procedure == CREATE_LINK:
            for _ in range(3):  # client id, lock, lock timeout
                args.uint()
            args.opaque()  # the device's name ("inst0"): one device here
            lid = next(self._ids) & 0xFFFF_FFFF
            session = self.interface.new_session()
            self._links[lid] = _Link(session)
            return SUCCESS, _uints(NO_ERROR, lid, 0, MAX_MESSAGE_BYTES)
        if procedure not in (DEVICE_WRITE, DEVICE_READ, DEVICE_READSTB, DEVICE_TRIGGER,
                             DEVICE_CLEAR, DEVICE_REMOTE, DEVICE_LOCAL, DEVICE_LOCK,
                             DEVICE_UNLOCK, DESTROY_LINK):
            return PROC_UNAVAIL, b""
        lid = args.uint()
        link = self._links.get(lid)
        if procedure == DEVICE_WRITE:
            for _ in range(2):  # io and lock timeouts
                args.uint()
            flags = args.uint()
            data = args.opaque()
            if link is None:
                return SUCCESS, _uints(INVALID_LINK, 0)
            if len(link.pending) + len(data) > MAX_MESSAGE_BYTES:
                link.pending.clear()
                return SUCCESS, _uints(IO_TIMEOUT, 0)  # refused: longer than a message
            link.pending += data
            if flags & END_FLAG:
                message, link.pending = bytes(link.pending), bytearray()
                link.reply = await self._answer(link, message)
            return SUCCESS, _uints(NO_ERROR, len(data))
        if procedure == DEVICE_READ:
            size = args.uint()
            for _ in range(4):  # io and lock timeouts, flags, termination character
                args.uint()
            if link is None:
                return SUCCESS, _uints(INVALID_LINK, 0) + _opaque(b"")
            if not link.reply:
                return SUCCESS, _uints(IO_TIMEOUT, 0) + _opaque(b"")
            part, link.reply = link.reply[:max(size, 1)], link.reply[max(size, 1):]
            return SUCCESS, _uints(NO_ERROR, 0 if link.reply else REASON_END) + _opaque(part)
        if procedure == DESTROY_LINK:
            if link is not None:
                self._links.pop(lid, None)
                link.session.closed()
            return SUCCESS, _uints(NO_ERROR if link else INVALID_LINK)
        # The generic procedures: read the status byte, trigger, clear, remote, local,
        # lock, unlock.
        if link is None:
            return SUCCESS, _uints(INVALID_LINK) + (
                _uints(0) if procedure == DEVICE_READSTB else b"")
        if procedure == DEVICE_CLEAR:
            link.pending.clear()
            link.reply = b""
        return SUCCESS, _uints(NO_ERROR) + (_uints(0) if procedure == DEVICE_READSTB else b"")

    async def _answer(self, link: _Link, message: bytes) -> bytes:
        """The device's answer to one message, faults applied as on a socket."""
        arrived = time.monotonic_ns()
        if self.faults.take("stall") is not None:
            return b""
        if (drop := self.faults.take("drop")) is not None:
            if drop.apply:
                await answer(link.session, message, arrived, self.address,
                             self.interface.name)
            self.drop_all()
            return b""
        reply = await answer(link.session, message, arrived, self.address,
                             self.interface.name) or b""
        if reply and (delay := self.faults.take("delay")) is not None:
            await asyncio.sleep(delay.delay_ms / 1000)
        if reply and self.faults.take("garbage") is not None:
            reply = link.session.garbage
        return reply


async def _record(reader: asyncio.StreamReader) -> bytes | None:
    """One RPC record (its fragments joined), or None where the client sent one longer
    than an emulator takes: the connection is then closed rather than read past it."""
    record = bytearray()
    while True:
        (header,) = struct.unpack(">I", await reader.readexactly(4))
        size = header & 0x7FFF_FFFF
        if len(record) + size > MAX_MESSAGE_BYTES + 1024:
            return None
        record += await reader.readexactly(size)
        if header & 0x8000_0000:
            return bytes(record)
