"""The transport contract and the receive buffer shared by TCP and serial."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from instruments.address import Address
from instruments.errors import InstrumentClosed, InstrumentTimeout, ProtocolError

#: Replies of a 384-port switch map are a few kB; a logging block of a meter can be MBs.
BUFFER_LIMIT = 16 * 1024 * 1024
#: How early a read's timeout may end it: uvloop's timers and clock count whole
#: milliseconds, so its timer may fire that much before the deadline by its clock.
_EARLY_S = 0.001


class Transport(Protocol):
    """What a link needs from a byte channel. Implementations are not re-entrant: the
    :class:`~instruments.link.Link` above serialises all use. Reads give up after
    ``timeout`` seconds with :class:`InstrumentTimeout`."""

    address: Address
    lost: Callable[[str], None] | None
    """Told (with why) when the device closes the channel while nobody reads; None: not
    told (a transport that cannot know waits for the next read)."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def write(self, data: bytes) -> None: ...
    async def read_until(self, separator: bytes, timeout: float) -> bytes: ...
    async def read_exactly(self, count: int, timeout: float) -> bytes: ...
    def discard_input(self) -> bytes: ...
    @property
    def is_open(self) -> bool: ...


class ReceiveBuffer:
    """Bytes received and not yet read, with one waiting reader at most.

    The latency of every command passes through here, so a read whose bytes are already
    buffered returns without suspending, and a waiting read is woken once, by the arrival
    that completes it, with its deadline a plain timer rather than task cancellation.
    """

    def __init__(self, address: Address) -> None:
        self.address = address
        self._data = bytearray()
        self._eof = False
        self._error: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want_sep: bytes = b""
        self._want_count = 0
        self._overflow = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline = 0.0
        """When the waiting read gives up (the loop's clock)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When the timer is due (the loop's clock), for the next read to tell whether it
        comes in time for it."""
        self.fed_ns = 0
        """When the latest bytes arrived (CLOCK_MONOTONIC ns): a reply's arrival, before
        the reader that waits for it runs."""
        self.lost: Callable[[str], None] | None = None
        """Told when the other side closes the channel, read or not (the transport's
        :attr:`BufferedTransport.lost`)."""

    def feed(self, data: bytes | memoryview, arrived_ns: int | None = None) -> None:
        """Take received bytes (copied: ``data`` may be the transport's own read buffer);
        ``arrived_ns``: when they reached the machine, where the transport knows (else
        now)."""
        self.fed_ns = time.monotonic_ns() if arrived_ns is None else arrived_ns
        self._data += data
        if len(self._data) > 2 * BUFFER_LIMIT or (
                len(self._data) > BUFFER_LIMIT and self._want_sep and not self._satisfied()):
            # A device that talks on without ending its reply: what it sent is dropped,
            # and the read waiting for it fails now instead of at its timeout.
            self._data.clear()
            self._overflow = True
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._satisfied():
            waiter.set_result(None)

    def feed_eof(self, error: str | None = None) -> None:
        self._eof = True
        self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.lost is not None:
            self.lost(f"{self.address} {error or 'closed the connection'}")

    def _satisfied(self) -> bool:
        if self._overflow:
            return True
        if self._want_sep:
            return self._data.find(self._want_sep) >= 0
        return len(self._data) >= self._want_count

    def _closed_error(self) -> InstrumentClosed:
        partial = bytes(self._data[:200])
        why = self._error or "closed the connection"
        return InstrumentClosed(f"{self.address} {why}"
                                + (f" after sending {partial!r}" if partial else ""))

    async def _wait(self, timeout: float, what: str) -> None:
        loop = self._loop
        if loop is None:  # the first wait; the buffer lives on this loop from here on
            loop = self._loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiter = waiter
        deadline = self._deadline = loop.time() + timeout
        # One timer serves many reads: armed only where none is due by this read's
        # deadline, and when it fires it ends the read waiting then if that read is due,
        # else it is armed again for it. A timer made and cancelled for every read was
        # on the path of every round trip, for a timeout that almost never comes.
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(loop, deadline)
        try:
            await waiter
        finally:
            self._waiter = None
        self._raise_overflow()
        if not self._satisfied():
            if self._eof:
                raise self._closed_error()
            raise InstrumentTimeout(f"no {what} within {timeout:g} s")

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        self._timer, self._timer_at = loop.call_at(at, self._expire), at

    def _expire(self) -> None:
        self._timer = None
        waiter, loop = self._waiter, self._loop
        if waiter is None or waiter.done() or loop is None:
            return  # no read waits: no timer until the next one does
        if loop.time() + _EARLY_S >= self._deadline:
            waiter.set_result(None)
        else:
            self._arm(loop, self._deadline)

    def _one_reader(self) -> None:
        if self._waiter is not None:
            # The link above serialises reads; a second would take the first's wake-up,
            # what it waits for and its deadline, and leave it waiting for ever.
            raise RuntimeError(f"{self.address}: a read while another is waiting")

    def _raise_overflow(self) -> None:
        if self._overflow:
            self._overflow = False
            raise ProtocolError(f"{self.address}: reply longer than {BUFFER_LIMIT} bytes")

    async def read_until(self, separator: bytes, timeout: float) -> bytes:
        self._one_reader()
        self._raise_overflow()
        index = self._data.find(separator)
        if index < 0:
            if self._eof:
                raise self._closed_error()
            self._want_sep = separator
            try:
                await self._wait(timeout, f"{separator!r}-terminated reply")
            finally:
                self._want_sep = b""
            index = self._data.find(separator)
        end = index + len(separator)
        if end > BUFFER_LIMIT:
            raise ProtocolError(f"{self.address}: reply longer than {BUFFER_LIMIT} bytes")
        chunk = bytes(self._data[:end])
        del self._data[:end]
        return chunk

    async def read_exactly(self, count: int, timeout: float) -> bytes:
        self._one_reader()
        self._raise_overflow()
        if count > BUFFER_LIMIT:
            raise ProtocolError(f"{self.address}: a {count}-byte block is longer than "
                                f"{BUFFER_LIMIT} bytes")
        if len(self._data) < count:
            if self._eof:
                raise self._closed_error()
            self._want_count = count
            try:
                await self._wait(timeout, f"{count}-byte block")
            finally:
                self._want_count = 0
        chunk = bytes(self._data[:count])
        del self._data[:count]
        return chunk

    def close(self) -> None:
        """The channel is closed here: a read still waiting ends now, closed, and the timer
        goes with it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._eof, self._error = True, "was closed"
            waiter.set_result(None)

    def discard(self) -> bytes:
        stale = bytes(self._data)
        self._data.clear()
        self._overflow = False
        return stale


class BufferedTransport:
    """Reads through a :class:`ReceiveBuffer`; subclasses open the channel, feed the buffer
    and write."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self._buffer: ReceiveBuffer | None = None
        self.lost: Callable[[str], None] | None = None
        """Told (with why) when the device closes the channel, whether or not a read is
        waiting: an idle link whose device went away is known at once."""

    def _new_buffer(self) -> ReceiveBuffer:
        buffer = ReceiveBuffer(self.address)
        buffer.lost = self.lost
        return buffer

    @property
    def is_open(self) -> bool:
        return self._buffer is not None

    def _drop_buffer(self) -> None:
        """Let go of the receive buffer, on close."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.close()

    def _require(self) -> ReceiveBuffer:
        if self._buffer is None:
            raise InstrumentClosed(f"{self.address} is not open")
        return self._buffer

    async def read_until(self, separator: bytes, timeout: float) -> bytes:
        return await self._require().read_until(separator, timeout)

    async def read_exactly(self, count: int, timeout: float) -> bytes:
        return await self._require().read_exactly(count, timeout)

    def discard_input(self) -> bytes:
        return self._buffer.discard() if self._buffer is not None else b""

    @property
    def arrived_ns(self) -> int:
        """When the latest bytes arrived (0: none yet)."""
        return self._buffer.fed_ns if self._buffer is not None else 0
