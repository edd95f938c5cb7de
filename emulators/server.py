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
import time
import tty
from collections.abc import Callable

from emulators.faults import Faults

log = logging.getLogger(__name__)


class Session(abc.ABC):
    """One client's conversation (login state, path context, pending errors)."""

    #: A reply that does not parse, still framed so the client reads it as one reply.
    garbage: bytes = b"\x15#!?~garbage~?!#\r\n"
    #: Set by the endpoint: writes unsolicited bytes (autonomous messages) to this client.
    send: Callable[[bytes], None] | None = None

    async def greeting(self) -> bytes:
        return b""

    @abc.abstractmethod
    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None: ...

    def closed(self) -> None:  # noqa: B027 - optional hook
        """The client went away."""


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


class Endpoint:
    """Serves one interface on ``tcp://host:port`` (port 0 picks a free one) or on a pty."""

    def __init__(self, interface: Interface, faults: Faults, *, host: str = "127.0.0.1",
                 port: int = 0, serve: str = "tcp") -> None:
        if serve not in ("tcp", "pty"):
            raise ValueError(f"serve must be 'tcp' or 'pty', not {serve!r}")
        self.interface, self.faults = interface, faults
        self.host, self.port, self.serve = host, port, serve
        self.address = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._clients: set[asyncio.Task[None]] = set()  # TCP conversations
        self._tasks: set[asyncio.Task[None]] = set()  # our own (the pty conversation)
        self._pty: tuple[int, int] | None = None

    async def start(self) -> str:
        if self.serve == "tcp":
            self._server = await asyncio.start_server(self._on_client, self.host, self.port,
                                                      limit=16 * 1024 * 1024)
            sock_host, sock_port = self._server.sockets[0].getsockname()[:2]
            self.port = sock_port  # a restart (power cycle) comes back on the same port
            self.address = f"tcp://{sock_host}:{sock_port}"
        else:
            self.address = f"serial://{self._open_pty()}"
        return self.address

    # -- TCP -------------------------------------------------------------------------------
    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            await self._converse(reader, writer.write, writer.close)
        finally:
            self._writers.discard(writer)
            if task is not None:
                self._clients.discard(task)
            writer.close()

    # -- pty -------------------------------------------------------------------------------
    def _open_pty(self) -> str:
        master, slave = os.openpty()
        tty.setraw(slave)
        # We keep the slave open ourselves: otherwise the master reads EIO whenever the
        # client closes its side, and the "serial line" would die with the first client.
        os.set_blocking(master, False)
        self._pty = (master, slave)
        reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
        loop = asyncio.get_running_loop()

        def on_readable() -> None:
            try:
                data = os.read(master, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if data:
                reader.feed_data(data)

        loop.add_reader(master, on_readable)

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
                        close: Callable[[], None]) -> None:
        session = self.interface.new_session()
        session.send = send
        greeting = await session.greeting()
        if greeting:
            send(greeting)
        sep = self.interface.separator
        try:
            while True:
                try:
                    message = await reader.readuntil(sep)
                except asyncio.LimitOverrunError:
                    reader._buffer.clear()  # type: ignore[attr-defined]
                    continue
                arrived = time.monotonic_ns()
                if self.faults.take("stall") is not None:
                    continue
                drop = self.faults.take("drop")
                if drop is not None:
                    if drop.apply:
                        await session.handle(message, arrived)
                    if self.serve == "tcp":
                        close()
                        return
                    session.closed()
                    session = self.interface.new_session()
                    session.send = send
                    continue
                reply = await session.handle(message, arrived)
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

    def drop_all(self) -> None:
        """Cut every open TCP connection now (a cable pull)."""
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
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
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._pty is not None:
            master, slave = self._pty
            asyncio.get_running_loop().remove_reader(master)
            os.close(master)
            os.close(slave)
            self._pty = None
