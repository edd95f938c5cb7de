"""The switch capability every optical-switch driver offers, and the machinery they share.

Ports are integers everywhere above the driver. An NxM switch (Polatis) has ingress ports
1..N and egress ports N+1..N+M, and a pair is always (ingress, egress). An any-to-any switch
(CALIENT) has ports 1..N and a pair is (lower, higher). Drivers translate to the device's own
names (``1.1.3`` on CALIENT) at the wire.
"""

from __future__ import annotations

import abc
import enum
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from instruments.errors import ConnectError, InvalidRequest, NoSuchPort, NotSupported
from instruments.events import Drift, InstrumentEvent
from instruments.exchange import NOTHING, Exchange
from instruments.instrument import Instrument
from instruments.link import Link

Pair = tuple[int, int]
CrossConnects = dict[int, int]
"""ingress (or lower) port → egress (or higher) port."""

#: The most ports on one side of a switch (an NxM switch may have N and M up to this; an
#: any-to-any switch this many in all). Larger than any switch the drivers know.
MAX_PORTS_PER_SIDE = 4096

# Nine digits at most: a longer number is refused by the pattern, never converted.
_NXM = re.compile(r"\s*([0-9]{1,9})\s*[xX]\s*([0-9]{1,9})\s*")
_COUNT = re.compile(r"\s*([0-9]{1,9})\s*")


class PortState(enum.StrEnum):
    ENABLED = "enabled"
    DISABLED = "disabled"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SwitchInfo:
    vendor: str
    model: str
    serial: str
    firmware: str
    ingress: int
    """N for an NxM switch; the port count of an any-to-any switch."""
    egress: int
    """M for an NxM switch; 0 for an any-to-any switch."""

    @property
    def ports(self) -> int:
        return self.ingress + self.egress

    @property
    def size(self) -> str:
        return f"{self.ingress}x{self.egress}" if self.egress else str(self.ingress)


@dataclass(frozen=True, slots=True, eq=False)
class CheckedPairs:
    """Pairs one switch found valid (:meth:`OpticalSwitch.check_pairs`), in canonical order
    and in the order asked. Handed back to the switch that checked them, while it is the
    device it was when it checked them, they are not checked again: a request is checked
    once, where it comes in, however many plans and commands it then goes through."""

    pairs: tuple[Pair, ...]
    checked_by: SwitchInfo
    """The identity of the switch that checked them (a reconnect makes a new one)."""

    def only(self, wanted: Iterable[Pair]) -> CheckedPairs:
        """Those of these pairs that are in ``wanted``, in this order: a part of a valid
        request is valid (a pair not among these is dropped, never taken unchecked)."""
        keep = set(wanted)
        return CheckedPairs(tuple(p for p in self.pairs if p in keep), self.checked_by)


def parse_size(text: str) -> tuple[int, int]:
    """``"16x16"`` → ``(16, 16)``; ``"320"`` (any-to-any) → ``(320, 0)``. ValueError says
    what is expected for anything else: a sign, a zero, a side beyond the bound, trailing
    words (the whole text must be the size)."""
    expected = (f"expected NxM with N and M whole numbers 1..{MAX_PORTS_PER_SIDE} (e.g. "
                f"'16x16'), or a port count 1..{MAX_PORTS_PER_SIDE} (e.g. '320')")
    match = _NXM.fullmatch(text) or _COUNT.fullmatch(text)
    if match is None:
        raise ValueError(f"switch size {_short(text)}: {expected}")
    sides = tuple(int(group) for group in match.groups())
    if not all(1 <= side <= MAX_PORTS_PER_SIDE for side in sides):
        raise ValueError(f"switch size {_short(text)}: {expected}")
    return (sides[0], sides[1]) if len(sides) == 2 else (sides[0], 0)


def _short(text: str, limit: int = 40) -> str:
    """A value quoted for a message, cut short: a message names the value, not all of it."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


class OpticalSwitch(Instrument):
    """Base of every switch driver: validates requests, tracks the map it expects the device
    to hold, and reports drift after every reconnect."""

    any_to_any: ClassVar[bool] = False
    done_on_reply: ClassVar[bool] = True
    """The device's reply to a change says it is complete (False: the driver waits on
    after it, e.g. for a mesh's heaters to settle)."""
    disconnect_darkens: ClassVar[bool] = True
    """A disconnect takes the light off the pair's path (False: a mesh, whose light always
    goes somewhere; a disconnect there changes nothing on the chip)."""

    def __init__(self, address: str, *, size: str | None = None,
                 audit_interval_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.declared_size = parse_size(size) if size else None
        self.info: SwitchInfo | None = None
        self.expected: CrossConnects = {}
        self._opened = False
        self.audit_interval_s = audit_interval_s
        """Seconds between map audits on an idle link (0: none): the watch reads the map
        instead of probing once this long has passed since the last read, so circuits
        another controller changed are found while nobody uses the switch."""
        self.audits = 0
        """Map reads the audit made (what it cost the wire)."""
        self._audit_due_ns = 0
        if audit_interval_s > 0:
            watch = self.connection.watch_interval_s
            self.connection.watch_interval_s = min(watch, audit_interval_s) if watch > 0 \
                else audit_interval_s

    async def _on_connect(self, link: Link) -> None:
        await self._login(link)
        info = await self._identify(link)
        if self.declared_size and (info.ingress, info.egress) != self.declared_size:
            raise ConnectError(
                f"lab file says size {self.declared_size[0]}x{self.declared_size[1]} "
                f"but the device reports {info.size}; fix the lab file's size field",
                instrument=self.name,
            )
        restarted = ""
        if self.info is not None and (info.serial, info.firmware) != (self.info.serial,
                                                                       self.info.firmware):
            restarted = (f"serial {self.info.serial or '?'} → {info.serial or '?'}, firmware "
                         f"{self.info.firmware or '?'} → {info.firmware or '?'}")
            self._emit(InstrumentEvent(self.name, "identity-changed", detail=restarted))
        self.info = info
        found = await self._read_map(link)
        if self._opened:
            drift = Drift.between(self.expected, found)
            if not restarted and self.expected and not found:
                # A switch that lost every circuit while we were away was power-cycled (a
                # dark boot), or someone cleared it: either way not the map we left.
                restarted = f"its map was emptied ({len(self.expected)} circuits gone)"
            self._emit(InstrumentEvent(
                self.name, "resync", drift=drift,
                detail=f"{len(drift.missing)} missing, {len(drift.unexpected)} unexpected"
                if drift else "no drift",
                data={"restarted": restarted} if restarted else {},
            ))
        self.expected = found
        self._opened = True
        self._audit_due_ns = time.monotonic_ns() + int(self.audit_interval_s * 1e9)

    async def _idle(self, link: Link) -> None:
        """The watch on an idle link: the probe, or, once the audit interval has passed,
        one map read (proof of life too). A map other than the expected one is a ``drift``
        event marked ``audit``, for the daemon's on_drift policy."""
        now = time.monotonic_ns()
        if self.audit_interval_s <= 0 or now < self._audit_due_ns:
            await self._probe(link)
            return
        self._audit_due_ns = now + int(self.audit_interval_s * 1e9)
        self.audits += 1
        found = await self._read_map(link)
        drift = Drift.between(self.expected, found)
        self.expected = dict(found)
        if drift:
            self._emit(InstrumentEvent(self.name, "drift", drift=drift,
                                       detail=f"audit: {len(drift.missing)} missing, "
                                              f"{len(drift.unexpected)} unexpected",
                                       data={"audit": True}))

    # -- validation --------------------------------------------------------------------
    def _require_info(self) -> SwitchInfo:
        if self.info is None:
            raise InvalidRequest("switch not identified yet; open it first", instrument=self.name)
        return self.info

    def check_port(self, port: int) -> int:
        info = self._require_info()
        if type(port) is not int or not 1 <= port <= info.ports:
            raise NoSuchPort(f"port {port!r} is not on this {info.size} switch "
                                 f"(ports 1..{info.ports})", instrument=self.name)
        return port

    def check_pairs(self, pairs: Iterable[Pair] | Mapping[int, int] | CheckedPairs
                    ) -> CheckedPairs:
        """:meth:`normalise_pairs`, as a value this switch takes back without checking it
        again (one this switch checked, as it is now, is returned as it is)."""
        if isinstance(pairs, CheckedPairs) and pairs.checked_by is self.info:
            return pairs
        return CheckedPairs(tuple(self.normalise_pairs(pairs)), self._require_info())

    def normalise_pairs(self, pairs: Iterable[Pair] | Mapping[int, int] | CheckedPairs
                        ) -> list[Pair]:
        """Check every port and put each pair in canonical order; a port may appear once.
        The one place a request's pairs are checked: InvalidRequest (NoSuchPort for a port
        beyond the switch) says what is wrong with them."""
        info = self._require_info()
        if isinstance(pairs, CheckedPairs):
            if pairs.checked_by is info:
                return list(pairs.pairs)
            pairs = pairs.pairs  # checked by another switch, or before a reconnect
        # A list or tuple first: the abstract Mapping check costs more than the rest.
        items = list(pairs) if isinstance(pairs, (list, tuple)) else \
            list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
        top, split = info.ports, (0 if self.any_to_any else info.ingress)
        seen: set[int] = set()
        result = []
        for item in items:
            try:
                a, b = item
            except (TypeError, ValueError):
                raise InvalidRequest(f"not a port pair: {item!r}", instrument=self.name) from None
            if type(a) is not int or type(b) is not int:
                self.check_port(a)  # raises InvalidRequest naming the odd one
                self.check_port(b)
            if a > b:
                a, b = b, a
            if not (a >= 1 and b <= top):
                self.check_port(a)
                self.check_port(b)
            if a == b:
                raise InvalidRequest(f"pair ({a}, {b}) joins a port to itself",
                                     instrument=self.name)
            if split and not a <= split < b:
                raise InvalidRequest(
                    f"pair ({a}, {b}) must join an ingress port (1..{split}) to an "
                    f"egress port ({split + 1}..{top})", instrument=self.name)
            if a in seen or b in seen:
                raise InvalidRequest(f"port {a if a in seen else b} appears twice in one "
                                     "request", instrument=self.name)
            seen.add(a)
            seen.add(b)
            result.append((a, b))
        return result

    def partner_map(self) -> dict[int, int]:
        """Both directions of the expected map: port → partner."""
        both = dict(self.expected)
        both.update({b: a for a, b in self.expected.items()})
        return both

    def paths(self) -> dict[int, list[tuple[int, str]]] | None:
        """For switches that route light through stages of elements (a photonic mesh):
        each circuit's ingress port → the elements it passes, first to last, with their
        state. None for a switch whose circuits are single cross-connects."""
        return None

    # -- the capability --------------------------------------------------------------------
    async def connect(self, pairs: Iterable[Pair] | Mapping[int, int] | CheckedPairs
                      ) -> Exchange:
        """Add cross-connects, leaving the others in place. Returns when the device says
        the change is complete (mirrors settled), with the change's wire times."""
        batch = self.normalise_pairs(pairs)
        if not batch:
            return NOTHING
        _, stamps = await self._timed(lambda link: self._connect(link, batch))
        self.expected.update(batch)
        return stamps

    async def disconnect(self, ports: Iterable[int]) -> Exchange:
        """Remove the cross-connects touching these ports (either side). Ports that are
        not connected are ignored. Returns the change's wire times."""
        wanted = {self.check_port(p) for p in ports}

        async def exchange(link: Link) -> list[int]:
            partners = self.partner_map()
            if not wanted <= partners.keys():
                # Our map does not know some port: the device may (someone else made the
                # pair). Ask it rather than skip the port on a stale belief.
                self._observe(await self._read_map(link))
                partners = self.partner_map()
            lows = sorted({min(p, partners[p]) for p in wanted if p in partners})
            if lows:
                await self._disconnect(link, lows)
            return lows

        lows, stamps = await self._timed(exchange)
        for low in lows:
            self.expected.pop(low, None)
        return stamps

    async def replace(self, pairs: Iterable[Pair] | Mapping[int, int] | CheckedPairs
                      ) -> Exchange:
        """Make the device hold exactly these cross-connects; unchanged ones are not touched.
        Returns the change's wire times."""
        target = dict(self.normalise_pairs(pairs))
        _, stamps = await self._timed(lambda link: self._replace(link, target))
        self.expected = target
        return stamps

    async def cross_connects(self) -> CrossConnects:
        """Read the map from the device (and adopt it as what we expect)."""
        found = await self._run(self._read_map)
        self._observe(found)
        return dict(found)

    def _observe(self, found: CrossConnects) -> None:
        """Adopt a map read from the device; a difference from what we expected is
        reported as a ``drift`` event (someone else changed the switch)."""
        drift = Drift.between(self.expected, found)
        if drift:
            self._emit(InstrumentEvent(self.name, "drift", drift=drift,
                                       detail=f"{len(drift.missing)} missing, "
                                              f"{len(drift.unexpected)} unexpected"))
        self.expected = dict(found)

    async def port_states(self, ports: Iterable[int] | None = None) -> dict[int, PortState]:
        wanted = None if ports is None else [self.check_port(p) for p in ports]
        return await self._run(lambda link: self._port_states(link, wanted))

    async def set_ports_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        wanted = [self.check_port(p) for p in ports]
        await self._run(lambda link: self._set_ports_enabled(link, wanted, enabled))

    async def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        """Optical power in dBm at each port, where the device has monitors."""
        wanted = [self.check_port(p) for p in ports]
        return await self._run(lambda link: self._port_power(link, wanted))

    # -- what each driver implements -------------------------------------------------------
    async def _login(self, link: Link) -> None:
        """Log in after (re)connecting, if the protocol needs it."""

    @abc.abstractmethod
    async def _identify(self, link: Link) -> SwitchInfo: ...

    @abc.abstractmethod
    async def _read_map(self, link: Link) -> CrossConnects: ...

    @abc.abstractmethod
    async def _connect(self, link: Link, pairs: list[Pair]) -> None: ...

    @abc.abstractmethod
    async def _disconnect(self, link: Link, lows: list[int]) -> None: ...

    @abc.abstractmethod
    async def _replace(self, link: Link, target: CrossConnects) -> None: ...

    @abc.abstractmethod
    async def _port_states(self, link: Link, ports: list[int] | None) -> dict[int, PortState]: ...

    async def _set_ports_enabled(self, link: Link, ports: list[int], enabled: bool) -> None:
        raise NotSupported("enabling/disabling ports", instrument=self.name)

    async def _port_power(self, link: Link, ports: list[int]) -> dict[int, float]:
        raise NotSupported("port power monitoring", instrument=self.name)


def plan_replace(current: CrossConnects, target: CrossConnects) -> tuple[list[int], list[Pair]]:
    """What to remove (low ports of pairs to tear down) and add to go from current to target,
    touching only what changes."""
    # A current pair survives only if the target holds exactly it; any other pair either
    # goes away or frees a port that the target needs.
    remove = sorted(a for a, b in current.items() if target.get(a) != b)
    add = sorted((a, b) for a, b in target.items() if current.get(a) != b)
    return remove, add
