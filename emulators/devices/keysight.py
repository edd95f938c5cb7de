"""A Keysight N7744A/N7745A multiport optical power meter over SCPI (TCP 5025), following
docs/protocols.md §4.1: per-channel wavelength, unit, range, averaging time, single reads, and
the logging function whose result is an IEEE 488.2 block of little-endian float32.

Options: ``model`` (N7744A: 4 channels, N7745A: 8), ``serial``, ``firmware``,
``overrange`` (the over-range sentinel, [?]: 9.91E37 by default), ``noise_db``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emulators.physics.crossconnect import sleep_until
from emulators.physics.meters import MeterModel, SensorMissing
from emulators.wire.faults import Faults
from emulators.wire.numbers import wire_int
from emulators.wire.scpi import (
    ScpiDeviceSession,
    ScpiError,
    definite_block,
    parse_bool,
    parse_enum,
    parse_number,
)
from emulators.wire.server import Interface, SessionInterface

CHANNELS = {"N7744A": 4, "N7745A": 8, "N7744C": 4, "N7745C": 8}
MAX_LOG_POINTS = 1_000_000
#: Log points worked out between turns of the loop (a few tenths of a millisecond).
LOG_SLICE = 100
#: Power-on (and ``*RST``) settings of every channel, as docs/protocols.md §4.1 answers them:
#: ``:SENS<n>:POW:ATIM?`` 1.000000E-01, ``:UNIT?`` 0 (dBm), ``:WAV?`` 1.55000E-06, auto range.
POWER_ON_ATIME_S = 0.1
POWER_ON_NM = 1550.0
#: The trigger input responses, long form as the programming guide writes them: a client
#: may send either (``:TRIG1:INP CMEASURE`` or ``CME``); the reply is the short form.
TRIGGER_INPUTS = ("IGNore", "SMEasure", "CMEasure", "MMEasure")


@dataclass
class KeysightOptions:
    model: str = "N7744A"
    serial: str = "MY12345678"
    firmware: str = "1.220"
    overrange: float = 9.91e37
    noise_db: float = 0.01
    seed: int | None = None


@dataclass
class Logging:
    points: int = 100
    atime_s: float = 1e-4
    running: bool = False
    armed: bool = False  # waiting for a trigger (TRIG:INP CME)
    start_ns: int = 0
    result: np.ndarray | None = None
    trigger: str = "IGN"

    @property
    def end_ns(self) -> int:
        return self.start_ns + int(self.points * self.atime_s * 1e9)


@dataclass
class ChannelExtras:
    """Settings a third-party client sets at connect that labd never uses: the relative
    reference (``:POW:REF``), the input loss correction (``:CORR``) and the logging
    function's loop count (``:FUNC:LOOP``), kept and read back, not applied to readings."""

    reference_on: bool = False
    reference_db: float = 0.0
    correction_db: float = 0.0
    loops: int = 1


@dataclass
class KeysightState:
    logging: dict[int, Logging] = field(default_factory=dict)


class KeysightMeter:
    kind = "keysight"

    def __init__(self, name: str, options: KeysightOptions, timing: Any = None) -> None:
        if options.model not in CHANNELS:
            raise ValueError(f"Keysight model {options.model!r}: expected one of "
                             f"{', '.join(CHANNELS)}")
        self.name = name
        self.options = options
        self.meter = MeterModel(name, CHANNELS[options.model], noise_db=options.noise_db,
                                overrange=options.overrange, atime_s=POWER_ON_ATIME_S,
                                unit_watts=False, wavelength_nm=POWER_ON_NM, seed=options.seed)
        self.faults = Faults()
        self.logs = {c: Logging() for c in range(1, self.meter.channels + 1)}
        self.extras = {c: ChannelExtras() for c in range(1, self.meter.channels + 1)}
        self.scpi = SessionInterface("scpi", b"\n", lambda: KeysightSession(self))

    def interfaces(self) -> dict[str, Interface]:
        return {"scpi": self.scpi}

    def reset(self) -> None:
        self.meter.reset()
        self.faults.clear()
        self.logs = {c: Logging() for c in range(1, self.meter.channels + 1)}
        self.extras = {c: ChannelExtras() for c in range(1, self.meter.channels + 1)}

    def preset(self) -> None:
        """``*RST``: every channel's power-on settings (docs/protocols.md §4.1: dBm, 0.1 s
        averaging, 1550 nm, auto range), no logging function, trigger ``IGN``; the heads
        and injected faults stay."""
        self.meter.preset()
        self.logs = {c: Logging() for c in range(1, self.meter.channels + 1)}
        self.extras = {c: ChannelExtras() for c in range(1, self.meter.channels + 1)}

    def boot(self) -> None:
        self.reset()

    def snapshot(self) -> dict[str, Any]:
        return {"channels": {str(c): {"wavelength_nm": s.wavelength_nm,
                                      "unit": "W" if s.unit_watts else "dBm",
                                      "atime_s": s.atime_s, "fault": s.fault,
                                      "logging": self.logs[c].running}
                             for c, s in self.meter.state.items()}}

    def idn(self) -> str:
        return f"Keysight Technologies,{self.options.model},{self.options.serial}," \
               f"{self.options.firmware}"




class KeysightSession(ScpiDeviceSession):
    garbage = b"\x15#!?garbage\n"

    def __init__(self, device: KeysightMeter) -> None:
        self.device = device
        self.meter = device.meter
        sense = ":SENSe[:CHANnel]"  # :SENS1:CHAN1:POW:WAV? on the 816x-style tree
        table = {
            "*IDN?": lambda a, s: device.idn(),
            "*RST": self._rst,
            "*CLS": lambda a, s: self.state.errors.clear(),
            "*OPC?": lambda a, s: "1",
            "*ESR?": lambda a, s: "0",
            ":SYSTem:ERRor[:NEXT]?": lambda a, s: self.state.pop_error(),
            f"{sense}:POWer:WAVelength": self._set_wavelength,
            f"{sense}:POWer:WAVelength?": lambda a, s: f"{self._ch(s).wavelength_nm * 1e-9:.5E}",
            f"{sense}:POWer:UNIT": self._set_unit,
            f"{sense}:POWer:UNIT?": lambda a, s: "1" if self._ch(s).unit_watts else "0",
            f"{sense}:POWer:RANGe[:UPPer]": self._set_range,
            f"{sense}:POWer:RANGe[:UPPer]?": lambda a, s: f"{self._ch(s).range_dbm:+.0f}",
            f"{sense}:POWer:RANGe:AUTO": self._set_auto,
            f"{sense}:POWer:RANGe:AUTO?": lambda a, s: "1" if self._ch(s).auto_range else "0",
            f"{sense}:POWer:GAIN:AUTO": lambda a, s: self._touch(s) and None,
            f"{sense}:POWer:GAIN:AUTO?": lambda a, s: "1",
            f"{sense}:POWer:ATIMe": self._set_atime,
            f"{sense}:POWer:ATIMe?": lambda a, s: f"{self._ch(s).atime_s:.6E}",
            f"{sense}:POWer:REFerence:STATe": self._set_reference_state,
            f"{sense}:POWer:REFerence:STATe?": lambda a, s: (
                "1" if self._extra(s).reference_on else "0"),
            f"{sense}:POWer:REFerence[:VALue]": self._set_reference,
            f"{sense}:POWer:REFerence[:VALue]?": lambda a, s: (
                f"{self._extra(s).reference_db:+.6E}"),
            f"{sense}:CORRection[:LOSS][:INPut][:MAGNitude]": self._set_correction,
            f"{sense}:CORRection[:LOSS][:INPut][:MAGNitude]?": lambda a, s: (
                f"{self._extra(s).correction_db:+.6E}"),
            f"{sense}:CORRection:COLLect:ZERO": self._zero,
            ":SENSe:CORRection:COLLect:ZERO:ALL": self._zero_all,
            ":READ[:CHANnel][:SCALar]:POWer[:DC]?": self._read,
            ":FETCh[:CHANnel][:SCALar]:POWer[:DC]?": self._fetch,
            ":FETCh:POWer:ALL[:CSV]?": self._fetch_all,
            ":INITiate[:CHANnel]:IMMediate": lambda a, s: None,
            ":INITiate[:CHANnel]:CONTinuous": lambda a, s: None,
            ":TRIGger[:CHANnel]:INPut": self._set_trigger,
            ":TRIGger[:CHANnel]:INPut?": lambda a, s: self._log(s).trigger,
            ":TRIGger": self._software_trigger,
            f"{sense}:FUNCtion:PARameter:LOGGing": self._set_logging,
            f"{sense}:FUNCtion:PARameter:LOGGing?": lambda a, s: (
                f"{self._log(s).points},{self._log(s).atime_s:.6E}"),
            f"{sense}:FUNCtion:LOOP": self._set_loop,
            f"{sense}:FUNCtion:LOOP?": lambda a, s: str(self._extra(s).loops),
            f"{sense}:FUNCtion:STATe": self._function,
            f"{sense}:FUNCtion:STATe?": self._function_state,
            f"{sense}:FUNCtion:RESult?": self._result,
        }
        super().__init__(self._with_module_channel(table), error_format='{signed},"{text}"')


    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _with_module_channel(table: dict[str, Any]) -> dict[str, Any]:
        """``[:CHANnel]`` (always the second node) spelled out: an N774x has one module, so
        its channel suffix must be 1 (-114 otherwise) and is dropped before the handler,
        which reads the ``SENSe``/``READ``/``TRIGger`` suffix as the meter channel."""
        def module_one(handler: Any) -> Any:
            def checked(args: str, suffixes: list[int]) -> Any:
                if len(suffixes) > 1 and suffixes[1] != 1:
                    raise ScpiError(-114, "Header suffix out of range; CHANnel 1 only")
                return handler(args, suffixes[:1] + suffixes[2:])
            return checked

        out = {}
        for pattern, handler in table.items():
            if "[:CHANnel]" in pattern:
                out[pattern.replace("[:CHANnel]", "")] = handler
                out[pattern.replace("[:CHANnel]", ":CHANnel")] = module_one(handler)
            else:
                out[pattern] = handler
        return out

    def _channel(self, suffixes: list[int]) -> int:
        channel = suffixes[0] if suffixes else 1
        if channel not in self.meter.state:
            raise ScpiError(-114, f"Header suffix out of range; channels 1..{self.meter.channels}")
        return channel

    def _ch(self, suffixes: list[int]) -> Any:
        return self.meter.state[self._channel(suffixes)]

    def _log(self, suffixes: list[int]) -> Logging:
        return self.device.logs[self._channel(suffixes)]

    def _extra(self, suffixes: list[int]) -> ChannelExtras:
        return self.device.extras[self._channel(suffixes)]

    def _set_reference_state(self, args: str, s: list[int]) -> None:
        self._touch(s)
        self._extra(s).reference_on = parse_bool(args)

    def _set_reference(self, args: str, s: list[int]) -> None:
        value = parse_number(args, ("DB", "DBM", "W", "MW", "UW", "NW"))
        if not -200 <= value <= 200:
            raise ScpiError(-222, "Data out of range; reference -200 to +200 dB")
        self._touch(s)
        self._extra(s).reference_db = value

    def _set_correction(self, args: str, s: list[int]) -> None:
        value = parse_number(args, ("DB",))
        if not -200 <= value <= 200:
            raise ScpiError(-222, "Data out of range; correction -200 to +200 dB")
        self._touch(s)
        self._extra(s).correction_db = value

    def _set_loop(self, args: str, s: list[int]) -> None:
        try:
            loops = wire_int(args)
        except ValueError:
            raise ScpiError(-104, "Data type error; expected a whole number") from None
        if not 0 <= loops <= MAX_LOG_POINTS:
            raise ScpiError(-222, f"Data out of range; 0..{MAX_LOG_POINTS} loops")
        self._touch(s)
        self._extra(s).loops = loops

    def _touch(self, suffixes: list[int]) -> bool:
        """Setting any property stops a running logging function (as on the device)."""
        log = self._log(suffixes)
        log.running = log.armed = False
        return True

    def _rst(self, args: str, _: list[int]) -> None:
        self.state.errors.clear()
        self.device.preset()

    def _set_wavelength(self, args: str, s: list[int]) -> None:
        metres = parse_number(args, ("M", "NM", "UM", "PM", "MM"))
        if not 1.2e-6 <= metres <= 1.7e-6:
            raise ScpiError(-222, "Data out of range; wavelength 1200-1700 nm")
        self._touch(s)
        self._ch(s).wavelength_nm = metres * 1e9

    def _set_unit(self, args: str, s: list[int]) -> None:
        value = args.strip().upper()
        if value not in ("0", "1", "DBM", "W", "WATT"):
            raise ScpiError(-224, "Illegal parameter value; expected 0, 1, DBM or W")
        self._touch(s)
        self._ch(s).unit_watts = value in ("1", "W", "WATT")

    def _set_range(self, args: str, s: list[int]) -> None:
        value = parse_number(args, ("DBM",))
        if value not in (10, 0, -10, -20, -30):
            raise ScpiError(-222, "Data out of range; ranges +10, 0, -10, -20, -30 dBm")
        self._touch(s)
        channel = self._ch(s)
        channel.range_dbm, channel.auto_range = value, False

    def _set_auto(self, args: str, s: list[int]) -> None:
        self._touch(s)
        self._ch(s).auto_range = parse_bool(args)

    def _set_atime(self, args: str, s: list[int]) -> None:
        seconds = parse_number(args, ("S", "MS", "US"))
        if not 1e-6 <= seconds <= 10:
            raise ScpiError(-222, "Data out of range; averaging time 1 us to 10 s")
        self._touch(s)
        self._ch(s).atime_s = seconds

    def _zero(self, args: str, s: list[int]) -> None:
        channel = self._ch(s)
        dark = self._windows(self._channel(s), self.arrived_ns, channel.atime_s, 1)
        channel.offset_db = float(dark[0]) + 90.0 if np.isfinite(dark[0]) else 0.0

    def _zero_all(self, args: str, s: list[int]) -> None:
        for channel in self.meter.state:
            self._zero(args, [channel])

    def _windows(self, channel: int, start_ns: int, atime_s: float, count: int) -> np.ndarray:
        try:
            return self.meter.windows_dbm(channel, start_ns, atime_s, count)
        except SensorMissing:
            raise ScpiError(-241, "Hardware missing; no sensor") from None

    async def _log_windows(self, channel: int, start_ns: int, atime_s: float, count: int
                           ) -> np.ndarray:
        """A whole log, worked out a slice at a time with the loop free in between: a long
        log of a moving mesh takes tens of ms, which must not make another device's reply
        late (on hardware each device has its own processor)."""
        width = max(1, int(atime_s * 1e9))
        parts = []
        for first in range(0, count, LOG_SLICE):
            n = min(LOG_SLICE, count - first)
            parts.append(self._windows(channel, start_ns + first * width, atime_s, n))
            if first + n < count:
                await asyncio.sleep(0)
        return np.concatenate(parts) if parts else np.empty(0)

    async def _read(self, args: str, s: list[int]) -> str:
        channel = self._channel(s)
        atime = self.meter.state[channel].atime_s
        start = max(self.arrived_ns, time.monotonic_ns())
        await sleep_until(start + int(atime * 1e9))  # the measurement takes its window
        dbm = self._windows(channel, start, atime, 1)
        return f"{self.meter.in_unit(channel, dbm)[0]:+.6E}"

    def _fetch(self, args: str, s: list[int]) -> str:
        channel = self._channel(s)
        state = self.meter.state[channel]
        return f"{self.meter.in_unit(channel, np.array([state.last_dbm]))[0]:+.6E}"

    def _fetch_all(self, args: str, s: list[int]) -> bytes:
        values = [self.meter.in_unit(c, np.array([st.last_dbm]))[0]
                  for c, st in self.meter.state.items()]
        return definite_block(np.asarray(values, dtype="<f4").tobytes())

    def _set_trigger(self, args: str, s: list[int]) -> None:
        trigger = parse_enum(args, TRIGGER_INPUTS)
        self._touch(s)
        self._log(s).trigger = trigger

    def _software_trigger(self, args: str, s: list[int]) -> None:
        for log in self.device.logs.values():
            if log.armed:
                log.armed, log.running, log.start_ns = False, True, self.arrived_ns

    def _set_logging(self, args: str, s: list[int]) -> None:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(-109, "Missing parameter; expected <points>,<averaging time>")
        try:
            points = wire_int(parts[0])
        except ValueError:
            raise ScpiError(-104, "Data type error; points must be a whole number") from None
        atime = parse_number(parts[1], ("S", "MS", "US"))
        if not 1 <= points <= MAX_LOG_POINTS or not 1e-6 <= atime <= 10:
            raise ScpiError(-222, f"Data out of range; 1..{MAX_LOG_POINTS} points, "
                                  "1 us..10 s")
        log = self._log(s)
        if log.running or log.armed:
            raise ScpiError(-221, "Settings conflict; stop the logging function first")
        log.points, log.atime_s, log.result = points, atime, None

    def _function(self, args: str, s: list[int]) -> None:
        function, _, action = (p.strip().upper() for p in args.partition(","))
        try:
            parse_enum(function, ("LOGGing",))
            action = parse_enum(action, ("STARt", "STOP"))
        except ScpiError:
            raise ScpiError(-224, "Illegal parameter value; expected LOGG,STAR or LOGG,STOP"
                            ) from None
        log = self._log(s)
        log.result = None
        if action == "STOP":
            log.running = log.armed = False
        elif log.trigger == "CME":
            log.armed, log.running = True, False
        else:
            log.running, log.armed, log.start_ns = True, False, self.arrived_ns

    def _function_state(self, args: str, s: list[int]) -> str:
        log = self._log(s)
        if log.armed or (log.running and time.monotonic_ns() < log.end_ns):
            return "LOGGING_STABILITY,PROGRESS"
        if log.running or log.result is not None:
            return "LOGGING_STABILITY,COMPLETE"
        return "NONE,COMPLETE"

    async def _result(self, args: str, s: list[int]) -> bytes:
        channel = self._channel(s)
        log = self.device.logs[channel]
        if log.result is None:
            if not log.running:
                raise ScpiError(-230, "Data corrupt or stale; no logging result")
            # Asking before the log completes blocks, as the device does (clients time out).
            await sleep_until(log.end_ns)
            if log.running:
                dbm = await self._log_windows(channel, log.start_ns, log.atime_s, log.points)
                log.result = self.meter.in_unit(channel, dbm)
        return definite_block(np.asarray(log.result, dtype="<f4").tobytes())


__all__ = ["KeysightMeter", "KeysightOptions"]
