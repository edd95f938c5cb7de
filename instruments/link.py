"""A message link: a transport plus the instrument's termination, timeout and query delay.

All three are explicit per instrument because guessing them is the most common reason a
lab script hangs. Raw bytes in both directions are logged at DEBUG on ``instruments.wire``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from instruments.address import Address, parse_address
from instruments.errors import InstrumentClosed, InstrumentError, ProtocolError
from instruments.transports import Transport, make_transport

wire_log = logging.getLogger("instruments.wire")


@dataclass(frozen=True)
class LinkSettings:
    """How to frame messages for one instrument."""

    write_termination: str = "\n"
    read_termination: str = "\n"
    timeout: float = 2.0
    """Seconds to wait for a complete reply."""
    query_delay: float = 0.0
    """Seconds to wait between writing a query and reading its reply (slow firmware)."""
    encoding: str = "ascii"


class Link:
    """One open channel to one instrument. Not re-entrant: owners serialise use
    (see :class:`instruments.connection.Connection`)."""

    def __init__(
        self, address: str | Address, settings: LinkSettings | None = None, *, name: str = ""
    ) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self.settings = settings or LinkSettings()
        self.name = name or str(self.address)
        self._transport: Transport = make_transport(self.address, timeout=self.settings.timeout)
        self._wterm = self.settings.write_termination.encode(self.settings.encoding)
        self._rterm = self.settings.read_termination.encode(self.settings.encoding)
        self._debug = wire_log.isEnabledFor(logging.DEBUG)
        self.sent_ns: int | None = None
        """When the first write since :meth:`mark` left (CLOCK_MONOTONIC ns)."""
        self.answered_ns: int | None = None
        """When the bytes of the latest read arrived, as the transport saw them."""
        self._activated_ns: int | None = None
        self._acknowledged_ns: int | None = None
        self._activating = self._moving = False
        self.bytes_out = self.bytes_in = 0
        """Bytes written and read since the link was made (what a slow serial line's time
        on the wire is worked out from)."""

    def mark(self) -> None:
        """Start timing an exchange: :attr:`sent_ns` becomes its first write's time."""
        self.sent_ns = self.answered_ns = self._activated_ns = self._acknowledged_ns = None
        self._activating = self._moving = False

    def activating(self) -> None:
        """The next write is a command that moves the light. Drivers whose changes take
        several commands, some only preparing or tidying up (a CALIENT's ENT-CRS before
        ACT-CRS, DLT-CRS after CANC-CRS), say so before each one that moves it."""
        self._activating = True

    @property
    def moving(self) -> bool:
        """Whether the latest write was marked as a command that moves the light."""
        return self._moving

    @property
    def activated_ns(self) -> int | None:
        """When the first command that moved the light left: the first write, unless the
        driver marked the ones that do (:meth:`activating`)."""
        return self._activated_ns or self.sent_ns

    @property
    def acknowledged_ns(self) -> int | None:
        """When the reply to the last command that moved the light arrived: the latest
        read, unless the driver marked the commands that do (:meth:`activating`)."""
        return self._acknowledged_ns or self.answered_ns

    @property
    def is_open(self) -> bool:
        return self._transport.is_open

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """``callback(why)`` when the device closes the link, read or not."""
        self._transport.lost = callback

    async def open(self) -> None:
        self._debug = wire_log.isEnabledFor(logging.DEBUG)
        await self._transport.open()

    async def close(self) -> None:
        await self._transport.close()

    def discard_input(self) -> bytes:
        stale = self._transport.discard_input()
        if stale and self._debug:
            wire_log.debug("%s discarded %r", self.name, stale, extra={"instrument": self.name})
        return stale

    async def write_raw(self, data: bytes, *, secret: bytes | None = None) -> None:
        if self._debug:
            shown = data.replace(secret, b"***") if secret else data
            wire_log.debug("%s >> %r", self.name, shown, extra={"instrument": self.name})
        if self.sent_ns is None or self._activating:
            now = time.monotonic_ns()
            self.sent_ns = self.sent_ns or now
            if self._activating:
                self._activated_ns = self._activated_ns or now
        self._moving, self._activating = self._activating, False
        self.bytes_out += len(data)
        await self._transport.write(data)

    async def write(self, message: str, *, secret: str | None = None) -> None:
        """Send one message with the write termination appended; ``secret`` (a password
        inside the message) is masked in the wire log."""
        encoding = self.settings.encoding
        await self.write_raw(message.encode(encoding) + self._wterm,
                             secret=secret.encode(encoding) if secret else None)

    async def read_until(self, separator: bytes, *, timeout: float | None = None) -> bytes:
        limit = self.settings.timeout if timeout is None else timeout
        return await self._received(self._transport.read_until(separator, limit))

    async def read_exactly(self, count: int, *, timeout: float | None = None) -> bytes:
        limit = self.settings.timeout if timeout is None else timeout
        return await self._received(self._transport.read_exactly(count, limit))

    async def _received(self, read: Awaitable[bytes]) -> bytes:
        """Await a transport read: name this instrument in its errors, log its bytes."""
        try:
            data = await read
        except InstrumentError as exc:
            exc.instrument = exc.instrument or self.name
            raise
        self.bytes_in += len(data)
        self.answered_ns = getattr(self._transport, "arrived_ns", 0) or time.monotonic_ns()
        if self._moving:
            self._acknowledged_ns = self.answered_ns
        if self._debug:
            wire_log.debug("%s << %r", self.name, data, extra={"instrument": self.name})
        return data

    async def read_line(self, *, timeout: float | None = None) -> str:
        """One reply line without its termination (a stray CR before LF is dropped too)."""
        raw = await self.read_until(self._rterm, timeout=timeout)
        try:
            return raw[: -len(self._rterm)].decode(self.settings.encoding).rstrip("\r")
        except UnicodeDecodeError:
            raise ProtocolError(f"reply is not {self.settings.encoding}: {raw!r}",
                                instrument=self.name) from None

    async def write_query(self, message: str, *, secret: str | None = None) -> None:
        """Send a message that expects a reply, then hold off the instrument's query delay
        (slow firmware that must not be read from too soon)."""
        await self.write(message, secret=secret)
        if self.settings.query_delay:
            await asyncio.sleep(self.settings.query_delay)

    async def query(self, message: str, *, timeout: float | None = None) -> str:
        await self.write_query(message)
        return await self.read_line(timeout=timeout)

    def require_open(self) -> None:
        if not self.is_open:
            raise InstrumentClosed("link is not open", instrument=self.name)
