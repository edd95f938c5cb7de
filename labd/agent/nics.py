"""NIC link state for the agent: carrier from sysfs on a real host, light from the optical
model in emulation (a link comes up only when light has been arriving for the link-up
delay, as a transceiver needs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

#: How often an agent reads its NICs: a link coming up is a recovery milestone worth timing.
NIC_POLL_S = 0.005


class Nics(Protocol):
    def links(self) -> dict[str, bool]:
        """Each NIC (by endpoint id): is its link up?"""
        ...


class SysfsNics:
    """``/sys/class/net/<iface>/carrier`` for each endpoint's interface."""

    def __init__(self, interfaces: dict[str, str], root: str = "/sys/class/net") -> None:
        self.interfaces = interfaces
        self.root = Path(root)

    def links(self) -> dict[str, bool]:
        out = {}
        for endpoint, iface in self.interfaces.items():
            try:
                out[endpoint] = (self.root / iface / "carrier").read_text().strip() == "1"
            except OSError:  # an interface that is down reads as an error
                out[endpoint] = False
        return out


class EmulatedNics:
    """Link up once the light at the endpoint has stayed above ``threshold_dbm`` for
    ``link_up_s`` (a number, or a draw for each time the light arrives); down as soon as
    it drops."""

    def __init__(self, endpoints: list[str], light_dbm: Callable[[str], float], *,
                 threshold_dbm: float = -30.0,
                 link_up_s: float | Callable[[], float] = 0.0) -> None:
        self.endpoints = endpoints
        self.light_dbm = light_dbm
        self.threshold = threshold_dbm
        self._draw = link_up_s if callable(link_up_s) else (lambda: float(link_up_s))
        self._up_after: dict[str, int] = {}
        self._lit_since: dict[str, int | None] = dict.fromkeys(endpoints)
        self.down: set[str] = set()
        """Endpoints forced down (a NIC-down fault)."""
        self.dead = False
        """The host died: nothing reads the links any more."""

    def pending(self) -> bool:
        """Whether a link is lit but not up yet: it comes up with time alone."""
        if self.dead:
            return False
        now = time.monotonic_ns()
        return any(since is not None and now - since < self._up_after.get(endpoint, 0)
                   for endpoint, since in self._lit_since.items())

    def links(self) -> dict[str, bool]:
        if self.dead:
            return {}
        now = time.monotonic_ns()
        out = {}
        for endpoint in self.endpoints:
            lit = endpoint not in self.down and self.light_dbm(endpoint) >= self.threshold
            if not lit:
                self._lit_since[endpoint] = None
            elif self._lit_since[endpoint] is None:
                self._lit_since[endpoint] = now
                self._up_after[endpoint] = int(self._draw() * 1e9)
            since = self._lit_since[endpoint]
            out[endpoint] = since is not None and now - since >= self._up_after[endpoint]
        return out
