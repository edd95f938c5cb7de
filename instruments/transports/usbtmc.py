"""USBTMC transport over the Linux kernel's ``/dev/usbtmc*`` character devices.

Some users reach a Thorlabs PM100 (and other USB test-and-measurement devices) only this
way: the kernel's ``usbtmc`` driver claims the device, and a message is one ``write()``,
its answer one ``read()``. Such a read is a whole USB transfer that blocks until the answer
comes or the driver's own timeout ends it (set here by ioctl to each read's own limit),
and the device cannot be polled for it, so reads run in a worker thread. A pty given by path
behaves as a device that answers line by line (it can be polled: its reads wait in
``select`` for at most the read's timeout); the suite plays the device on one, as no CI
machine has a USBTMC device (docs/protocols.md §11).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import struct
from collections.abc import Callable

from instruments.address import Address
from instruments.errors import ConnectError, InstrumentClosed, InstrumentTimeout, ProtocolError
from instruments.transports.base import BUFFER_LIMIT

#: ``USBTMC_IOCTL_SET_TIMEOUT`` of linux/usb/tmc.h: ``_IOW(91, 10, __u32)``, in ms.
SET_TIMEOUT = 0x4004_5B0A
#: The most one read asks of the driver (it splits longer answers into several reads).
READ_SIZE = 65536


class UsbtmcTransport:
    def __init__(self, address: Address, *, timeout: float = 2.0) -> None:
        self.address = address
        self.lost: Callable[[str], None] | None = None  # a device is found gone on a read
        self._timeout = timeout
        self._fd: int | None = None
        self._pollable = False
        self._pending = b""
        self._reading: asyncio.Future[bytes] | None = None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    async def open(self) -> None:
        def _open() -> int:
            fd = os.open(self.address.target, os.O_RDWR | os.O_NOCTTY)
            if not os.isatty(fd):
                # The driver's timeout bounds each blocked read (5 s unless told).
                with contextlib.suppress(OSError):
                    fcntl.ioctl(fd, SET_TIMEOUT, struct.pack("I", int(self._timeout * 1000)))
            return fd

        try:
            self._fd = await asyncio.to_thread(_open)
        except OSError as exc:
            hint = (": is the kernel's usbtmc driver loaded, and may this user open the "
                    "device (its group, e.g. a udev rule)?") if exc.errno in (
                errno.ENOENT, errno.EACCES, errno.EPERM) else ""
            raise ConnectError(f"cannot open {self.address}: "
                               f"{exc.strerror or exc}{hint}") from None
        self._pollable = os.isatty(self._fd)

    def _read_once(self, fd: int, timeout: float) -> bytes:
        if self._pollable:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError
        else:
            # This read's own limit (a meter's averaging lengthens some): the driver's
            # timeout is what ends a blocked read.
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, SET_TIMEOUT, struct.pack("I", max(1, int(timeout * 1000))))
        return os.read(fd, READ_SIZE)

    async def _read(self, timeout: float) -> bytes:
        fd = self._fd
        if fd is None:
            raise InstrumentClosed(f"{self.address} is not open")
        # A read given up on goes on in its thread; the next read takes its answer rather
        # than leave it to arrive into nobody's hands.
        if self._reading is None:
            self._reading = asyncio.ensure_future(
                asyncio.to_thread(self._read_once, fd, timeout))
        reading = self._reading
        try:
            data = await asyncio.wait_for(asyncio.shield(reading), timeout + 0.5)
        except TimeoutError:
            if not reading.done():
                raise InstrumentTimeout(
                    f"{self.address}: no reply within {timeout:g} s") from None
            data = b""  # the thread's own timeout, raised as TimeoutError: below
        finally:
            if reading.done():
                self._reading = None
        if reading.done() and (exc := reading.exception()) is not None:
            if isinstance(exc, TimeoutError) or (isinstance(exc, OSError)
                                                 and exc.errno == errno.ETIMEDOUT):
                raise InstrumentTimeout(f"{self.address}: the device did not answer within "
                                        f"{timeout:g} s") from None
            if isinstance(exc, OSError):
                raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None
            raise exc
        if not data and not self._pollable:
            raise InstrumentClosed(f"{self.address}: the device is gone")
        return data

    async def write(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:
            raise InstrumentClosed(f"{self.address} is not open")
        try:
            await asyncio.to_thread(os.write, fd, data)
        except OSError as exc:
            raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None

    async def read_until(self, separator: bytes, timeout: float) -> bytes:
        while separator not in self._pending:
            self._pending += await self._read(timeout)
            if len(self._pending) > BUFFER_LIMIT:
                raise ProtocolError(f"{self.address}: no {separator!r} in 16 MiB of reply")
        head, _, tail = self._pending.partition(separator)
        self._pending = tail
        return head + separator

    async def read_exactly(self, count: int, timeout: float) -> bytes:
        while len(self._pending) < count:
            self._pending += await self._read(timeout)
        data, self._pending = self._pending[:count], self._pending[count:]
        return data

    def discard_input(self) -> bytes:
        stale, self._pending = self._pending, b""
        return stale

    async def close(self) -> None:
        fd, self._fd = self._fd, None
        reading, self._reading = self._reading, None
        if reading is not None:
            # The thread still reading must be done with the descriptor before it is
            # closed (its number could be another file's by the time it reads again).
            await asyncio.wait([reading], timeout=self._timeout + 1)
            if reading.done() and not reading.cancelled():
                reading.exception()  # retrieved: a read nobody waits for any more
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
