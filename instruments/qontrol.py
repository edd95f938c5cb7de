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
from dataclasses import dataclass
from typing import Any

from instruments.errors import (
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


class QontrolBoard(Instrument):
    """The board on its own: set and read channel voltages."""

    driver = "qontrol"
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=1.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.info: BoardInfo | None = None

    async def _on_connect(self, link: Link) -> None:
        self.info = await identify(link)

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
