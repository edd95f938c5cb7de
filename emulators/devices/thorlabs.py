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
#: Settings a third-party client reads at connect (docs/protocols.md §4.2, "third-party
#: forms"): labd's own values for the emulated S122C head, none confirmed on a meter.
RESPONSIVITY_A_PER_W = 0.8
POWER_RANGE_W = 0.04
CURRENT_RANGE_A = POWER_RANGE_W * RESPONSIVITY_A_PER_W
BEAM_MM, BEAM_MIN_MM, BEAM_MAX_MM = 9.5, 0.0, 9.5
LOSS_LIMIT_DB = 60.0


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
        self._settings()
        self.faults = Faults()
        self.scpi = SessionInterface("scpi", b"\n", lambda: ThorlabsSession(self))

    def interfaces(self) -> dict[str, Interface]:
        return {"scpi": self.scpi}

    def reset(self) -> None:
        self.meter.reset()
        self.averages = 1
        self._settings()
        self.faults.clear()

    def _settings(self) -> None:
        self.responsivity = RESPONSIVITY_A_PER_W
        self.range_w = POWER_RANGE_W
        self.beam_mm = BEAM_MM
        self.loss_db = 0.0
        self.filter_on = False
        self.sre = self.ese = 0
        self.line_hz = 50

    def preset(self) -> None:
        """``*RST``: the power-on settings; the head and injected faults stay."""
        self.meter.preset()
        self.averages = 1
        self._settings()

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
            # Status reporting a client resets at connect; the emulated meter raises no
            # service requests, so the enables are kept and read back only.
            "*SRE": lambda a, s: setattr(self.device, "sre", self._byte(a)),
            "*SRE?": lambda a, s: str(self.device.sre),
            "*ESE": lambda a, s: setattr(self.device, "ese", self._byte(a)),
            "*ESE?": lambda a, s: str(self.device.ese),
            "*ESR?": lambda a, s: "0",
            ":STATus:PRESet": lambda a, s: None,
            ":ABORt": lambda a, s: None,
            ":SYSTem:LFRequency": self._set_line_frequency,
            ":SYSTem:LFRequency?": lambda a, s: str(self.device.line_hz),
            ":SYSTem:ERRor?": lambda a, s: self.state.pop_error(),
            ":SYSTem:SENSor:IDN?": self._sensor_idn,
            "[:SENSe]:CORRection:WAVelength": self._set_wavelength,
            "[:SENSe]:CORRection:WAVelength?": self._wavelength,
            "[:SENSe]:POWer:UNIT": self._set_unit,
            "[:SENSe]:POWer:UNIT?": lambda a, s: "W" if self._chan.unit_watts else "DBM",
            "[:SENSe]:POWer[:DC]:RANGe:AUTO": lambda a, s: setattr(self._chan, "auto_range",
                                                                 parse_bool(a)),
            "[:SENSe]:POWer[:DC]:RANGe:AUTO?": lambda a, s: "1" if self._chan.auto_range else "0",
            "[:SENSe]:POWer[:DC]:RANGe[:UPPer]": self._set_range,
            "[:SENSe]:POWer[:DC]:RANGe[:UPPer]?": self._range,
            "[:SENSe]:RANGe:AUTO": lambda a, s: setattr(self._chan, "auto_range", parse_bool(a)),
            "[:SENSe]:CURRent[:DC]:RANGe:AUTO": lambda a, s: setattr(self._chan, "auto_range",
                                                                   parse_bool(a)),
            "[:SENSe]:CURRent[:DC]:RANGe:AUTO?": lambda a, s: "1" if self._chan.auto_range
                                                else "0",
            "[:SENSe]:CURRent[:DC]:RANGe[:UPPer]?": lambda a, s: self._value(
                a, CURRENT_RANGE_A * self.responsivity / RESPONSIVITY_A_PER_W,
                CURRENT_RANGE_A * 1e-3, CURRENT_RANGE_A),
            "[:SENSe]:AVERage[:COUNt]": self._set_average,
            "[:SENSe]:AVERage[:COUNt]?": lambda a, s: str(device.averages),
            "[:SENSe]:CORRection:POWer[:PDIode]:RESPonse": self._set_responsivity,
            "[:SENSe]:CORRection:POWer[:PDIode]:RESPonse?": lambda a, s: (
                f"{self.responsivity:.6E}"),
            "[:SENSe]:CORRection:BEAMdiameter": self._set_beam,
            "[:SENSe]:CORRection:BEAMdiameter?": lambda a, s: self._value(
                a, self.beam_mm, BEAM_MIN_MM, BEAM_MAX_MM),
            "[:SENSe]:CORRection[:LOSS][:INPut][:MAGNitude]": self._set_loss,
            "[:SENSe]:CORRection[:LOSS][:INPut][:MAGNitude]?": lambda a, s: self._value(
                a, self.loss_db, -LOSS_LIMIT_DB, LOSS_LIMIT_DB),
            "[:SENSe]:CORRection:COLLect:ZERO:STATe?": lambda a, s: "0",
            ":INPut[:PDIode]:FILTer[:LPASs][:STATe]": lambda a, s: setattr(
                self, "filter_on", parse_bool(a)),
            ":INPut[:PDIode]:FILTer[:LPASs][:STATe]?": lambda a, s: (
                "1" if self.filter_on else "0"),
            "[:SENSe]:CORRection:COLLect:ZERO": self._zero,
            "[:SENSe]:CORRection:COLLect:ZERO:INITiate": self._zero,
            # The emulated heads have no dark current: zeroing finds nothing to remove.
            "[:SENSe]:CORRection:COLLect:ZERO:MAGNitude?": lambda a, s: "0.000000E+00",
            ":CONFigure:POWer": lambda a, s: None,
            ":INITiate": lambda a, s: None,
            ":MEASure[:SCALar]:POWer?": self._measure,
            ":MEASure[:SCALar]:CURRent[:DC]?": self._measure_current,
            ":READ?": self._measure,
            ":FETCh?": self._fetch,
            ":MEASure:ENERgy?": self._energy,
        }
        super().__init__(table, error_format='{code},"{text}"')

    @property
    def _chan(self) -> Any:
        return self.meter.state[1]


    @property
    def responsivity(self) -> float:
        return self.device.responsivity

    @property
    def beam_mm(self) -> float:
        return self.device.beam_mm

    @property
    def loss_db(self) -> float:
        return self.device.loss_db

    @property
    def filter_on(self) -> bool:
        return self.device.filter_on

    @filter_on.setter
    def filter_on(self, on: bool) -> None:
        self.device.filter_on = on

    @staticmethod
    def _value(args: str, value: float, low: float, high: float) -> str:
        """A setting's query, ``MIN``/``MAX`` (long or short) giving its limits."""
        which = args.strip().upper()
        if which in ("MIN", "MINIMUM"):
            return f"{low:.6E}"
        if which in ("MAX", "MAXIMUM"):
            return f"{high:.6E}"
        return f"{value:.6E}"

    def _range(self, args: str, s: list[int]) -> str:
        return self._value(args, self.device.range_w, POWER_RANGE_W * 1e-3, POWER_RANGE_W)

    def _set_range(self, args: str, s: list[int]) -> None:
        watts = parse_number(args, ("W", "MW", "UW", "NW"))
        if not 0 < watts <= POWER_RANGE_W:
            raise ScpiError(-222, f"Data out of range; the sensor's ranges end at "
                                  f"{POWER_RANGE_W:g} W")
        self.device.range_w = watts
        self._chan.auto_range = False

    def _set_responsivity(self, args: str, s: list[int]) -> None:
        value = parse_number(args)
        if not 0 < value <= 10:
            raise ScpiError(-222, "Data out of range; responsivity 0 to 10 A/W")
        self.device.responsivity = value

    def _set_beam(self, args: str, s: list[int]) -> None:
        value = parse_number(args, ("MM",)) * (1e3 if args.strip().upper().endswith("MM")
                                                 else 1.0)
        if not BEAM_MIN_MM <= value <= BEAM_MAX_MM:
            raise ScpiError(-222, f"Data out of range; beam diameter {BEAM_MIN_MM:g} to "
                                  f"{BEAM_MAX_MM:g} mm")
        self.device.beam_mm = value

    def _set_loss(self, args: str, s: list[int]) -> None:
        value = parse_number(args, ("DB",))
        if not -LOSS_LIMIT_DB <= value <= LOSS_LIMIT_DB:
            raise ScpiError(-222, f"Data out of range; -{LOSS_LIMIT_DB:g} to "
                                  f"{LOSS_LIMIT_DB:g} dB")
        self.device.loss_db = value

    @staticmethod
    def _byte(args: str) -> int:
        try:
            value = wire_int(args)
        except ValueError:
            raise ScpiError(-104, "Data type error; expected a whole number") from None
        if not 0 <= value <= 255:
            raise ScpiError(-222, "Data out of range; 0..255")
        return value

    def _set_line_frequency(self, args: str, s: list[int]) -> None:
        try:
            hz = wire_int(args)
        except ValueError:
            raise ScpiError(-104, "Data type error; expected 50 or 60") from None
        if hz not in (50, 60):
            raise ScpiError(-222, "Data out of range; 50 or 60 Hz")
        self.device.line_hz = hz

    def _sensor_idn(self, args: str, s: list[int]) -> str:
        o = self.device.options
        if self._chan.fault == "no_sensor":
            return "no sensor,,,0,0,0"
        # flags: power sensor (1) | wavelength settable (32) | has temperature sensor (256)
        return f"{o.sensor},{o.sensor_serial},01-Jan-2024,1,18,289"

    def _wavelength(self, args: str, s: list[int]) -> str:
        o = self.device.options
        return self._value(args, self._chan.wavelength_nm, o.sensor_min_nm, o.sensor_max_nm)

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

    async def _measure_current(self, args: str, s: list[int]) -> str:
        watts_text = await self._measure(args, s)
        watts = float(watts_text)
        if not self._chan.unit_watts:
            watts = 10 ** (watts / 10) * 1e-3
        return f"{watts * self.responsivity:.6E}"

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
