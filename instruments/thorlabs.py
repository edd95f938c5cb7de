"""Thorlabs PM100-series power meters (PM100D, PM100USB, PM101) over SCPI: USB-TMC through
VISA in a real lab (``visa://USB0::0x1313::0x8078::P0012345::INSTR``), or a socket."""

from __future__ import annotations

from typing import Any

from instruments import scpi
from instruments.errors import ProtocolError
from instruments.link import Link, LinkSettings
from instruments.meter import MeterInfo, PowerMeter
from instruments.numbers import reply_float

#: Seconds per averaged sample (about 3 ms, per the vendor examples).
SAMPLE_S = 0.003
#: Most samples a meter averages (a reading waits this many samples' time).
MAX_AVERAGES = 1_000_000


class ThorlabsPM100(PowerMeter):
    driver = "thorlabs-pm100"
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=3.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.averages = 1

    async def _identify(self, link: Link) -> MeterInfo:
        vendor, model, serial, firmware = await scpi.identify(link)
        sensor = (await link.query(":SYST:SENS:IDN?")).split(",")[0].strip()
        count = reply_float(await link.query(":SENS:AVER:COUN?"), ":SENS:AVER:COUN?",
                            self.name, what="an average count")
        if not 1 <= count <= MAX_AVERAGES:
            raise ProtocolError(f"':SENS:AVER:COUN?' answered {count:g}, expected "
                                f"1..{MAX_AVERAGES}", instrument=self.name)
        self.averages = int(count)
        return MeterInfo(vendor, model, serial, firmware, 1, sensor)

    async def _unit_is_watts(self, link: Link, channel: int) -> bool:
        return (await link.query(":SENS:POW:UNIT?")).strip().upper() == "W"

    async def _read(self, link: Link, channel: int) -> float:
        wait = link.settings.timeout + self.averages * SAMPLE_S
        text = await scpi.query_checked(link, ":MEAS:POW?", timeout=wait)
        return reply_float(text, ":MEAS:POW?", self.name, what="a power")

    async def _set_wavelength(self, link: Link, channel: int, nm: float) -> None:
        await scpi.command_checked(link, f":SENS:CORR:WAV {nm:g}")

    async def _wavelength(self, link: Link, channel: int) -> float:
        return reply_float(await link.query(":SENS:CORR:WAV?"), ":SENS:CORR:WAV?", self.name,
                           what="a wavelength")

    async def _set_unit(self, link: Link, channel: int, watts: bool) -> None:
        await scpi.command_checked(link, f":SENS:POW:UNIT {'W' if watts else 'DBM'}")

    def window_s(self, channel: int) -> float:
        return self.averages * SAMPLE_S

    async def sensor(self) -> str:
        """The sensor head's name; ``no sensor`` when none is attached."""
        text = await self._run(lambda link: link.query(":SYST:SENS:IDN?"))
        return text.split(",")[0].strip()

    async def wavelength_range(self) -> tuple[float, float]:
        async def exchange(link: Link) -> tuple[float, float]:
            ends = []
            for query in (":SENS:CORR:WAV? MIN", ":SENS:CORR:WAV? MAX"):
                ends.append(reply_float(await link.query(query), query, self.name,
                                        what="a wavelength"))
            return ends[0], ends[1]

        return await self._run(exchange)

    async def set_averages(self, count: int) -> None:
        """Samples averaged per reading (about 3 ms each)."""
        await self._run(lambda link: scpi.command_checked(link, f":SENS:AVER:COUN {count}"))
        self.averages = count

    async def zero(self) -> None:
        """Dark-current zeroing: cover the sensor first."""
        await self._run(lambda link: scpi.command_checked(link, ":SENS:CORR:COLL:ZERO:INIT"))
