"""Keysight/Agilent N7744A/N7745A multiport power meters over SCPI (socket 5025 or VISA).

Channel n is addressed straight after the subsystem (``:SENS2:POW:WAV?``). The logging
function records ``points`` samples of ``atime`` each and returns them as an IEEE 488.2
block of little-endian float32: the fast power traces light verification uses.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

from instruments import scpi
from instruments.errors import DeviceError, InvalidRequest, ProtocolError
from instruments.link import Link, LinkSettings
from instruments.meter import MeterInfo, PowerMeter, array_to_dbm
from instruments.numbers import reply_float, reply_int

_CHANNELS = re.compile(r"N77(4[45])", re.IGNORECASE)
#: Longest averaging time a meter may report (the N77xx go to 10 s).
MAX_ATIME_S = 10.0


class KeysightN77xx(PowerMeter):
    driver = "keysight-n77xx"
    supports_logging = True
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=3.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self._atime: dict[int, float] = {}
        self._log_atime: dict[int, float] = {}

    async def _identify(self, link: Link) -> MeterInfo:
        vendor, model, serial, firmware = await scpi.identify(link)
        match = _CHANNELS.search(model)
        channels = int(self.options.get("channels") or (8 if match and match.group(1) == "45"
                                                        else 4))
        info = MeterInfo(vendor, model, serial, firmware, channels)
        for ch in range(1, channels + 1):
            query = f":SENS{ch}:POW:ATIM?"
            atime = reply_float(await link.query(query), query, self.name,
                                what="an averaging time")
            if not 0 <= atime <= MAX_ATIME_S:
                raise ProtocolError(f"{query!r} answered {atime:g} s, expected "
                                    f"0..{MAX_ATIME_S} s", instrument=self.name)
            self._atime[ch] = atime
        return info

    async def _unit_is_watts(self, link: Link, channel: int) -> bool:
        # 0 dBm, 1 W; the programming guide's examples show +1, so the number is read.
        query = f":SENS{channel}:POW:UNIT?"
        reply = await link.query(query)
        if reply.strip().upper() in ("W", "DBM"):
            return reply.strip().upper() == "W"
        return reply_int(reply, query, self.name, what="a power unit (0 dBm, 1 W)") == 1

    async def _read(self, link: Link, channel: int) -> float:
        # The reply comes one averaging time after the trigger: wait that long as well.
        wait = link.settings.timeout + self._atime.get(channel, 0.0)
        query = f":READ{channel}:POW?"
        return reply_float(await scpi.query_checked(link, query, timeout=wait), query,
                           self.name, what="a power")

    async def _set_wavelength(self, link: Link, channel: int, nm: float) -> None:
        await scpi.command_checked(link, f":SENS{channel}:POW:WAV {nm:g}NM")

    async def _wavelength(self, link: Link, channel: int) -> float:
        query = f":SENS{channel}:POW:WAV?"
        return reply_float(await link.query(query), query, self.name, what="a wavelength") * 1e9

    async def _set_unit(self, link: Link, channel: int, watts: bool) -> None:
        await scpi.command_checked(link, f":SENS{channel}:POW:UNIT {1 if watts else 0}")

    def window_s(self, channel: int) -> float:
        return self._atime.get(channel, 0.0)

    async def set_averaging_time(self, channel: int, seconds: float) -> None:
        ch = self.check_channel(channel)
        await self._run(lambda link: scpi.command_checked(
            link, f":SENS{ch}:POW:ATIM {seconds:g}S"))
        self._atime[ch] = seconds

    async def set_range(self, channel: int, dbm: float | None) -> None:
        """A fixed range (+10, 0, -10, -20, -30 dBm), or None for auto-ranging."""
        ch = self.check_channel(channel)
        command = (f":SENS{ch}:POW:RANG:AUTO 1" if dbm is None
                   else f":SENS{ch}:POW:RANG {dbm:g}DBM")
        await self._run(lambda link: scpi.command_checked(link, command))

    async def start_logging(self, channels: list[int], points: int, atime_s: float) -> int:
        """Start the logging function on these channels at once; returns the monotonic time
        (ns) the command left, which is when sample 0 began, to within the one-way latency."""
        chans = [self.check_channel(c) for c in channels]
        if not chans or points < 1 or atime_s <= 0:
            raise InvalidRequest("logging needs channels, points ≥ 1 and atime > 0",
                                 instrument=self.name)
        # Parameters cannot change while a function runs, so stop, set, then start all.
        setup = scpi.program_message(
            *(f":SENS{c}:FUNC:STAT LOGG,STOP" for c in chans),
            *(f":SENS{c}:FUNC:PAR:LOGG {points},{atime_s:g}S" for c in chans))
        start = scpi.program_message(*(f":SENS{c}:FUNC:STAT LOGG,STAR" for c in chans))

        async def exchange(link: Link) -> int:
            await scpi.command_checked(link, setup)
            await link.write_query(f"{start};*OPC?;:SYST:ERR?")
            sent = time.monotonic_ns()
            opc = scpi.split_answers(await link.read_line())
            if len(opc) == 1:
                opc.extend(scpi.split_answers(await link.read_line()))
            code, text = scpi.parse_error(opc[-1], command=start, instrument=self.name)
            if code != 0:
                raise DeviceError(code, text, command=start, instrument=self.name)
            return sent

        sent = await self._run(exchange)
        for c in chans:
            self._log_atime[c] = atime_s
        return sent

    async def logging_complete(self, channel: int) -> bool:
        ch = self.check_channel(channel)
        state = await self._run(lambda link: link.query(f":SENS{ch}:FUNC:STAT?"))
        return state.strip().upper().endswith("COMPLETE")

    async def fetch_log(self, channel: int) -> np.ndarray:
        """The last log of a channel, in dBm (+inf where over range)."""
        ch = self.check_channel(channel)

        payload = await self._run(lambda link: scpi.query_block(link, f":SENS{ch}:FUNC:RES?"))
        if len(payload) % 4:
            raise ProtocolError(f"logging block of {len(payload)} bytes is not float32s",
                                instrument=self.name)
        return array_to_dbm(np.frombuffer(payload, dtype="<f4"), self._watts.get(ch, False))

