"""VISA transport (pyvisa; the pyvisa-py backend unless ``LABD_VISA_LIBRARY`` names another).

pyvisa is blocking, so every call runs in a worker thread and the event loop stays free.
VISA's own timeout is set to the link's so an abandoned read does not hold the thread long.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

from instruments.address import Address
from instruments.errors import ConnectError, InstrumentClosed, InstrumentTimeout, ProtocolError


def _check_socket(res: Any) -> None:
    """pyvisa-py reports a refused SOCKET connection only at the first write; ask the
    socket now so that a wrong port is a connect error, not a mystery later."""
    session = getattr(res.visalib, "sessions", {}).get(res.session)
    sock = getattr(session, "interface", None)
    if isinstance(sock, socket.socket):
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            res.close()
            raise OSError(error, os.strerror(error))


class VisaTransport:
    def __init__(self, address: Address, *, timeout: float = 2.0) -> None:
        self.address = address
        self.lost: Callable[[str], None] | None = None  # VISA says so only on a read
        self._timeout_ms = int(timeout * 1000)
        self._resource: Any = None
        self._pending = b""

    @property
    def is_open(self) -> bool:
        return self._resource is not None

    async def open(self) -> None:
        import pyvisa

        library = os.environ.get("LABD_VISA_LIBRARY", "@py")

        def _open() -> Any:
            rm = pyvisa.ResourceManager(library)
            res: Any = rm.open_resource(self.address.target)
            res.timeout = self._timeout_ms
            res.read_termination = None
            res.write_termination = ""
            _check_socket(res)
            return res

        try:
            self._resource = await asyncio.to_thread(_open)
        except (pyvisa.Error, OSError, ValueError) as exc:
            raise ConnectError(f"cannot open {self.address}: {exc}") from None

    async def _call(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        import pyvisa

        if self._resource is None:
            raise InstrumentClosed(f"{self.address} is not open")
        try:
            if timeout is None:
                return await asyncio.to_thread(fn, *args)
            # VISA's own timeout ends the blocked thread; ours bounds the caller's wait.
            self._resource.timeout = int(timeout * 1000)
            async with asyncio.timeout(timeout + 0.5):
                return await asyncio.to_thread(fn, *args)
        except TimeoutError:
            raise InstrumentTimeout(f"{self.address}: no reply within {timeout:g} s") from None
        except pyvisa.errors.VisaIOError as exc:
            if exc.error_code == pyvisa.constants.StatusCode.error_timeout:
                raise InstrumentTimeout(f"{self.address}: VISA timeout") from None
            raise InstrumentClosed(f"{self.address}: {exc.description}") from None
        except (OSError, pyvisa.Error) as exc:
            raise InstrumentClosed(f"{self.address}: {exc}") from None

    async def write(self, data: bytes) -> None:
        await self._call(self._resource.write_raw, data)

    async def read_until(self, separator: bytes, timeout: float) -> bytes:
        # VISA reads stop at a single termination character; longer separators are
        # completed here by reading on until the whole separator has arrived.
        res = self._resource
        while separator not in self._pending:
            if res is None:
                raise InstrumentClosed(f"{self.address} is not open")
            res.read_termination = separator[-1:].decode("latin-1")
            self._pending += await self._call(res.read_raw, timeout=timeout)
            if len(self._pending) > 16 * 1024 * 1024:
                raise ProtocolError(f"{self.address}: no {separator!r} in 16 MiB of reply")
        head, _, tail = self._pending.partition(separator)
        self._pending = tail
        return head + separator

    async def read_exactly(self, count: int, timeout: float) -> bytes:
        res = self._resource
        while len(self._pending) < count:
            res.read_termination = None
            self._pending += await self._call(res.read_bytes, count - len(self._pending),
                                              timeout=timeout)
        data, self._pending = self._pending[:count], self._pending[count:]
        return data

    def discard_input(self) -> bytes:
        stale, self._pending = self._pending, b""
        return stale

    async def close(self) -> None:
        res, self._resource = self._resource, None
        if res is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(res.close)
