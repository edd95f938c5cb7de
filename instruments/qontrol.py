"""Qontrol-style DAC/driver boards (Q8iv/Q8b modules, daisy-chained) over USB-serial at
115200 baud: the ASCII protocol of docs/protocols.md §5.1.

Whether a set command answers ``OK`` differs between boards, so every batch of set
commands is followed by a query (``nchan?``): its answer proves the batch was read, and any
``E<nn>:<ch>`` error line the batch caused arrives before it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from instruments.errors import (
    ConnectError,
    DeviceError,
    DeviceRestarted,
    InvalidRequest,
    NoSuchPort,
    ProtocolError,
)
from instruments.instrument import Instrument
from instruments.link import Link, LinkSettings
from instruments.numbers import reply_float, reply_int

MODULE_CHANNELS = 8
_ERROR = re.compile(r"^[A-Za-z]{1,3}(\d{1,9}):(\d{1,9})$", re.ASCII)
#: Most channels a board chain may report (256 modules of 8).
MAX_CHANNELS = 2048
#: Error codes (Qx output modules and common ones), for messages.
ERRORS = {0: "unknown error", 1: "over-voltage", 2: "over-current", 3: "power",
          4: "calibration", 5: "output", 10: "unrecognised command",
          11: "unrecognised parameter", 12: "unrecognised channel",
          13: "operation forbidden", 14: "serial buffer overflow",
          15: "serial communication error", 16: "command timed out", 17: "SPI", 18: "ADC",
          19: "I2C", 30: "too many errors", 31: "firmware trap", 90: "powered up"}


@dataclass(frozen=True)
class BoardInfo:
    id: str
    modules: list[str]
    channels: int
    vfull: float
    ifull: float


@dataclass(frozen=True)
class Limits:
    """Most a channel may be driven to: ``vmax`` (V) and ``imax`` (mA) for every channel
    of the board, and per channel (``channels``: channel → (vmax, imax), either None),
    the channel's own winning. A heater has a rating below the board's full scale; a
    wrong calibration or a wrong request must not drive full scale into it."""

    vmax: float | None = None
    imax: float | None = None
    channels: Mapping[int, tuple[float | None, float | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Limits:
        """From a driver's options: ``vmax``, ``imax`` and ``channel_limits`` (channel →
        ``{"vmax": V, "imax": mA}``)."""
        per = {int(ch): (values.get("vmax"), values.get("imax"))
               for ch, values in (options.get("channel_limits") or {}).items()}
        return cls(options.get("vmax"), options.get("imax"), per)

    def __bool__(self) -> bool:
        return self.vmax is not None or self.imax is not None or bool(self.channels)

    def limit(self, channel: int, word: str) -> float | None:
        """Channel ``channel``'s ``vmax`` (word ``v``) or ``imax`` (``i``); None for none."""
        own = self.channels.get(channel, (None, None))[0 if word == "v" else 1]
        if own is not None:
            return own
        return self.vmax if word == "v" else self.imax

    def name(self, channel: int, word: str) -> str:
        """The limit as a message names it: whose it is, its value and unit."""
        value = self.limit(channel, word)
        key, unit = ("vmax", "V") if word == "v" else ("imax", "mA")
        whose = f"channel {channel}'s" if channel in self.channels and \
            self.channels[channel][0 if word == "v" else 1] is not None else "the board's"
        return f"{whose} {key} of {value:g} {unit}"

    def wanted(self, channels: int) -> dict[str, float]:
        """The board's ``vmax<ch>``/``imax<ch>`` settings these limits make, on a board of
        ``channels`` channels."""
        settings: dict[str, float] = {}
        for word, key in (("v", "vmax"), ("i", "imax")):
            for ch in range(channels):
                value = self.limit(ch, word)
                if value is not None:
                    settings[f"{key}{ch}"] = value
        return settings


def board_error(line: str, command: str, instrument: str) -> DeviceError | None:
    """An ``E<nn>:<ch>`` line as a DeviceError; None for other lines and for the
    "powered up" notice a board sends when it starts."""
    match = _ERROR.match(line.strip())
    if not match:
        return None
    code, channel = int(match.group(1)), int(match.group(2))
    if code == 90:
        return None
    return DeviceError(code, f"{ERRORS.get(code, 'error')} on channel {channel}",
                       command=command, instrument=instrument)


async def ask(link: Link, command: str, lines: int = 1) -> list[str]:
    """Send a query and return its ``lines`` answer lines; error lines raise."""
    await link.write_query(command)
    answers: list[str] = []
    while len(answers) < lines:
        line = (await link.read_line()).strip()
        if not line or line.upper() == "OK":
            continue
        error = board_error(line, command, link.name)
        if error is not None:
            raise error
        if _ERROR.match(line):  # the powered-up notice
            continue
        answers.append(line)
    return answers


async def set_and_sync(link: Link, commands: Sequence[str]) -> None:
    """Send set commands, then ``nchan?``, in one write (a serial line is a byte stream: one
    write is one system call, and the board reads the lines as they come); raise the first
    error line the batch caused. A board that acknowledges set commands (``OK``) and
    answered fewer than were sent lost one on the line: a ProtocolError, so that the link is
    made again and the board's voltages read anew rather than believed."""
    await link.write_query(link.settings.write_termination.join([*commands, "nchan?"]))
    first_error: DeviceError | None = None
    acks = answered = 0
    while True:
        line = (await link.read_line()).strip()
        if not line:
            continue
        if line.upper() == "OK":
            acks += 1
            answered += 1
            continue
        error = board_error(line, "; ".join(commands), link.name)
        if error is not None:
            first_error = first_error or error
            answered += 1
            continue
        if _ERROR.match(line):
            continue
        if line.isdigit():
            break
        raise ProtocolError(f"unexpected line {line!r} after set commands",
                            instrument=link.name)
    if first_error is not None:
        raise first_error
    if acks and answered < len(commands):
        raise ProtocolError(f"the board answered {answered} of {len(commands)} set commands: "
                            "one was lost on the line", instrument=link.name)


async def probe(link: Link, ident: str) -> None:
    """``id?``: the board is there and is the one identified. A board that sends its
    "powered up" notice (``E90``) meanwhile has restarted: every channel is at 0 V."""
    await link.write_query("id?")
    while True:
        line = (await link.read_line()).strip()
        if not line or line.upper() == "OK":
            continue
        match = _ERROR.match(line)
        if match and int(match.group(1)) == 90:
            raise DeviceRestarted("the board says it powered up (E90): it restarted, its "
                                  "outputs at 0 V", instrument=link.name)
        error = board_error(line, "id?", link.name)
        if error is not None:
            raise error
        if line != ident:
            raise DeviceRestarted(f"id? now answers {line[:80]!r} (was {ident!r}): another "
                                  "board, or one that restarted", instrument=link.name)
        return


async def ask_each(link: Link, queries: Sequence[str]) -> list[str]:
    """Send several one-line queries in one write and return their answers in order: one
    round trip, not one a query (a USB-serial adapter holds each reply up to its latency
    timer, 16 ms by default on an FTDI)."""
    if not queries:
        return []
    await link.write_query(link.settings.write_termination.join(queries))
    answers: list[str] = []
    while len(answers) < len(queries):
        line = (await link.read_line()).strip()
        if not line or line.upper() == "OK":
            continue
        error = board_error(line, "; ".join(queries), link.name)
        if error is not None:
            raise error
        if _ERROR.match(line):  # the powered-up notice
            continue
        answers.append(line)
    return answers


async def program_limits(link: Link, limits: Limits, info: BoardInfo) -> dict[str, float]:
    """Make the board's own ``VMAX``/``IMAX`` what ``limits`` say, so that the board
    refuses what labd would (a second guard, and one for any other client on the line).
    Reads them first and writes only those that differ; reads those back. Returns what
    differed (setting → what the board held): on a reconnect, a board that restarted or
    that someone else set. A limit beyond the board's full scale, or one the board does
    not keep, is a ConnectError."""
    beyond = sorted(ch for ch in limits.channels if not 0 <= ch < info.channels)
    if beyond:
        raise ConnectError(f"limits are given for channel {beyond[0]}, but the board drives "
                           f"channels 0..{info.channels - 1}; fix the lab file",
                           instrument=link.name)
    wanted = limits.wanted(info.channels)
    for setting, value in wanted.items():
        full, unit = (info.vfull, "V") if setting.startswith("v") else (info.ifull, "mA")
        if not 0 < value <= full:
            raise ConnectError(f"{setting[:4]} {value:g} {unit} for channel {setting[4:]} is "
                               f"beyond the board's full scale of {full:g} {unit}; fix the "
                               "lab file's limit", instrument=link.name)
    names = list(wanted)
    held = [reply_float(text, f"{name}?", link.name)
            for name, text in zip(names, await ask_each(link, [f"{n}?" for n in names]),
                                  strict=True)]
    differed = {name: value for name, value, want in zip(names, held, wanted.values(),
                                                         strict=True)
                if abs(value - want) > 5e-5}
    if differed:
        await set_and_sync(link, [f"{name}={number(wanted[name])}" for name in differed])
        again = await ask_each(link, [f"{name}?" for name in differed])
        for name, text in zip(differed, again, strict=True):
            if abs(reply_float(text, f"{name}?", link.name) - wanted[name]) > 5e-5:
                raise ConnectError(f"the board did not keep {name}={number(wanted[name])} "
                                   f"(reads {text.strip()[:20]})", instrument=link.name)
    return differed


def refuse_beyond(limits: Limits, values: Mapping[int, float], word: str,
                  instrument: str) -> None:
    """InvalidRequest naming the first value beyond its channel's limit, before anything
    is sent."""
    unit = "V" if word == "v" else "mA"
    for channel, value in values.items():
        limit = limits.limit(channel, word)
        if limit is not None and value > limit:
            raise InvalidRequest(f"{value:g} {unit} on channel {channel} is beyond "
                                 f"{limits.name(channel, word)}; nothing was sent",
                                 instrument=instrument)


def number(value: float) -> str:
    """A value as the board is sent it: 4 decimals (the board's resolution), without the
    trailing zeros (at 115200 baud every byte costs 87 µs: ``0`` and ``5`` rather than
    ``0.0000`` and ``5.0000`` are most of a mesh change's bytes saved)."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


#: The board's answer to a set command that acknowledges (``OK`` and LF), counted on both
#: ways of the line.
_ACK_BYTES = 3


def vector_commands(volts: Mapping[int, float], word: str = "v",
                    known: Mapping[int, float] | None = None) -> list[str]:
    """The fewest bytes on the line (both ways) that set ``volts``: per module (a vector
    command stays in its module, as the vendor client sends it), each run of channels as
    one ``vvec``/``ivec`` or each channel as ``v<ch>=``/``i<ch>=``, whichever is shorter.
    A vector may run over a channel that does not change if ``known`` says what that
    channel holds: it is sent again unchanged."""
    known = known or {}
    by_module: dict[int, dict[int, str]] = {}
    for channel, v in volts.items():
        by_module.setdefault(channel // MODULE_CHANNELS, {})[channel] = number(v)
    commands: list[str] = []
    for _, values in sorted(by_module.items()):
        commands.extend(_module_commands(values, known, word))
    return commands


def _module_commands(values: dict[int, str], known: Mapping[int, float], word: str
                     ) -> list[str]:
    """One module's commands: the cheapest cover of its changed channels by runs (a few
    channels a module, so every split is tried)."""
    channels = sorted(values)

    def run(i: int, j: int) -> str | None:
        first, last = channels[i], channels[j]
        if i == j:
            return f"{word}{first}={values[first]}"
        texts = []
        for c in range(first, last + 1):
            if c in values:
                texts.append(values[c])
            elif c in known:
                texts.append(number(known[c]))
            else:
                return None  # what the board holds there is not known: not sent over
        return f"{word}vec{first}=" + ",".join(texts)

    # best[j]: (bytes, commands) covering channels[:j]
    best: list[tuple[int, list[str]]] = [(0, [])]
    for j in range(1, len(channels) + 1):
        options = []
        for i in range(j):
            command = run(i, j - 1)
            if command is not None:
                cost, before = best[i]
                options.append((cost + len(command) + 1 + _ACK_BYTES, [*before, command]))
        best.append(min(options, key=lambda option: option[0]))
    return best[-1][1]


async def identify(link: Link) -> BoardInfo:
    """The start-up sequence of the vendor client: id, reset the chain, read it, limits."""
    (ident,) = await ask(link, "id?")
    (count,) = await ask(link, "nchan?")
    await set_and_sync(link, ["nup=0"])
    channels = reply_int(count, "nchan?", link.name, what="a channel count")
    if not 1 <= channels <= MAX_CHANNELS:
        raise ProtocolError(f"'nchan?' answered {channels}, expected 1..{MAX_CHANNELS}",
                            instrument=link.name)
    chain = await ask(link, "nupall?", max(1, math.ceil(channels / MODULE_CHANNELS)))
    (vfull,) = await ask(link, "vfull?")
    (ifull,) = await ask(link, "ifull?")
    full = [reply_float((text.split() or [""])[0], query, link.name,
                        what="'<value> <unit>'") for text, query in ((vfull, "vfull?"),
                                                                    (ifull, "ifull?"))]
    return BoardInfo(ident, [c.split(":")[0].strip() for c in chain], channels, *full)


async def read_all(link: Link, channels: int, word: str = "v") -> list[float]:
    """Every channel's voltage (``vall?``) or current (``iall?``, mA)."""
    query = f"{word}all?"
    return [reply_float(v, query, link.name) for v in await ask(link, query, channels)]


async def read_volts(link: Link, channels: int) -> list[float]:
    return await read_all(link, channels, "v")


def limits_reset(differed: Mapping[str, float], limits: Limits, info: BoardInfo) -> str:
    """The warning for a board found, on reconnecting, with other limits than labd set."""
    wanted = limits.wanted(info.channels)
    shown = ", ".join(f"{name} {held:g} → {wanted[name]:g}"
                      for name, held in list(differed.items())[:8])
    more = f" and {len(differed) - 8} more" if len(differed) > 8 else ""
    return (f"the board's limits were not those labd set (restarted, or set by another "
            f"client): {shown}{more}; set again")


class QontrolBoard(Instrument):
    """The board on its own: set and read channel voltages."""

    driver = "qontrol"
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=1.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.info: BoardInfo | None = None
        self.limits = Limits.of(self.options)
        """Options ``vmax`` (V), ``imax`` (mA) and ``channel_limits`` (channel →
        ``{"vmax": V, "imax": mA}``): programmed into the board at every connect."""

    async def _on_connect(self, link: Link) -> None:
        info = await identify(link)
        differed = await program_limits(link, self.limits, info)
        if differed and self.info is not None:
            self._warn(limits_reset(differed, self.limits, info))
        self.info = info

    async def _probe(self, link: Link) -> None:
        assert self.info is not None
        await probe(link, self.info.id)

    def _check(self, channel: int, value: float, full: float, unit: str) -> None:
        info = self.info
        if info is None:
            raise InvalidRequest("board not identified yet; open it first", instrument=self.name)
        if not 0 <= channel < info.channels:
            raise NoSuchPort(f"channel {channel} is not on this board "
                                 f"(0..{info.channels - 1})", instrument=self.name)
        if not 0 <= value <= full:
            raise InvalidRequest(f"{value} {unit} on channel {channel}: the board gives "
                                 f"0..{full} {unit}", instrument=self.name)
        refuse_beyond(self.limits, {channel: value}, "v" if unit == "V" else "i", self.name)

    async def set_volts(self, volts: dict[int, float]) -> None:
        """Set channel voltages (V): per module, runs of channels as vector commands."""
        for channel, v in volts.items():
            self._check(channel, v, self.info.vfull if self.info else 0.0, "V")
        await self._run(lambda link: set_and_sync(link, vector_commands(volts, "v")))

    async def set_currents(self, currents: dict[int, float]) -> None:
        """Set channel currents (mA)."""
        for channel, ma in currents.items():
            self._check(channel, ma, self.info.ifull if self.info else 0.0, "mA")
        await self._run(lambda link: set_and_sync(link, vector_commands(currents, "i")))

    async def volts(self) -> list[float]:
        assert self.info is not None
        channels = self.info.channels
        return await self._run(lambda link: read_all(link, channels, "v"))

    async def currents(self) -> list[float]:
        assert self.info is not None
        channels = self.info.channels
        return await self._run(lambda link: read_all(link, channels, "i"))
