"""Serving an SCPI interface over HiSLIP, the LAN protocol of VISA's ``TCPIP::…::INSTR``.

HiSLIP (IVI-6.1) carries each SCPI message in framed packets over two TCP connections to
one port: the synchronous channel (``Initialize``, then ``Data``/``DataEnd`` both ways) and
the asynchronous one (``AsyncInitialize``, message size, locks, status, device clear). The
client here is pyvisa-py's (``TCPIP::HOST::hislip0,PORT::INSTR``); what it sends is in
docs/protocols.md §11. The server plays the client in synchronized mode (no overlap),
answers each ``DataEnd`` with one ``DataEnd`` carrying the request's MessageID, and grants
every lock: an emulator has one client at a time.

Faults act as on a TCP endpoint (emulators.wire.server): a stall answers nothing, a drop
cuts both channels, a delay holds the answer, garbage replaces it.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from dataclasses import dataclass, field

from emulators.wire.faults import Faults
from emulators.wire.numbers import MAX_MESSAGE_BYTES
from emulators.wire.server import Interface, Session, answer

#: HiSLIP's registered port; an emulator takes a free one unless told.
PORT = 4880
HEADER = struct.Struct("!2sBBIQ")
#: The message types used here (IVI-6.1 §6.1, table 4).
INITIALIZE, INITIALIZE_RESPONSE, FATAL_ERROR, ERROR = 0, 1, 2, 3
ASYNC_LOCK, ASYNC_LOCK_RESPONSE, DATA, DATA_END = 4, 5, 6, 7
DEVICE_CLEAR_COMPLETE, DEVICE_CLEAR_ACKNOWLEDGE = 8, 9
ASYNC_REMOTE_LOCAL_CONTROL, ASYNC_REMOTE_LOCAL_RESPONSE, TRIGGER = 10, 11, 12
ASYNC_MAX_MSG_SIZE, ASYNC_MAX_MSG_SIZE_RESPONSE = 15, 16
ASYNC_INITIALIZE, ASYNC_INITIALIZE_RESPONSE, ASYNC_DEVICE_CLEAR = 17, 18, 19
ASYNC_STATUS_QUERY, ASYNC_STATUS_RESPONSE, ASYNC_DEVICE_CLEAR_ACKNOWLEDGE = 21, 22, 23
ASYNC_LOCK_INFO, ASYNC_LOCK_INFO_RESPONSE = 24, 25
#: Protocol 1.0 in the upper half of the InitializeResponse parameter.
VERSION = 0x0100
#: The vendor ID an AsyncInitializeResponse carries ("LB", for labd's emulators).
VENDOR = int.from_bytes(b"LB\0\0", "big")
#: Error codes (IVI-6.1 tables 6 and 7).
POORLY_FORMED, NO_SUCH_SESSION, UNRECOGNIZED_TYPE, TOO_LARGE = 1, 3, 1, 4
#: The MessageID of a message the server sends unasked.
UNSOLICITED = 0xFFFF_FFFF


def packet(kind: int, control: int = 0, parameter: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(b"HS", kind, control, parameter, len(payload)) + payload


@dataclass
class _Link:
    """One client's pair of channels."""

    session: Session
    sync: asyncio.StreamWriter
    channels: list[asyncio.StreamWriter] = field(default_factory=list)


class HislipEndpoint:
    """Serves one SCPI interface over HiSLIP on ``host:port`` (0: a free port); its
    ``address`` is the VISA resource a client opens, as ``visa://TCPIP::…::INSTR``."""

    serve = "hislip"

    def __init__(self, interface: Interface, faults: Faults, *, host: str = "127.0.0.1",
                 port: int = 0, sub_address: str = "hislip0") -> None:
        self.interface, self.faults = interface, faults
        self.host, self.port, self.sub_address = host, port, sub_address
        self.address = ""
        self._server: asyncio.Server | None = None
        self._links: dict[int, _Link] = {}
        self._ids = itertools.count(1)
        self._writers: set[asyncio.StreamWriter] = set()
        self._channels: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._on_channel, self.host, self.port,
                                                  limit=MAX_MESSAGE_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]  # a power cycle comes back here
        self.address = f"visa://TCPIP::{self.host}::{self.sub_address},{self.port}::INSTR"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.drop_all()
            # The channels end by themselves once cut (a cancelled one would be logged as
            # an error by asyncio's stream machinery).
            if self._channels:
                await asyncio.wait(list(self._channels), timeout=2)
            await self._server.wait_closed()
            self._server = None
        self._links.clear()

    def drop_all(self) -> None:
        """Cut both channels of every client now (a cable pull)."""
        for writer in list(self._writers):
            writer.transport.abort()

    async def _on_channel(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._channels.add(task)
        try:
            kind, _, parameter, _ = await _receive(reader, writer)
            if kind == INITIALIZE:
                await self._synchronous(reader, writer)
            elif kind == ASYNC_INITIALIZE and parameter in self._links:
                link = self._links[parameter]
                link.channels.append(writer)
                writer.write(packet(ASYNC_INITIALIZE_RESPONSE, 0, VENDOR))
                await self._asynchronous(reader, writer)
            else:
                writer.write(packet(FATAL_ERROR, NO_SUCH_SESSION, 0,
                                    b"expected Initialize, or AsyncInitialize of a session"))
        except (asyncio.IncompleteReadError, ConnectionError, _Malformed):
            pass
        finally:
            self._writers.discard(writer)
            if task is not None:
                self._channels.discard(task)
            writer.close()

    async def _synchronous(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        session_id = next(i for i in (next(self._ids) & 0xFFFF for _ in range(0x10000))
                          if i and i not in self._links)
        session = self.interface.new_session()
        session.send = lambda data: writer.write(packet(DATA_END, 0, UNSOLICITED, data))
        link = self._links[session_id] = _Link(session, writer, [writer])
        writer.write(packet(INITIALIZE_RESPONSE, 0, VERSION << 16 | session_id))
        pending = bytearray()
        try:
            while True:
                kind, control, parameter, payload = await _receive(reader, writer)
                if kind in (DATA, DATA_END):
                    pending += payload
                    if len(pending) > MAX_MESSAGE_BYTES:
                        # A message is at most what a session takes, however many packets
                        # carry it: refused, and the channel closed, not read past.
                        await _send(writer, packet(ERROR, TOO_LARGE, 0, _TOO_LARGE))
                        return
                    if kind == DATA:
                        continue
                elif kind == DEVICE_CLEAR_COMPLETE:
                    pending.clear()
                    await _send(writer, packet(DEVICE_CLEAR_ACKNOWLEDGE, control))
                    continue
                elif kind == TRIGGER:
                    continue
                else:
                    await _send(writer, packet(
                        ERROR, UNRECOGNIZED_TYPE, 0,
                        f"message type {kind} on the sync channel".encode()))
                    continue
                message = bytes(pending)
                pending.clear()
                if not await self._answer(link, message, parameter):
                    return
        finally:
            session.closed()
            self._links.pop(session_id, None)
            for channel in link.channels:
                channel.transport.abort()

    async def _answer(self, link: _Link, message: bytes, message_id: int) -> bool:
        """Answer one message; False where a drop fault cut the link."""
        arrived = time.monotonic_ns()
        if self.faults.take("stall") is not None:
            return True
        drop = self.faults.take("drop")
        if drop is not None:
            if drop.apply:
                await self._handle(link.session, message, arrived)
            return False
        reply = await self._handle(link.session, message, arrived)
        if not reply:
            return True
        delay = self.faults.take("delay")
        if delay is not None:
            await asyncio.sleep(delay.delay_ms / 1000)
        if self.faults.take("garbage") is not None:
            reply = link.session.garbage
        await _send(link.sync, packet(DATA_END, 0, message_id, reply))
        return True

    async def _handle(self, session: Session, message: bytes, arrived: int) -> bytes | None:
        return await answer(session, message, arrived, self.address, self.interface.name)

    async def _asynchronous(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        while True:
            kind, _, _, payload = await _receive(reader, writer)
            if kind == ASYNC_MAX_MSG_SIZE and len(payload) == 8:
                size = min(struct.unpack("!Q", payload)[0], MAX_MESSAGE_BYTES)
                reply = packet(ASYNC_MAX_MSG_SIZE_RESPONSE, 0, 0, struct.pack("!Q", size))
            elif kind == ASYNC_LOCK:
                # Release (0) or request (1): granted, the client is alone with its device.
                reply = packet(ASYNC_LOCK_RESPONSE, 1)
            elif kind == ASYNC_LOCK_INFO:
                reply = packet(ASYNC_LOCK_INFO_RESPONSE, 0, 0)
            elif kind == ASYNC_STATUS_QUERY:
                reply = packet(ASYNC_STATUS_RESPONSE, 0)
            elif kind == ASYNC_DEVICE_CLEAR:
                reply = packet(ASYNC_DEVICE_CLEAR_ACKNOWLEDGE, 0)
            elif kind == ASYNC_REMOTE_LOCAL_CONTROL:
                reply = packet(ASYNC_REMOTE_LOCAL_RESPONSE, 0)
            else:
                reply = packet(ERROR, UNRECOGNIZED_TYPE, 0,
                               f"message type {kind} on the async channel".encode())
            await _send(writer, reply)


_TOO_LARGE = f"message too large: at most {MAX_MESSAGE_BYTES} bytes".encode()


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write and wait for the client to take it: a client that sends and never reads is
    held back by TCP flow control, not answered into an ever larger buffer."""
    writer.write(data)
    await writer.drain()


class _Malformed(Exception):
    """A message the channel cannot go on after: it is closed once the client is told."""


async def _receive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                   ) -> tuple[int, int, int, bytes]:
    """One message: (type, control code, parameter, payload). A header that is not
    HiSLIP's, or a payload longer than the emulator takes (which it would have to read
    past, however long it says it is), ends the channel after saying why."""
    prologue, kind, control, parameter, length = HEADER.unpack(
        await reader.readexactly(HEADER.size))
    if prologue != b"HS":
        writer.write(packet(FATAL_ERROR, POORLY_FORMED, 0, b"no HS prologue"))
        raise _Malformed
    if length > MAX_MESSAGE_BYTES:
        writer.write(packet(ERROR, TOO_LARGE, 0, _TOO_LARGE))
        raise _Malformed
    return kind, control, parameter, await reader.readexactly(length)
