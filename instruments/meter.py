"""The power-meter capability every meter driver offers.

Readings are in dBm whatever unit the meter displays (a channel set to watts is converted),
and a reading the meter flags as over range comes back as ``math.inf``.
"""

from __future__ import annotations

import abc
import asyncio
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from instruments import scpi
from instruments.errors import InstrumentTimeout, InvalidRequest, NoSuchPort, NotSupported
from instruments.instrument import Instrument
from instruments.link import Link

#: SCPI meters report over-range (or "sensitivity too low") as a huge number, e.g. 9.91E37.
OVERRANGE = 1e20


@dataclass(frozen=True)
class MeterInfo:
    vendor: str
    model: str
    serial: str
    firmware: str
    channels: int
    sensor: str = ""


def to_dbm(value: float, watts: bool) -> float:
    """A reading in the meter's unit → dBm; the over-range sentinel → +inf."""
    if not math.isfinite(value) or abs(value) >= OVERRANGE:
        return math.inf
    if not watts:
        return value
    return 10 * math.log10(value * 1000) if value > 0 else -math.inf


def array_to_dbm(values: np.ndarray, watts: bool) -> np.ndarray:
    values = values.astype(np.float64)
    over = ~np.isfinite(values) | (np.abs(values) >= OVERRANGE)
    if watts:
        with np.errstate(divide="ignore", invalid="ignore"):
            values = 10 * np.log10(values * 1000)
    out: np.ndarray = np.where(over, np.inf, values)
    return out


class PowerMeter(Instrument):
    """Base of meter drivers: identity on connect, channel checks, unit bookkeeping."""

    supports_logging: ClassVar[bool] = False

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.info: MeterInfo | None = None
        self._watts: dict[int, bool] = {}

    async def _on_connect(self, link: Link) -> None:
        self.info = await self._identify(link)
        self._watts = {c: await self._unit_is_watts(link, c)
                       for c in range(1, self.info.channels + 1)}

    async def _probe(self, link: Link) -> None:
        # Both meter families speak SCPI: the identity is cheap, and a meter that restarted
        # on other firmware (or was swapped for another) is found without a reconnect.
        assert self.info is not None
        await scpi.same_identity(link, self.info.serial, self.info.firmware)

    def check_channel(self, channel: int) -> int:
        if self.info is None:
            raise InvalidRequest("meter not identified yet; open it first", instrument=self.name)
        if type(channel) is not int or not 1 <= channel <= self.info.channels:
            raise NoSuchPort(f"channel {channel!r} is not on this {self.info.model} "
                                 f"(channels 1..{self.info.channels})", instrument=self.name)
        return channel

    async def read_power(self, channel: int = 1) -> float:
        """Trigger a measurement and return it, in dBm (waits one averaging time)."""
        ch = self.check_channel(channel)
        value = await self._run(lambda link: self._read(link, ch))
        return to_dbm(value, self._watts.get(ch, False))

    async def set_wavelength(self, channel: int, nm: float) -> None:
        ch = self.check_channel(channel)
        await self._run(lambda link: self._set_wavelength(link, ch, nm))

    async def wavelength(self, channel: int = 1) -> float:
        ch = self.check_channel(channel)
        return await self._run(lambda link: self._wavelength(link, ch))

    def window_s(self, channel: int) -> float:
        """How long one reading averages over (seconds)."""
        return 0.0

    async def set_unit(self, channel: int, unit: str) -> None:
        """``"dBm"`` or ``"W"`` on the meter's display; readings here stay in dBm."""
        ch = self.check_channel(channel)
        if unit.upper() not in ("DBM", "W"):
            raise InvalidRequest(f"unit {unit!r}: expected 'dBm' or 'W'", instrument=self.name)
        await self._run(lambda link: self._set_unit(link, ch, unit.upper() == "W"))
        self._watts[ch] = unit.upper() == "W"

    # -- what each driver implements -------------------------------------------------------
    @abc.abstractmethod
    async def _identify(self, link: Link) -> MeterInfo: ...

    @abc.abstractmethod
    async def _unit_is_watts(self, link: Link, channel: int) -> bool: ...

    @abc.abstractmethod
    async def _read(self, link: Link, channel: int) -> float: ...

    @abc.abstractmethod
    async def _set_wavelength(self, link: Link, channel: int, nm: float) -> None: ...

    @abc.abstractmethod
    async def _wavelength(self, link: Link, channel: int) -> float: ...

    @abc.abstractmethod
    async def _set_unit(self, link: Link, channel: int, watts: bool) -> None: ...

    async def start_logging(self, channels: list[int], points: int, atime_s: float) -> int:
        raise NotSupported("the logging function", instrument=self.name)

    async def logging_complete(self, channel: int) -> bool:
        raise NotSupported("the logging function", instrument=self.name)

    async def fetch_log(self, channel: int) -> np.ndarray:
        raise NotSupported("the logging function", instrument=self.name)

    async def wait_logging(self, channel: int, *, poll_s: float = 0.005,
                           timeout_s: float = 5.0) -> None:
        """Return once the log on ``channel`` is complete. The meter only says so when asked,
        so ask every ``poll_s``; a log that never completes (a stuck meter) is a timeout, not
        a hang."""
        try:
            async with asyncio.timeout(timeout_s):
                while not await self.logging_complete(channel):  # noqa: ASYNC110 - polling the device
                    await asyncio.sleep(poll_s)
        except TimeoutError:
            raise InstrumentTimeout(
                f"channel {channel}: the logging function did not complete within "
                f"{timeout_s:g} s; check the meter's logging settings (SENS:FUNC)",
                instrument=self.name) from None
