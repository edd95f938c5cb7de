"""The transport contract and the stream-backed base shared by TCP and serial."""

from __future__ import annotations

import asyncio
from typing import Protocol

from instruments.address import Address
from instruments.errors import InstrumentClosed, ProtocolError

#: Replies of a 384-port switch map are a few kB; a logging block of a meter can be MBs.
STREAM_LIMIT = 16 * 1024 * 1024


class Transport(Protocol):
    """What a link needs from a byte channel. Implementations are not re-entrant: the
    :class:`~instruments.link.Link` above serialises all use."""

    address: Address

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def write(self, data: bytes) -> None: ...
    async def read_until(self, separator: bytes) -> bytes: ...
    async def read_exactly(self, count: int) -> bytes: ...
    def discard_input(self) -> bytes: ...
    @property
    def is_open(self) -> bool: ...


class StreamTransport:
    """Reads through an :class:`asyncio.StreamReader`; subclasses open it and write."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self._reader: asyncio.StreamReader | None = None

    @property
    def is_open(self) -> bool:
        return self._reader is not None

    def _require_reader(self) -> asyncio.StreamReader:
        if self._reader is None:
            raise InstrumentClosed(f"{self.address} is not open")
        return self._reader

    async def read_until(self, separator: bytes) -> bytes:
        reader = self._require_reader()
        try:
            return await reader.readuntil(separator)
        except asyncio.IncompleteReadError as exc:
            raise InstrumentClosed(
                f"{self.address} closed the connection"
                + (f" after sending {exc.partial!r}" if exc.partial else "")
            ) from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(
                f"{self.address}: no {separator!r} within {STREAM_LIMIT} bytes; "
                "is the read termination right?"
            ) from None
        except OSError as exc:
            raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None

    async def read_exactly(self, count: int) -> bytes:
        reader = self._require_reader()
        try:
            return await reader.readexactly(count)
        except asyncio.IncompleteReadError:
            raise InstrumentClosed(f"{self.address} closed the connection mid-block") from None
        except OSError as exc:
            raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None

    def discard_input(self) -> bytes:
        """Drop whatever has arrived and not been read (stale replies after a timeout)."""
        reader = self._reader
        if reader is None:
            return b""
        # StreamReader has no public "drain what is buffered"; its buffer is a bytearray.
        buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
        stale = bytes(buffer)
        buffer.clear()
        return stale
