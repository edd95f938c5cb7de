"""Serial transport over pyserial: USB-serial adapters, RS-232 and ptys alike.

pyserial opens and configures the port (baud, framing, raw mode); the event loop then
watches the file descriptor, so no thread blocks on a read.
"""

from __future__ import annotations

import asyncio
import os

import serial

from instruments.errors import AddressError, ConnectError, InstrumentClosed
from instruments.transports.base import BufferedTransport

_PARITY = {"N": serial.PARITY_NONE, "E": serial.PARITY_EVEN, "O": serial.PARITY_ODD,
           "M": serial.PARITY_MARK, "S": serial.PARITY_SPACE}
_STOPBITS = {"1": serial.STOPBITS_ONE, "1.5": serial.STOPBITS_ONE_POINT_FIVE,
             "2": serial.STOPBITS_TWO}


class SerialTransport(BufferedTransport):
    _port: serial.Serial | None = None

    def _settings(self) -> dict[str, object]:
        opts = self.address.options
        try:
            return {
                "baudrate": int(opts.get("baud", "9600")),
                "bytesize": int(opts.get("bytesize", "8")),
                "parity": _PARITY[opts.get("parity", "N").upper()],
                "stopbits": _STOPBITS[opts.get("stopbits", "1")],
                "rtscts": opts.get("rtscts", "0") == "1",
                "xonxoff": opts.get("xonxoff", "0") == "1",
            }
        except (KeyError, ValueError) as exc:
            raise AddressError(f"{self.address}: bad serial option {exc}") from None

    async def open(self) -> None:
        settings = self._settings()
        try:
            port = serial.Serial(self.address.target, timeout=0, write_timeout=0, **settings)
        except (serial.SerialException, ValueError) as exc:
            raise ConnectError(f"cannot open {self.address}: {exc}") from None
        loop = asyncio.get_running_loop()
        buffer = self._new_buffer()
        fd = port.fileno()
        os.set_blocking(fd, False)
        into = memoryview(bytearray(65536))  # kept: os.read(n) would allocate n each time

        def on_readable() -> None:
            try:
                count = os.readv(fd, [into])
            except BlockingIOError:
                return
            except OSError as exc:
                loop.remove_reader(fd)
                buffer.feed_eof(f"read failed: {exc.strerror or exc}")
                return
            if count:
                buffer.feed(into[:count])
            else:  # hang-up: the adapter was pulled or the pty's other side went away
                loop.remove_reader(fd)
                buffer.feed_eof("hung up")

        loop.add_reader(fd, on_readable)
        self._port, self._buffer = port, buffer

    async def write(self, data: bytes) -> None:
        port = self._port
        if port is None:
            raise InstrumentClosed(f"{self.address} is not open")
        fd = port.fileno()
        view = memoryview(data)
        while view:
            try:
                sent = os.write(fd, view)
            except BlockingIOError:
                await self._writable(fd)
                continue
            except OSError as exc:
                raise InstrumentClosed(f"{self.address}: {exc.strerror or exc}") from None
            view = view[sent:]

    @staticmethod
    async def _writable(fd: int) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_writer(fd, ready.set_result, None)
        try:
            await ready
        finally:
            loop.remove_writer(fd)

    async def close(self) -> None:
        port, self._port = self._port, None
        self._drop_buffer()
        if port is not None:
            asyncio.get_running_loop().remove_reader(port.fileno())
            port.close()
