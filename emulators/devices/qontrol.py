"""A Qontrol-style DAC/driver board (Q8iv modules, daisy-chained) on a USB-serial port,
driving the heaters of a photonic mesh. ASCII protocol per docs/protocols.md §5.1:
``V3=1.2`` / ``V3?`` / ``VALL?`` / ``VVEC0=v0,v1,...`` / ``VFULL?`` / ``NCHAN?`` / ``ID?`` /
``NUP=0`` / ``NUPALL?``, LF-terminated, case-insensitive; errors as ``E<nn>:<ch>`` lines.

Options for the [?] items: ``ack`` (set commands answer ``OK``; default true),
``error_padding`` (``E01:05``, true, or ``E1:5``), ``powered_up`` (send ``E90:00`` when
the port opens), ``heater_ohms`` (each channel's load: the current a voltage draws).

Limits: a set beyond a channel's ``VMAX`` is refused with ``E01:<ch>`` (nothing applied);
a voltage whose current would pass the channel's ``IMAX`` is limited to ``IMAX`` (the
board's compliance) and answered ``E02:<ch>``; both are alarms kept per channel
(``alarms``), and every set command received is logged (``writes``). Mesh options:
``ports``, ``coupler_error``, ``tau_us``, ``v_pi``, ``calibration_error``, ``seed``.
Fault: ``dead_heater`` (``channel``).
"""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

from emulators.physics.mesh import MeshModel, MeshOptions
from emulators.wire.faults import Faults
from emulators.wire.numbers import wire_float, wire_int
from emulators.wire.server import Interface, Session, SessionInterface

log = logging.getLogger(__name__)
MODULE_CHANNELS = 8
VFULL = 12.0
IFULL = 24.0
_COMMAND = re.compile(r"^([A-Za-z]+?)(\d*)\s*([=?])\s*(.*)$")
_WORDS = {"V", "I", "VMAX", "IMAX", "VALL", "IALL", "VVEC", "IVEC", "VFULL", "IFULL",
          "NCHAN", "ID", "FIRMWARE", "LIFETIME", "NUP", "NUPALL"}


@dataclass
class QontrolOptions(MeshOptions):
    """The chip's options (MeshOptions) and the board's."""

    ack: bool = True
    error_padding: bool = True
    powered_up: bool = True
    serial_base: int = 0x01A0
    heater_ohms: float = 500.0

    def mesh(self) -> MeshOptions:
        names = {f.name for f in fields(MeshOptions)}
        return MeshOptions(**{k: v for k, v in vars(self).items() if k in names})


class QontrolError(Exception):
    def __init__(self, code: int, channel: int = 0) -> None:
        self.code, self.channel = code, channel


class MeshDevice:
    """The board and the chip it drives: heater channel c drives MZI c."""

    kind = "mesh"

    def __init__(self, name: str, options: QontrolOptions, timing: Any = None) -> None:
        self.name = name
        self.options = options
        self.mesh = MeshModel(name, options.mesh())
        self.modules = math.ceil(self.mesh.elements / MODULE_CHANNELS)
        self.channels = self.modules * MODULE_CHANNELS
        self.volts = [0.0] * self.channels
        self.current = [0.0] * self.channels
        self.vmax = [VFULL] * self.channels
        self.imax = [IFULL] * self.channels
        self.alarms: dict[int, str] = {}
        """Channels driven past a limit: channel → ``over-voltage`` or ``over-current``."""
        self.writes: deque[tuple[str, int, tuple[float, ...]]] = deque(maxlen=100_000)
        """Every set command received, refused or not: (word, first channel, values)."""
        self.faults = Faults()
        self.serial = SessionInterface("serial", b"\n", lambda: QontrolSession(self))

    def interfaces(self) -> dict[str, Interface]:
        return {"serial": self.serial}

    def transmissions(self, port: int, times: Any) -> Any:
        return self.mesh.transmissions(port, times)

    def reset(self) -> None:
        # A power cycle: outputs at 0 V and the limits back at full scale, as a board
        # keeps none of its settings.
        self.volts = [0.0] * self.channels
        self.current = [0.0] * self.channels
        self.vmax = [VFULL] * self.channels
        self.imax = [IFULL] * self.channels
        self.alarms = {}
        self.mesh.reset()
        self.faults.clear()

    def boot(self) -> None:
        self.reset()

    def snapshot(self) -> dict[str, Any]:
        data = self.mesh.snapshot()
        data["volts"] = [round(v, 4) for v in self.volts]
        data["alarms"] = {str(ch): what for ch, what in sorted(self.alarms.items())}
        return data

    def module_id(self, index: int) -> str:
        return f"Q8iv-{self.options.serial_base + index:04X}"

    def set_volts(self, start: int, values: list[float], arrived_ns: int) -> None:
        for offset, v in enumerate(values):
            ch = start + offset
            if not 0 <= ch < self.channels:
                raise QontrolError(12, ch)
            if not 0.0 <= v <= min(self.vmax[ch], VFULL):
                if v > 0:
                    self.alarms[ch] = "over-voltage"
                raise QontrolError(1, ch)
        limited: int | None = None
        for offset, v in enumerate(values):
            ch = start + offset
            ma = v / self.options.heater_ohms * 1000
            if ma > self.imax[ch]:  # compliance: the current held at IMAX
                ma, v = self.imax[ch], self.imax[ch] * self.options.heater_ohms / 1000
                self.alarms[ch] = "over-current"
                limited = ch if limited is None else limited
            self.volts[ch], self.current[ch] = v, ma
            values[offset] = v
        heaters = {start + i: v for i, v in enumerate(values)
                   if start + i < self.mesh.elements}
        if heaters:
            self.mesh.apply_voltages(heaters, arrived_ns, "serial")
        if limited is not None:
            raise QontrolError(2, limited)




def _is_number(text: str) -> bool:
    try:
        wire_float(text)
    except ValueError:
        return False
    return True


class QontrolSession(Session):
    garbage = b"\x15\xfe?garbage\n"

    def __init__(self, device: MeshDevice) -> None:
        self.device = device

    async def greeting(self) -> bytes:
        return self._error(90, 0) if self.device.options.powered_up else b""

    def _error(self, code: int, channel: int) -> bytes:
        if self.device.options.error_padding:
            return f"E{code:02d}:{channel:02d}\n".encode()
        return f"E{code}:{channel}\n".encode()

    def overlong(self) -> bytes | None:
        return self._error(14, 0)  # serial buffer overflow

    def failed(self) -> bytes | None:
        return self._error(0, 0)

    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None:
        text = message.decode("ascii", "replace").strip()
        if not text:
            return None
        try:
            lines = self._execute(text, arrived_ns)
        except QontrolError as exc:
            return self._error(exc.code, exc.channel)
        except Exception as exc:
            # Whatever a client sends, the serial session lives on: the line is refused
            # like any other bad one, and the device's log says what went wrong.
            log.warning("Qontrol %r failed: %s: %s", text[:32], type(exc).__name__, exc)
            return self._error(0, 0)
        if lines is None:
            return b"OK\n" if self.device.options.ack else None
        return "".join(f"{line}\n" for line in lines).encode()

    def _execute(self, text: str, arrived_ns: int) -> list[str] | None:
        match = _COMMAND.match(text)
        if not match or match.group(1).upper() not in _WORDS:
            raise QontrolError(10)
        word, number, op, value = (match.group(1).upper(), match.group(2), match.group(3),
                                   match.group(4).strip())
        d = self.device
        try:
            ch = wire_int(number) if number else 0
        except ValueError:
            raise QontrolError(12, 0) from None
        if op == "?":
            if word in ("V", "I", "VMAX", "IMAX"):
                if not 0 <= ch < d.channels:
                    raise QontrolError(12, ch)
                table = {"V": d.volts, "I": d.current, "VMAX": d.vmax, "IMAX": d.imax}
                return [f"{table[word][ch]:.4f}"]
            if word == "VALL":
                return [f"{v:.4f}" for v in d.volts]
            if word == "IALL":
                return [f"{i:.4f}" for i in d.current]
            if word == "VFULL":
                return [f"{VFULL:.1f} V"]
            if word == "IFULL":
                return [f"{IFULL:.1f} mA"]
            if word == "NCHAN":
                return [str(d.channels)]
            if word == "ID":
                return [d.module_id(0)]
            if word == "FIRMWARE":
                return ["2.4.1"]
            if word == "LIFETIME":
                return ["1234"]
            if word == "NUPALL":
                return [f"{d.module_id(i)} : {i}" for i in range(d.modules)]
            raise QontrolError(10)
        # op == "="
        logged = tuple(wire_float(v) for v in value.split(",") if _is_number(v))
        d.writes.append((word, ch, logged))
        try:
            numbers = [wire_float(v) for v in value.split(",")] if value else []
        except ValueError:
            raise QontrolError(11, ch) from None
        if not numbers:
            raise QontrolError(11, ch)
        if word == "V":
            d.set_volts(ch, numbers[:1], arrived_ns)
        elif word == "VVEC":
            d.set_volts(ch, numbers, arrived_ns)
        elif word in ("VMAX", "IMAX"):
            if not 0 <= ch < d.channels:
                raise QontrolError(12, ch)
            full, code = (VFULL, 1) if word == "VMAX" else (IFULL, 2)
            if not 0.0 <= numbers[0] <= full:
                raise QontrolError(code, ch)
            (d.vmax if word == "VMAX" else d.imax)[ch] = numbers[0]
        elif word in ("I", "IVEC"):
            for offset, value_ma in enumerate(numbers):
                if not 0 <= ch + offset < d.channels:
                    raise QontrolError(12, ch + offset)
                if not 0 <= value_ma <= d.imax[ch + offset]:
                    raise QontrolError(2, ch + offset)
                d.current[ch + offset] = value_ma
        elif word == "NUP":
            pass
        else:
            raise QontrolError(13, ch)
        return None
