"""HUBER+SUHNER Polatis over TL1 (raw TCP 3082). Needs ``user`` and ``password``."""

from __future__ import annotations

import re

from instruments.errors import ProtocolError
from instruments.link import Link
from instruments.numbers import reply_float, reply_int
from instruments.switch import CrossConnects, Pair, PortState, SwitchInfo, plan_replace
from instruments.tl1 import Tl1Message, aid_list
from instruments.tl1_switch import Tl1Switch, port_values

_SIZE = re.compile(r"SIZE=(\d+)x(\d+)", re.IGNORECASE)
_SERIAL = re.compile(r"SN=([^,\s]+)")
SIZE_BLOCKS = ":PARAMETER=SIZE"
"""After the general block: an empty block, then the keyword."""
_SHUTTER = {"OPEN": PortState.ENABLED, "CLOSED": PortState.DISABLED,
            "FAILED": PortState.FAILED}


class PolatisTl1(Tl1Switch):
    driver = "polatis-tl1"

    async def _identify(self, link: Link) -> SwitchInfo:
        # Required: the size (RTRV-EQPT), unless the lab file gives it. Optional: the
        # vendor, model and firmware (RTRV-NETYPE) and the serial (RTRV-INV).
        netype = await self._optional(link, "RTRV-NETYPE")
        fields = ([f.strip().strip('"') for f in ",".join(netype.lines).split(",")]
                  if netype else [])
        vendor, model, _kind, firmware = ([*fields, "", "", "", ""])[:4]
        inv = await self._optional(link, "RTRV-INV", "OCS")
        serial = _SERIAL.search(" ".join(inv.lines)) if inv else None
        # The documented form, an empty positional block before the keyword one:
        # RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE; (docs/protocols.md §1.2).
        if self.declared_size:
            size = await self._optional(link, "RTRV-EQPT", "SYSTEM", SIZE_BLOCKS)
        else:
            size = await self._cmd(link, "RTRV-EQPT", "SYSTEM", SIZE_BLOCKS)
        match = _SIZE.search(" ".join(size.lines)) if size else None
        if match:
            n, m = (reply_int(v, "RTRV-EQPT", self.name, what="a side of the switch")
                    for v in match.groups())
        elif self.declared_size and size is None:
            n, m = self.declared_size
        else:
            raise ProtocolError(f"RTRV-EQPT SIZE gave {size.lines if size else None!r}",
                                instrument=self.name)
        return SwitchInfo(vendor or "Polatis", model, serial.group(1) if serial else "",
                          firmware, n, m)

    async def _read_map(self, link: Link) -> CrossConnects:
        reply = await self._cmd(link, "RTRV-PATCH")
        result: CrossConnects = {}
        for line in reply.lines:
            ends = line.split(",")[:2]
            if len(ends) != 2:
                raise ProtocolError(f"patch line {line!r} is not IN,OUT", instrument=self.name)
            a, b = (reply_int(x, "RTRV-PATCH", self.name, what="a port number") for x in ends)
            result[min(a, b)] = max(a, b)
        return result

    async def _connect(self, link: Link, pairs: list[Pair]) -> None:
        ins, outs = aid_list([a for a, _ in pairs]), aid_list([b for _, b in pairs])
        link.activating()  # after RTRV-PATCH, when replacing
        await self._cmd(link, "ENT-PATCH", f"{ins},{outs}")

    async def _disconnect(self, link: Link, lows: list[int]) -> None:
        link.activating()
        await self._cmd(link, "DLT-PATCH", aid_list(lows))

    async def _replace(self, link: Link, target: CrossConnects) -> None:
        remove, add = plan_replace(await self._read_map(link), target)
        if remove:
            await self._disconnect(link, remove)
        if add:
            await self._connect(link, add)

    async def _port_states(self, link: Link, ports: list[int] | None) -> dict[int, PortState]:
        info = self._require_info()
        wanted = ports or list(range(1, info.ports + 1))
        reply = await self._cmd(link, "RTRV-PORT-SHUTTER", aid_list(wanted))
        return {p: _SHUTTER.get(v.strip().upper(), PortState.UNKNOWN)
                for p, v in _numbered(reply, self.name)}

    async def _set_ports_enabled(self, link: Link, ports: list[int], enabled: bool) -> None:
        await self._cmd(link, "RLS-PORT-SHUTTER" if enabled else "OPR-PORT-SHUTTER",
                        aid_list(ports))

    async def _port_power(self, link: Link, ports: list[int]) -> dict[int, float]:
        reply = await self._cmd(link, "RTRV-PORT-POWER", aid_list(ports))
        return {p: reply_float(v, "RTRV-PORT-POWER", self.name, what="a power in dBm")
                for p, v in _numbered(reply, self.name, "RTRV-PORT-POWER")}


def _numbered(reply: Tl1Message, instrument: str,
              verb: str = "RTRV-PORT-SHUTTER") -> list[tuple[int, str]]:
    return [(reply_int(p, verb, instrument, what="a port number"), v)
            for p, v in port_values(reply, instrument)]
