"""HUBER+SUHNER Polatis over SCPI (raw TCP 5025, or the serial console).

Every change is sent as one program message ``<change>;*OPC?;:SYST:ERR?``: one round trip
that returns only when the device reports completion and tells us whether it refused.
"""

from __future__ import annotations

import re

from instruments import scpi
from instruments.errors import DeviceError, NotSupported, ProtocolError
from instruments.link import Link, LinkSettings
from instruments.numbers import reply_int
from instruments.switch import (
    CrossConnects,
    OpticalSwitch,
    Pair,
    PortState,
    SwitchInfo,
)

_STATES = {"E": PortState.ENABLED, "D": PortState.DISABLED, "F": PortState.FAILED}
_SIZE_IN_MODEL = re.compile(r"-(\d+)x(\d+)-", re.IGNORECASE)
#: One public driver splits power reads into chunks of at most 256 ports.
POWER_CHUNK = 256


class PolatisScpi(OpticalSwitch):
    driver = "polatis-scpi"
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=2.0)

    async def _identify(self, link: Link) -> SwitchInfo:
        vendor, model, serial, firmware = await scpi.identify(link)
        match = _SIZE_IN_MODEL.search(model)
        if match:
            n, m = (reply_int(v, "*IDN?", self.name, what="a side of the switch")
                    for v in match.groups())
        else:
            size = await link.query(":OXC:SWIT:SIZE?")
            sides = scpi.parse_tokens(size)
            if len(sides) < 2:
                raise ProtocolError(f":OXC:SWIT:SIZE? answered {size!r}, expected N,M",
                                    instrument=self.name)
            n, m = (reply_int(v, ":OXC:SWIT:SIZE?", self.name, what="a side of the switch")
                    for v in sides[:2])
        return SwitchInfo(vendor, model, serial, firmware, n, m)

    async def _probe(self, link: Link) -> None:
        await scpi.operation_complete(link)

    async def _read_map(self, link: Link) -> CrossConnects:
        reply = await link.query(":OXC:SWIT:CONN:STAT?")
        info = self._require_info()
        lists = scpi.parse_channel_lists(reply, command=":OXC:SWIT:CONN:STAT?",
                                         instrument=self.name, limit=info.ports)
        if len(lists) != 2 or len(lists[0]) != len(lists[1]):
            raise ProtocolError(f"connection state {reply!r} is not two lists of equal length",
                                instrument=self.name)
        return dict(zip(lists[0], lists[1], strict=True))

    @staticmethod
    def _lists(pairs: list[Pair]) -> str:
        return (f"{scpi.channel_list([a for a, _ in pairs])},"
                f"{scpi.channel_list([b for _, b in pairs])}")

    async def _connect(self, link: Link, pairs: list[Pair]) -> None:
        await scpi.command_checked(link, f":OXC:SWIT:CONN:ADD {self._lists(pairs)}")

    async def _disconnect(self, link: Link, lows: list[int]) -> None:
        await scpi.command_checked(link, f":OXC:SWIT:CONN:SUB {scpi.channel_list(lows)},(@)")

    async def _replace(self, link: Link, target: CrossConnects) -> None:
        pairs = sorted(target.items())
        await scpi.command_checked(link, f":OXC:SWIT:CONN:ONLY {self._lists(pairs)}")

    async def _port_states(self, link: Link, ports: list[int] | None) -> dict[int, PortState]:
        query = ":OXC:SWIT:PORT:STAT?" + (f" {scpi.channel_list(ports)}" if ports else "")
        tokens = scpi.parse_tokens(await link.query(query))
        numbers = ports or list(range(1, len(tokens) + 1))
        if len(tokens) != len(numbers):
            raise ProtocolError(f"{len(numbers)} port states asked, {len(tokens)} received",
                                instrument=self.name)
        return {p: _STATES.get(t.upper(), PortState.UNKNOWN) for p, t in zip(numbers, tokens,
                                                                           strict=True)}

    async def _set_ports_enabled(self, link: Link, ports: list[int], enabled: bool) -> None:
        verb = "ENAB" if enabled else "DIS"
        await scpi.command_checked(link, f":OXC:SWIT:PORT:{verb} {scpi.channel_list(ports)}")

    async def _port_power(self, link: Link, ports: list[int]) -> dict[int, float]:
        if self.info and self.info.model.upper().startswith("I-"):
            raise NotSupported(f"{self.info.model} has no power monitors", instrument=self.name)
        result: dict[int, float] = {}
        for i in range(0, len(ports), POWER_CHUNK):
            chunk = ports[i : i + POWER_CHUNK]
            answers = await scpi.query_all(
                link, f":PMON:POW? {scpi.channel_list(chunk)};:SYST:ERR?", 2)
            code, text = scpi.parse_error(answers[1], command=":PMON:POW?",
                                          instrument=self.name)
            if code != 0:
                await scpi.drain_errors(link)
                if code == -113:
                    raise NotSupported("this switch has no power monitors", instrument=self.name)
                raise DeviceError(code, text, command=":PMON:POW?", instrument=self.name)
            values = scpi.parse_floats(answers[0], command=":PMON:POW?",
                                       instrument=self.name)
            if len(values) != len(chunk):
                raise ProtocolError(f"{len(chunk)} powers asked, got {answers[0]!r}",
                                    instrument=self.name)
            result.update(zip(chunk, values, strict=True))
        return result

