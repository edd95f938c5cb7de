"""What every TL1-managed switch driver shares: the session, login and re-login,
autonomous messages as events, and reading ``PORT:VALUE`` data lines."""

from __future__ import annotations

import asyncio
from typing import Any

from instruments.errors import AuthenticationError, DeviceError, InvalidRequest, ProtocolError
from instruments.events import InstrumentEvent
from instruments.link import Link, LinkSettings
from instruments.switch import OpticalSwitch
from instruments.tl1 import Tl1Message, Tl1Session


class Tl1Switch(OpticalSwitch):
    """Needs ``user`` and ``password`` options; ``tid`` addresses a named switch."""

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

    async def _probe(self, link: Link) -> None:
        # RTRV-HDR is the keep-alive: answered without a login, it moves nothing.
        await self.tl1.command(link, "RTRV-HDR")

    async def _optional(self, link: Link, verb: str, aid: str = "", params: str = ""
                        ) -> Tl1Message | None:
        """An identity query the switch may refuse (some firmware denies optional
        retrieve commands): its answer, or None and a warning, and the switch comes online
        with what the other queries told."""
        try:
            return await self._cmd(link, verb, aid, params)
        except DeviceError as exc:
            if isinstance(exc, AuthenticationError):
                raise
            self._warn(f"{verb} refused ({exc.code} {exc.text}); identified without it")
            return None

    async def _cmd(self, link: Link, verb: str, aid: str = "", params: str = "") -> Tl1Message:
        try:
            return await self.tl1.command(link, verb, aid=aid, params=params)
        except AuthenticationError as exc:
            # The device-side session expired, or (CALIENT) the login is not active yet:
            # log in again once, give the device a moment, retry once.
            moving = link.moving
            await self.tl1.login(link, self.user, self.password)
            if "not active" in exc.text.lower():
                await asyncio.sleep(float(self.options.get("login_retry_delay", 0.2)))
            if moving:  # the retry is what moves the light: its reply acknowledges it
                link.activating()
            return await self.tl1.command(link, verb, aid=aid, params=params)


def port_values(reply: Tl1Message, instrument: str) -> list[tuple[str, str]]:
    """``"17:-12.3"`` data lines → ``[("17", "-12.3")]``; the port part is kept as text
    (``1.1.3`` on CALIENT)."""
    out = []
    for line in reply.lines:
        port, sep, value = line.partition(":")
        if not sep or not port.strip():
            raise ProtocolError(f"line {line!r} is not PORT:VALUE", instrument=instrument)
        out.append((port.strip(), value))
    return out
