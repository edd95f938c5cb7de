"""A Thorlabs PM100-series power meter (PM100D, PM100USB, PM101) speaking its SCPI
(docs/protocols.md §4.2). USB-TMC in a real lab; a TCP socket here, LF-terminated.

Options: ``model``, ``serial``, ``firmware``, ``sensor`` (head name, e.g. S122C),
``sensor_min_nm``/``sensor_max_nm`` (the head's wavelength range), ``noise_db``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from emulators.physics.crossconnect import sleep_until
from emulators.physics.meters import MeterModel, SensorMissing
from emulators.wire.faults import Faults
from emulators.wire.numbers import wire_int
from emulators.wire.scpi import ScpiDeviceSession, ScpiError, parse_bool, parse_number
from emulators.wire.server import Interface, SessionInterface

#: Seconds per averaged sample (driver comments: about 3 ms; the PM100D samples at ~300 Hz).
SAMPLE_S = 0.003
#: Power-on (and ``*RST``) settings: the meter reads in W (PyMeasure's ThorlabsPM100USB
#: reads ``power`` in W without setting the unit), the wavelength the emulated head starts at.
POWER_ON_WATTS = True
POWER_ON_NM = 1310.0


@dataclass
class ThorlabsOptions:
    model: str = "PM100D"
    serial: str = "P0012345"
    firmware: str = "2.8.0"
    sensor: str = "S122C"
    sensor_serial: str = "21031234"
    sensor_min_nm: float = 700.0
    sensor_max_nm: float = 1800.0
    noise_db: float = 0.01
    sample_s: float = SAMPLE_S
    seed: int | None = None


class ThorlabsMeter:
    kind = "thorlabs"

    def __init__(self, name: str, options: ThorlabsOptions, timing: Any = None) -> None:
        self.name = name
        self.options = options
        self.meter = MeterModel(name, 1, noise_db=options.noise_db, overrange=9.91e37,
                                atime_s=options.sample_s, unit_watts=POWER_ON_WATTS,
                                wavelength_nm=POWER_ON_NM, seed=options.seed)
        self.averages = 1
        self.faults = Faults()
        self.scpi = SessionInterface("scpi", b"\n", lambda: ThorlabsSession(self))

    def interfaces(self) -> dict[str, Interface]:
        return {"scpi": self.scpi}

    def reset(self) -> None:
        self.meter.reset()
        self.averages = 1
        self.faults.clear()

    def preset(self) -> None:
        """``*RST``: the power-on settings; the head and injected faults stay."""
        self.meter.preset()
        self.averages = 1

    def boot(self) -> None:
        self.reset()

    def snapshot(self) -> dict[str, Any]:
        state = self.meter.state[1]
        return {"channels": {"1": {"wavelength_nm": state.wavelength_nm,
                                   "unit": "W" if state.unit_watts else "dBm",
                                   "averages": self.averages, "fault": state.fault}}}




class ThorlabsSession(ScpiDeviceSession):
    garbage = b"\x15#!?garbage\n"

    def __init__(self, device: ThorlabsMeter) -> None:
        self.device = device
        self.meter = device.meter
        opts = device.options
        table = {
            "*IDN?": lambda a, s: f"Thorlabs,{opts.model},{opts.serial},{opts.firmware}",
            "*RST": lambda a, s: device.preset(),
            "*CLS": lambda a, s: self.state.errors.clear(),
            "*OPC?": lambda a, s: "1",
            ":SYSTem:ERRor?": lambda a, s: self.state.pop_error(),
            ":SYSTem:SENSor:IDN?": self._sensor_idn,
            ":SENSe:CORRection:WAVelength": self._set_wavelength,
            ":SENSe:CORRection:WAVelength?": self._wavelength,
            ":SENSe:POWer:UNIT": self._set_unit,
            ":SENSe:POWer:UNIT?": lambda a, s: "W" if self._chan.unit_watts else "DBM",
            ":SENSe:POWer:RANGe:AUTO": lambda a, s: setattr(self._chan, "auto_range",
                                                            parse_bool(a)),
            ":SENSe:POWer:RANGe:AUTO?": lambda a, s: "1" if self._chan.auto_range else "0",
            ":SENSe:RANGe:AUTO": lambda a, s: setattr(self._chan, "auto_range", parse_bool(a)),
            ":SENSe:AVERage:COUNt": self._set_average,
            ":SENSe:AVERage:COUNt?": lambda a, s: str(device.averages),
            ":SENSe:CORRection:COLLect:ZERO": self._zero,
            ":SENSe:CORRection:COLLect:ZERO:INITiate": self._zero,
            # The emulated heads have no dark current: zeroing finds nothing to remove.
            ":SENSe:CORRection:COLLect:ZERO:MAGNitude?": lambda a, s: "0.000000E+00",
            ":CONFigure:POWer": lambda a, s: None,
            ":INITiate": lambda a, s: None,
            ":MEASure:POWer?": self._measure,
            ":READ?": self._measure,
            ":FETCh?": self._fetch,
            ":MEASure:ENERgy?": self._energy,
        }
        super().__init__(table, error_format='{code},"{text}"')

    @property
    def _chan(self) -> Any:
        return self.meter.state[1]


    def _sensor_idn(self, args: str, s: list[int]) -> str:
        o = self.device.options
        if self._chan.fault == "no_sensor":
            return "no sensor,,,0,0,0"
        # flags: power sensor (1) | wavelength settable (32) | has temperature sensor (256)
        return f"{o.sensor},{o.sensor_serial},01-Jan-2024,1,18,289"

    def _wavelength(self, args: str, s: list[int]) -> str:
        which = args.strip().upper()
        o = self.device.options
        if which == "MIN":
            return f"{o.sensor_min_nm:.6E}"
        if which == "MAX":
            return f"{o.sensor_max_nm:.6E}"
        return f"{self._chan.wavelength_nm:.6E}"

    def _set_wavelength(self, args: str, s: list[int]) -> None:
        nm = parse_number(args, ("NM",))
        o = self.device.options
        if not o.sensor_min_nm <= nm <= o.sensor_max_nm:
            raise ScpiError(-222, f"Data out of range; the sensor covers "
                                  f"{o.sensor_min_nm:g}-{o.sensor_max_nm:g} nm")
        self._chan.wavelength_nm = nm

    def _set_unit(self, args: str, s: list[int]) -> None:
        value = args.strip().upper()
        if value not in ("W", "DBM"):
            raise ScpiError(-224, "Illegal parameter value; expected W or DBM")
        self._chan.unit_watts = value == "W"

    def _set_average(self, args: str, s: list[int]) -> None:
        try:
            count = wire_int(args)
        except ValueError:
            raise ScpiError(-104, "Data type error; expected a whole number") from None
        if not 1 <= count <= 100_000:
            raise ScpiError(-222, "Data out of range; 1..100000")
        self.device.averages = count

    async def _zero(self, args: str, s: list[int]) -> None:
        self._chan.offset_db = 0.0

    def _window(self) -> float:
        return self.device.averages * self.device.options.sample_s

    async def _measure(self, args: str, s: list[int]) -> str:
        if self._chan.fault == "no_sensor":
            raise ScpiError(-241, "Hardware missing; no sensor")
        window = self._window()
        start = max(self.arrived_ns, time.monotonic_ns())
        await sleep_until(start + int(window * 1e9))
        try:
            dbm = self.meter.windows_dbm(1, start, window, 1)
        except SensorMissing:
            raise ScpiError(-241, "Hardware missing; no sensor") from None
        return self._format(dbm)

    def _fetch(self, args: str, s: list[int]) -> str:
        return self._format(np.array([self._chan.last_dbm]))

    def _format(self, dbm: np.ndarray) -> str:
        return f"{self.meter.in_unit(1, dbm)[0]:.6E}"

    def _energy(self, args: str, s: list[int]) -> str:
        raise ScpiError(-241, "Hardware missing; not an energy sensor")
