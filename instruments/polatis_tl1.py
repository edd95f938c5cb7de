"""HUBER+SUHNER Polatis over TL1 (raw TCP 3082). Needs ``user`` and ``password``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from instruments.errors import AuthenticationError, InvalidRequest, ProtocolError
from instruments.events import InstrumentEvent
from instruments.link import Link, LinkSettings
from instruments.switch import (
    CrossConnects,
    OpticalSwitch,
    Pair,
    PortState,
    SwitchInfo,
    plan_replace,
)
from instruments.tl1 import Tl1Message, Tl1Session, aid_list

_SIZE = re.compile(r"SIZE=(\d+)x(\d+)", re.IGNORECASE)
_SERIAL = re.compile(r"SN=([^,\s]+)")
_SHUTTER = {"OPEN": PortState.ENABLED, "CLOSED": PortState.DISABLED,
            "FAILED": PortState.FAILED}


class Tl1Switch(OpticalSwitch):
    """Shared by TL1 switches: the session, login, autonomous messages as events."""

    default_settings = LinkSettings(write_termination="\r\n", read_termination="\n", timeout=5.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        user, password = self.options.get("user"), self.options.get("password")
        if not user or password is None:
            raise InvalidRequest(f"{self.driver} needs 'user' and 'password' (set them in the "
                                 "lab file entry)", instrument=self.name)
        self.user, self.password = str(user), str(password)
        self.tl1 = Tl1Session(tid=str(self.options.get("tid", "")),
                              on_autonomous=self._autonomous)

    def _autonomous(self, message: Tl1Message) -> None:
        self._emit(InstrumentEvent(
            self.name, "autonomous", detail=message.status,
            data={"alarm": message.alarm, "atag": message.tag, "lines": message.lines},
        ))

    async def _login(self, link: Link) -> None:
        await self.tl1.login(link, self.user, self.password)

    async def _cmd(self, link: Link, verb: str, aid: str = "", params: str = "") -> Tl1Message:
        try:
            return await self.tl1.command(link, verb, aid=aid, params=params)
        except AuthenticationError as exc:
            # The device-side session expired, or (CALIENT) the login is not active yet:
            # log in again once, give the device a moment, retry once.
            await self.tl1.login(link, self.user, self.password)
            if "not active" in exc.text.lower():
                await asyncio.sleep(float(self.options.get("login_retry_delay", 0.2)))
            return await self.tl1.command(link, verb, aid=aid, params=params)


class PolatisTl1(Tl1Switch):
    driver = "polatis-tl1"

    async def _identify(self, link: Link) -> SwitchInfo:
        netype = await self._cmd(link, "RTRV-NETYPE")
        fields = [f.strip().strip('"') for f in ",".join(netype.lines).split(",")]
        vendor, model, _kind, firmware = ([*fields, "", "", "", ""])[:4]
        inv = await self._cmd(link, "RTRV-INV", "OCS")
        serial = _SERIAL.search(" ".join(inv.lines))
        size = await self._cmd(link, "RTRV-EQPT", "SYSTEM", "PARAMETER=SIZE")
        match = _SIZE.search(" ".join(size.lines))
        if not match:
            raise ProtocolError(f"RTRV-EQPT SIZE gave {size.lines!r}", instrument=self.name)
        return SwitchInfo(vendor, model, serial.group(1) if serial else "", firmware,
                          int(match.group(1)), int(match.group(2)))

    async def _read_map(self, link: Link) -> CrossConnects:
        reply = await self._cmd(link, "RTRV-PATCH")
        result: CrossConnects = {}
        for line in reply.lines:
            try:
                a, b = (int(x) for x in line.split(",")[:2])
            except ValueError:
                raise ProtocolError(f"patch line {line!r} is not IN,OUT",
                                    instrument=self.name) from None
            result[min(a, b)] = max(a, b)
        return result

    async def _connect(self, link: Link, pairs: list[Pair]) -> None:
        ins, outs = aid_list([a for a, _ in pairs]), aid_list([b for _, b in pairs])
        await self._cmd(link, "ENT-PATCH", f"{ins},{outs}")

    async def _disconnect(self, link: Link, lows: list[int]) -> None:
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
        return {int(p): _SHUTTER.get(v.strip().upper(), PortState.UNKNOWN)
                for p, v in _port_values(reply, self.name)}

    async def _set_ports_enabled(self, link: Link, ports: list[int], enabled: bool) -> None:
        await self._cmd(link, "RLS-PORT-SHUTTER" if enabled else "OPR-PORT-SHUTTER",
                        aid_list(ports))

    async def _port_power(self, link: Link, ports: list[int]) -> dict[int, float]:
        reply = await self._cmd(link, "RTRV-PORT-POWER", aid_list(ports))
        try:
            return {int(p): float(v) for p, v in _port_values(reply, self.name)}
        except ValueError:
            raise ProtocolError(f"power lines {reply.lines!r} are not PORT:dBm",
                                instrument=self.name) from None


def _port_values(reply: Tl1Message, instrument: str) -> list[tuple[str, str]]:
    """``"17:-12.3"`` lines → ``[("17", "-12.3")]``."""
    out = []
    for line in reply.lines:
        port, sep, value = line.partition(":")
        if not sep or not port.strip().isdigit():
            raise ProtocolError(f"line {line!r} is not PORT:VALUE", instrument=instrument)
        out.append((port.strip(), value))
    return out
