"""An in-memory transport: a driver talks to a device played in the same process, with no socket.

A device is served under a name (:func:`serve`, or :func:`served` as a context manager) and
reached at ``memory://NAME``; each connection runs the device's answer coroutine against
its :class:`FarEnd`, the device's side of the line. Two answers come with it: a protocol
interface's sessions (:func:`sessions`: messages cut at a separator, each answered in
turn, the shape of the emulators' interfaces) and a :class:`Script` of exact bytes.
Nothing here knows any device: whoever serves one wires it in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from instruments.address import Address
from instruments.errors import ConnectError, InstrumentClosed
from instruments.transports.base import BufferedTransport, ReceiveBuffer

log = logging.getLogger(__name__)


class FarEnd:
    """The device's side of one in-memory connection: what the driver wrote, to read
    (:attr:`reader`), and :meth:`send` and :meth:`close` towards the driver."""

    def __init__(self, buffer: ReceiveBuffer) -> None:
        self.reader = asyncio.StreamReader()
        self._buffer = buffer
        self.landed_ns = 0
        """When the driver's latest bytes were written (CLOCK_MONOTONIC ns)."""
        self.closed = False

    def send(self, data: bytes) -> None:
        """Bytes to the driver, arrived now (nothing once either side closed)."""
        if not self.closed and data:
            self._buffer.feed(data, time.monotonic_ns())

    def close(self) -> None:
        """The device closes the line: the driver's next read (or its idle watch) sees it."""
        if not self.closed:
            self.closed = True
            self._buffer.feed_eof()

    def arrived(self) -> int:
        return self.landed_ns or time.monotonic_ns()


Answer = Callable[[FarEnd], Awaitable[None]]
"""Plays the device on one connection, until the driver's side ends (its reader at EOF)."""

_devices: dict[str, Answer] = {}
_names = itertools.count(1)


def serve(answer: Answer, name: str = "") -> str:
    """Serve a device under ``name`` (a fresh one if empty); returns its address."""
    name = name or f"device-{next(_names)}"
    if name in _devices:
        raise ValueError(f"memory://{name} is already served")
    _devices[name] = answer
    return f"memory://{name}"


def withdraw(address: str) -> None:
    """Stop serving a device: connections made since fail; open ones go on."""
    _devices.pop(address.removeprefix("memory://"), None)


@contextlib.contextmanager
def served(answer: Answer, name: str = "") -> Iterator[str]:
    """:func:`serve` for the length of a ``with`` block."""
    address = serve(answer, name)
    try:
        yield address
    finally:
        withdraw(address)


class MemoryTransport(BufferedTransport):
    """The driver's side: writes land in the far end's reader, the far end's sends in
    this transport's receive buffer, stamped as they are sent."""

    def __init__(self, address: Address) -> None:
        super().__init__(address)
        self._end: FarEnd | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        answer = _devices.get(self.address.target)
        if answer is None:
            raise ConnectError(f"cannot connect to {self.address}: nothing served there")
        buffer = self._new_buffer()
        end = FarEnd(buffer)
        self._buffer, self._end = buffer, end
        self._task = asyncio.create_task(self._play(answer, end),
                                         name=f"memory-{self.address.target}")

    @staticmethod
    async def _play(answer: Answer, end: FarEnd) -> None:
        try:
            await answer(end)
        except Exception:  # a device that fails closes its line, as a crashed one would
            log.exception("memory device on %s failed", end)
        finally:
            end.close()

    async def write(self, data: bytes) -> None:
        end = self._end
        if end is None or end.closed:
            raise InstrumentClosed(f"{self.address} is not open")
        end.landed_ns = time.monotonic_ns()
        end.reader.feed_data(data)

    async def close(self) -> None:
        end, task = self._end, self._task
        self._end = self._task = None
        self._drop_buffer()
        if end is not None:
            end.closed = True
            end.reader.feed_eof()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Session(Protocol):
    """One connection's conversation with a protocol interface (the emulators' sessions
    have this shape)."""

    send: Callable[[bytes], None] | None

    async def greeting(self) -> bytes: ...
    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None: ...
    def failed(self) -> bytes | None: ...
    def closed(self) -> None: ...


class Interface(Protocol):
    """A protocol spoken by a device: messages end at ``separator``; a session per
    connection."""

    separator: bytes

    def new_session(self) -> Session: ...


def sessions(interface: Interface) -> Answer:
    """Serve a protocol interface: each message, cut at its separator, handed to the
    connection's session in turn, its reply sent back (a command that came while the
    session was busy starts when it is free, as on a device)."""

    async def answer(end: FarEnd) -> None:
        session = interface.new_session()
        session.send = end.send
        try:
            end.send(await session.greeting())
            free = 0
            while True:
                try:
                    message = await end.reader.readuntil(interface.separator)
                except asyncio.IncompleteReadError:
                    return
                try:
                    reply = await session.handle(message, max(end.arrived(), free))
                except Exception as exc:
                    log.warning("memory device: session failed on %r: %s: %s", message[:32],
                                type(exc).__name__, exc)
                    reply = session.failed()
                free = time.monotonic_ns()
                if reply:
                    end.send(reply)
        finally:
            session.closed()

    return answer


CLOSE = object()
"""As a script's reply: the device closes the connection."""
SILENCE = b""
"""As a script's reply: the device says nothing."""

Step = tuple[bytes, object]
"""(the exact bytes expected, the reply: bytes, :data:`SILENCE` or :data:`CLOSE`)."""


@dataclass
class Script:
    """A scripted device for protocol tests: each connection plays the next of
    ``connections``, a list of steps; a step expects exact bytes and answers with exact
    bytes. What came and what did not match is kept (:attr:`received`,
    :attr:`mismatches`); :attr:`done` is set when the last connection has played."""

    connections: list[list[Step]]
    received: list[bytes] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    """time.monotonic() at which each expected request had fully arrived."""
    mismatches: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _index: int = 0

    async def __call__(self, end: FarEnd) -> None:
        await self.play(end.reader, end.send, end.close)

    async def play(self, reader: asyncio.StreamReader, send: Callable[[bytes], None],
                   close: Callable[[], None]) -> None:
        """Play the next connection's script over any line (also a socket's)."""
        if self._index >= len(self.connections):
            close()
            return
        script: Sequence[Step] = self.connections[self._index]
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
                    close()
                    return
                if isinstance(reply, bytes) and reply:
                    send(reply)
            if self._index == len(self.connections):
                self.done.set()
            await reader.read()  # hold the line open until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            self.mismatches.append("client closed early")
        finally:
            close()
