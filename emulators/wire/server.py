"""Serving a protocol interface on a TCP port or a pty, with fault injection in one place.

A protocol interface cuts its byte stream into messages at ``separator`` and answers each
with bytes (or nothing). The endpoint applies the emulator's faults around that: it is the
only place that knows how to drop, stall, garble or delay.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import platform
import socket
import struct
import sys
import time
import tty
from collections.abc import Callable

from emulators.wire.faults import Faults
from emulators.wire.numbers import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)


class Session(abc.ABC):
    """One client's conversation (login state, path context, pending errors)."""

    #: A reply that does not parse, still framed so the client reads it as one reply.
    garbage: bytes = b"\x15#!?~garbage~?!#\r\n"
    #: Set by the endpoint: writes unsolicited bytes (autonomous messages) to this client.
    send: Callable[[bytes], None] | None = None

    async def greeting(self) -> bytes:
        return b""

    def overlong(self) -> bytes | None:
        """A message longer than :data:`MAX_MESSAGE_BYTES` came and was dropped: the
        protocol's refusal (an error queue entry, a DENY, an error line)."""
        return None

    def failed(self) -> bytes | None:
        """Handling a message raised an unexpected error: the protocol's refusal."""
        return None

    @abc.abstractmethod
    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None: ...

    def closed(self) -> None:  # noqa: B027 - optional hook
        """The client went away."""


async def answer(session: Session, message: bytes, arrived: int, where: str,
                 interface: str) -> bytes | None:
    """The session's answer; an error it did not expect refuses this message only."""
    try:
        return await session.handle(message, arrived)
    except Exception as exc:
        log.warning("%s: %s session failed on %r: %s: %s", where, interface, message[:32],
                    type(exc).__name__, exc)
        return session.failed()


class Interface(abc.ABC):
    """A protocol spoken on one endpoint; makes a session per connection."""

    name: str
    separator: bytes

    @abc.abstractmethod
    def new_session(self) -> Session: ...


class SessionInterface(Interface):
    """An interface whose sessions share nothing but their device: one made per client by
    ``factory``."""

    def __init__(self, name: str, separator: bytes, factory: Callable[[], Session]) -> None:
        self.name, self.separator, self._factory = name, separator, factory

    def new_session(self) -> Session:
        return self._factory()


#: SO_TIMESTAMPNS where its value is the generic one (Linux); elsewhere a command's arrival
#: is when it was read.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_STAMPED = sys.platform == "linux" and platform.machine() in (
    "x86_64", "aarch64", "i686", "armv7l", "riscv64", "s390x", "ppc64le")
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)


#: Readings of the two clocks further apart than this were interrupted: read them again.
_TIGHT_NS = 2_000


def _realtime_to_monotonic(tries: int = 5) -> tuple[int, int]:
    """(CLOCK_MONOTONIC - CLOCK_REALTIME in ns, the monotonic time now). A process can lose
    the CPU between two readings (tens of µs on a virtual machine), which would put a
    kernel stamp off by half that, outside the driver's own dispatched → acknowledged
    window: the tightest of a few back-to-back readings is kept. (The drivers do the same
    in their own code: the emulators share nothing with them.)"""
    best: tuple[int, int, int] | None = None  # (gap, offset, now)
    for _ in range(tries):
        before, wall, now = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        if best is None or now - before < best[0]:
            best = (now - before, (before + now) // 2 - wall, now)
        if now - before <= _TIGHT_NS:
            break
    assert best is not None
    return best[1], best[2]


#: A change of the clocks' offset beyond this is a step of the wall clock: measure again.
_STEP_NS = 50_000
_offset: int | None = None


def _clock_offset() -> tuple[int, int]:
    """(CLOCK_MONOTONIC - CLOCK_REALTIME, the monotonic time now). The clocks run at one
    rate and their offset moves only when the wall clock is stepped: it is measured once,
    tightly, and kept until two readings now say it moved (measured for each command, it
    was off by half of whatever interrupted those readings)."""
    global _offset
    now = time.monotonic_ns()
    if _offset is None or abs(now - time.time_ns() - _offset) > _STEP_NS:
        _offset, now = _realtime_to_monotonic(50)
    return _offset, now


class _Valve(asyncio.ReadTransport):
    """What a StreamReader pauses when its buffer passes twice its limit and resumes when
    it is read: a client that writes faster than its session reads is held back by the
    kernel's own buffers (TCP flow control), never by this process's memory."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        super().__init__()
        self._pause, self._resume, self._reading = pause, resume, True

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._pause()

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._resume()

    def is_reading(self) -> bool:
        return self._reading


class TcpLine:
    """One client's TCP connection, read with ``recvmsg`` so that a command's arrival is
    the kernel's stamp of its bytes landing, not when this process got round to reading
    them: a device's clock starts when the command reaches it, however busy the machine
    that plays it (the drivers stamp replies the same way)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
        self.reader.set_transport(_Valve(self._pause, self._resume))
        self._landed = 0
        # Read into a buffer kept for the connection: recvmsg(n) allocates n bytes a call.
        self._into = memoryview(bytearray(65536))
        self._pending = bytearray()
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if _STAMPED:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._fd = sock.fileno()
        self._loop.add_reader(self._fd, self._readable)

    def _pause(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)

    def _resume(self) -> None:
        if self._fd >= 0:
            self._loop.add_reader(self._fd, self._readable)

    def arrived(self) -> int:
        """When the latest bytes landed (CLOCK_MONOTONIC ns)."""
        return self._landed or time.monotonic_ns()

    def _readable(self) -> None:
        try:
            count, ancillary, _, _ = self.sock.recvmsg_into([self._into], _ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            count, ancillary = 0, []
        if not count:
            self._stop()
            self.reader.feed_eof()
            return
        self._landed = time.monotonic_ns()
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack_from(raw)
                offset, now = _clock_offset()
                landed = seconds * 1_000_000_000 + nanoseconds + offset
                if 0 <= now - landed < 10_000_000_000:  # else the wall clock was stepped
                    self._landed = landed
        self.reader.feed_data(self._into[:count])

    def send(self, data: bytes) -> None:
        if self._fd < 0:
            return
        if not self._pending:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.abort()
                return
            data = data[sent:]
            if not data:
                return
            self._loop.add_writer(self._fd, self._writable)
        self._pending += data

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def _stop(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Close: what the kernel holds still goes out, what it has not taken is dropped."""
        self._stop()
        self.sock.close()
        if not self.reader.at_eof():
            self.reader.feed_eof()

    def abort(self) -> None:
        """Cut the line now: a reset, as when a cable is pulled."""
        if self.sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._pending.clear()
        self.close()


async def _drop_message(reader: asyncio.StreamReader, sep: bytes,
                        overrun: asyncio.LimitOverrunError) -> None:
    """Drop an overlong message up to and including its separator, a limit's worth at a
    time (the reader's buffer never holds more than twice the limit)."""
    while True:
        await reader.readexactly(overrun.consumed)
        try:
            await reader.readuntil(sep)
            return
        except asyncio.LimitOverrunError as again:
            overrun = again


class Endpoint:
    """Serves one interface on ``tcp://host:port`` (port 0 picks a free one) or on a pty."""

    def __init__(self, interface: Interface, faults: Faults, *, host: str = "127.0.0.1",
                 port: int = 0, serve: str = "tcp") -> None:
        if serve not in ("tcp", "pty"):
            raise ValueError(f"serve must be 'tcp' or 'pty', not {serve!r}")
        self.interface, self.faults = interface, faults
        self.host, self.port, self.serve = host, port, serve
        self.address = ""
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._lines: set[TcpLine] = set()
        self._clients: set[asyncio.Task[None]] = set()  # TCP conversations
        self._tasks: set[asyncio.Task[None]] = set()  # our own (the pty conversation)
        self._pty: tuple[int, int] | None = None

    async def start(self) -> str:
        if self.serve == "tcp":
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            listener = socket.create_server((self.host, self.port), family=family)
            listener.setblocking(False)
            self._listener = listener
            sock_host, sock_port = listener.getsockname()[:2]
            self.port = sock_port  # a restart (power cycle) comes back on the same port
            self.address = f"tcp://{sock_host}:{sock_port}"
            self._accepting = asyncio.create_task(self._accept(listener),
                                                  name=f"accept-{self.interface.name}")
        else:
            self.address = f"serial://{self._open_pty()}"
        return self.address

    # -- TCP -------------------------------------------------------------------------------
    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if listener.fileno() < 0:
                    return
                log.warning("%s: accept failed: %s", self.address, exc)
                continue
            line = TcpLine(conn)
            task = asyncio.create_task(self._on_client(line), name=f"client-{self.address}")
            self._clients.add(task)
            task.add_done_callback(self._client_done)

    def _client_done(self, task: asyncio.Task[None]) -> None:
        """A conversation ended: one that ended in an error says so in one line (never an
        unretrieved task exception at exit)."""
        self._clients.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("%s: a %s conversation ended: %s: %s", self.address,
                        self.interface.name, type(exc).__name__, exc)

    async def _on_client(self, line: TcpLine) -> None:
        self._lines.add(line)
        try:
            await self._converse(line.reader, line.send, line.close, line.arrived)
        finally:
            self._lines.discard(line)
            line.close()

    # -- pty -------------------------------------------------------------------------------
    def _open_pty(self) -> str:
        master, slave = os.openpty()
        tty.setraw(slave)
        # We keep the slave open ourselves: otherwise the master reads EIO whenever the
        # client closes its side, and the "serial line" would die with the first client.
        os.set_blocking(master, False)
        self._pty = (master, slave)
        reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
        loop = asyncio.get_running_loop()

        into = memoryview(bytearray(65536))  # kept: os.read(n) allocates n bytes a call

        def on_readable() -> None:
            try:
                count = os.readv(master, [into])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if count:
                reader.feed_data(into[:count])

        loop.add_reader(master, on_readable)

        def pause() -> None:
            loop.remove_reader(master)

        reader.set_transport(_Valve(pause, lambda: loop.add_reader(master, on_readable)))

        def write(data: bytes) -> None:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(master, view):]
                except BlockingIOError:
                    # A pty buffer holds a few kB; nobody reading means the bytes are lost,
                    # just as on a serial line with no one listening.
                    return

        task = asyncio.create_task(self._converse(reader, write, lambda: None),
                                   name=f"pty-{self.interface.name}")
        self._tasks.add(task)
        return os.ttyname(slave)

    # -- the conversation ------------------------------------------------------------------
    async def _converse(self, reader: asyncio.StreamReader, send: Callable[[bytes], None],
                        close: Callable[[], None],
                        arrived_at: Callable[[], int] = time.monotonic_ns) -> None:
        session = self.interface.new_session()
        session.send = send
        greeting = await session.greeting()
        if greeting:
            send(greeting)
        sep = self.interface.separator
        free = 0  # when the session finished its last command
        try:
            while True:
                try:
                    message = await reader.readuntil(sep)
                except asyncio.LimitOverrunError as overrun:
                    await _drop_message(reader, sep, overrun)
                    refusal = session.overlong()
                    if refusal:
                        send(refusal)
                    continue
                # A command that came while the session was busy starts when it is free.
                arrived = max(arrived_at(), free)
                if self.faults.take("stall") is not None:
                    continue
                drop = self.faults.take("drop")
                if drop is not None:
                    if drop.apply:
                        await self._handle(session, message, arrived)
                    if self.serve == "tcp":
                        close()
                        return
                    session.closed()
                    session = self.interface.new_session()
                    session.send = send
                    continue
                reply = await self._handle(session, message, arrived)
                free = time.monotonic_ns()
                if not reply:
                    continue
                delay = self.faults.take("delay")
                if delay is not None:
                    await asyncio.sleep(delay.delay_ms / 1000)
                if self.faults.take("garbage") is not None:
                    reply = session.garbage
                send(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            session.closed()

    async def _handle(self, session: Session, message: bytes, arrived: int) -> bytes | None:
        return await answer(session, message, arrived, self.address, self.interface.name)

    def drop_all(self) -> None:
        """Cut every open TCP connection now (a cable pull)."""
        for line in list(self._lines):
            line.abort()

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.drop_all()
        # Client conversations end by themselves once their sockets are cut (cancelling
        # them would make asyncio's stream machinery log the cancellation as an error).
        if self._clients:
            _, pending = await asyncio.wait(list(self._clients), timeout=2)
            for task in pending:
                task.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._pty is not None:
            master, slave = self._pty
            asyncio.get_running_loop().remove_reader(master)
            os.close(master)
            os.close(slave)
            self._pty = None
