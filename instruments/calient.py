"""CALIENT S-Series over TL1 (raw TCP 3082): two-phase cross-connects.

``ENT-CRS`` provisions a connection (AS=UMA, OS=RDY), ``ACT-CRS`` activates it (AS=IS, OS=IS;
the mirrors move), ``CANC-CRS`` deactivates and ``DLT-CRS`` deletes. Only active connections
are part of the cross-connect map; provisioned ones are listed by :meth:`provisioned`.
A change cut off between the two phases (a refused ``ENT-CRS``, a connection lost before
``ACT-CRS``) would leave labd's own provisioned connections holding their ports for good:
the driver deletes those it entered and did not activate, at once where the link still
answers, else before its next connect.

Ports are ``shelf.slot.port`` on the device; labd numbers them 1..N, port n being
``1.<(n-1)//ports_per_slot + 1>.<(n-1)%ports_per_slot + 1>`` (``ports_per_slot`` defaults
to 32, a lab-file field). ``aid_lists = false`` sends one pair per command for firmware that
refuses ``&`` lists.
"""

from __future__ import annotations

import contextlib
from typing import Any

from instruments.errors import InstrumentError, ProtocolError
from instruments.link import Link
from instruments.numbers import reply_int
from instruments.switch import CrossConnects, Pair, PortState, SwitchInfo, plan_replace
from instruments.tl1_switch import Tl1Switch, port_values

_PORT_STATE = {"IS": PortState.ENABLED, "OOS-MA": PortState.DISABLED,
               "OOS-AU": PortState.FAILED, "OOS-AUMA": PortState.FAILED}


def _fields(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip().upper()] = value.strip()
    return out


class CalientTl1(Tl1Switch):
    driver = "calient-tl1"
    any_to_any = True

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.ports_per_slot = int(self.options.get("ports_per_slot", 32))
        self.group = str(self.options.get("group", "SYSTEM"))
        self.aid_lists = bool(self.options.get("aid_lists", True))
        self._unactivated: set[Pair] = set()
        """Connections this driver entered and has not seen activated."""

    def aid(self, port: int) -> str:
        slot, index = divmod(port - 1, self.ports_per_slot)
        return f"1.{slot + 1}.{index + 1}"

    def port_number(self, aid: str, verb: str = "RTRV-CRS") -> int:
        parts = aid.strip().split(".")
        if len(parts) != 3:
            raise ProtocolError(f"{verb} answered port {aid[:80]!r}, not shelf.slot.port",
                                instrument=self.name)
        _shelf, slot, index = (reply_int(x, verb, self.name, what="shelf.slot.port")
                               for x in parts)
        return (slot - 1) * self.ports_per_slot + index

    def _pair_aids(self, pairs: list[Pair]) -> list[str]:
        if self.aid_lists:
            return ["&".join(self.aid(a) for a, _ in pairs) + ","
                    + "&".join(self.aid(b) for _, b in pairs)]
        return [f"{self.aid(a)},{self.aid(b)}" for a, b in pairs]

    async def _identify(self, link: Link) -> SwitchInfo:
        # Required: the port count (RTRV-PORT), unless the lab file gives the size.
        # Optional: the chassis, serial and software (RTRV-NE).
        found = await self._optional(link, "RTRV-NE")
        ne = _fields(",".join(found.lines)) if found else {}
        if self.declared_size:
            count = self.declared_size[0]
        else:
            ports = await self._cmd(link, "RTRV-PORT", "0")
            count = len(ports.lines)
        return SwitchInfo("CALIENT", ne.get("CHASSISTYPE", "S-Series"),
                          ne.get("SERIALNUMBER", ""), ne.get("SWPACKAGE", ""), count, 0)

    async def _crs(self, link: Link) -> list[dict[str, str]]:
        reply = await self._cmd(link, "RTRV-CRS")
        rows = []
        for line in reply.lines:
            name, _, rest = line.partition(":")
            row = _fields(rest)
            if "SRCPORT" not in row or "DSTPORT" not in row:
                raise ProtocolError(f"cross-connect line {line!r} lacks SRCPORT/DSTPORT",
                                    instrument=self.name)
            row.setdefault("CONNNAME", name)
            rows.append(row)
        return rows

    def _pair_of(self, row: dict[str, str]) -> Pair:
        a, b = self.port_number(row["SRCPORT"]), self.port_number(row["DSTPORT"])
        return min(a, b), max(a, b)

    async def _read_map(self, link: Link) -> CrossConnects:
        # Firmware that omits AS= in the list form is taken to list active connections only.
        return dict(self._pair_of(r) for r in await self._crs(link) if r.get("AS", "IS") == "IS")

    async def provisioned(self) -> list[Pair]:
        """Connections entered but not active (AS=UMA)."""
        rows = await self._run(self._crs)
        return [self._pair_of(r) for r in rows if r.get("AS", "IS") != "IS"]

    async def _connect(self, link: Link, pairs: list[Pair]) -> None:
        if self._unactivated:
            await self._forget_unactivated(link)
        self._unactivated.update(pairs)
        try:
            for aid in self._pair_aids(pairs):
                await self._cmd(link, "ENT-CRS", aid, f"{self.group},2WAY")
            for aid in self._pair_aids(pairs):
                link.activating()  # the mirrors move on ACT-CRS, not on ENT-CRS
                await self._cmd(link, "ACT-CRS", aid)
        except InstrumentError:
            # If the link is gone too, the next connect tidies up.
            with contextlib.suppress(InstrumentError):
                await self._forget_unactivated(link)
            raise
        self._unactivated.difference_update(pairs)

    async def _forget_unactivated(self, link: Link) -> None:
        """Delete the connections we entered that the device holds as provisioned only."""
        stale = [p for p in (self._pair_of(r) for r in await self._crs(link)
                             if r.get("AS", "IS") != "IS") if p in self._unactivated]
        for aid in self._pair_aids(stale) if stale else []:
            await self._cmd(link, "DLT-CRS", aid)
        self._unactivated.clear()

    async def _disconnect(self, link: Link, lows: list[int]) -> None:
        pairs = [(a, self.expected[a]) for a in lows if a in self.expected]
        for aid in self._pair_aids(pairs):
            link.activating()  # the mirrors move on CANC-CRS; DLT-CRS only forgets
            await self._cmd(link, "CANC-CRS", aid)
        for aid in self._pair_aids(pairs):
            await self._cmd(link, "DLT-CRS", aid)

    async def _replace(self, link: Link, target: CrossConnects) -> None:
        current = await self._read_map(link)
        remove, add = plan_replace(current, target)
        if remove:
            self.expected = current
            await self._disconnect(link, remove)
        if add:
            await self._connect(link, add)

    async def _port_states(self, link: Link, ports: list[int] | None) -> dict[int, PortState]:
        reply = await self._cmd(link, "RTRV-PORT", "0")
        states = {}
        for aid, rest in port_values(reply, self.name):
            port = self.port_number(aid, "RTRV-PORT")
            if ports is None or port in ports:
                fields = _fields(rest)
                states[port] = _PORT_STATE.get(fields.get("OS", ""), PortState.UNKNOWN)
        return states
