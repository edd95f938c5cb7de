"""One optical model for the emulated lab: light launched by endpoints (GPU/NIC
transmitters) travels through fibres (with loss and meter taps) and switches (with their
transients) to meter channels and receiving endpoints.

Nodes are named as in the lab file: ``gpu0.nic0`` (an endpoint), ``ocs1:17`` (a switch
port), ``pm1:2`` (a meter channel). Fibres are one-way, ``src`` → ``dst``. Power is computed
for arrays of monotonic times, so a meter's logging trace is one vectorised evaluation, and
the model keeps ground truth: when the light at each meter channel crossed the threshold.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from emulators.physics.truth import Change

DARK_DBM = -90.0
_FLOOR_MW = 10 ** (DARK_DBM / 10)
#: Ground-truth crossings are located on a grid this fine (ns), or finer for short events.
_STEP_NS = 1_000
_MAX_SAMPLES = 400_000


class Transmitting(Protocol):
    """A device light passes through (a switch, a mesh)."""

    name: str

    @property
    def revision(self) -> int:
        """Changes with every change of the device's state."""
        ...

    @property
    def settled_ns(self) -> int:
        """From then on, with ``revision`` unchanged, its transmissions stay as they are."""
        ...

    def transmissions(self, port: int, times: np.ndarray) -> dict[int, np.ndarray]: ...


@dataclass(frozen=True)
class EndpointSpec:
    id: str
    launch_dbm: float | None = None
    """Transmit power; None for an endpoint that only receives."""
    wavelength_nm: float = 1310.0


@dataclass(frozen=True)
class FiberSpec:
    src: str
    dst: str
    loss_db: float = 0.0
    tap: str | None = None
    """A meter channel fed by a tap on this fibre, e.g. ``pm1:3``."""
    tap_ratio: float = 0.01


@dataclass(frozen=True)
class Crossing:
    seq: int
    node: str
    direction: str  # "rise" (light arrived) or "fall" (light left)
    at_ns: int
    change_seq: int
    device: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_node(node: str) -> tuple[str, int] | None:
    """``ocs1:17`` → ``("ocs1", 17)``; an endpoint id → None."""
    device, sep, port = node.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return device, int(port)


class OpticalModel:
    def __init__(self, endpoints: Iterable[EndpointSpec], fibers: Iterable[FiberSpec], *,
                 threshold_dbm: float = -30.0) -> None:
        self.endpoints = {e.id: e for e in endpoints}
        self.fibers = list(fibers)
        self.threshold_dbm = threshold_dbm
        self.devices: dict[str, Transmitting] = {}
        self.meters: dict[str, int] = {}
        self._out: dict[str, list[FiberSpec]] = defaultdict(list)
        for fiber in self.fibers:
            self._out[fiber.src].append(fiber)
        self._seq = itertools.count(1)
        self.crossings: deque[Crossing] = deque(maxlen=100_000)
        self.watched: set[str] = set()
        """Nodes whose threshold crossings are ground truth (meter channels, receivers)."""
        self._reach: dict[str, set[str]] = {}
        self._feeds: dict[str, frozenset[str]] = {}
        self._pending: deque[Change] = deque()
        # dbm_now's answers while nothing moves: node → (the devices' revisions, dBm).
        self._steady: dict[str, tuple[tuple[int, ...], float]] = {}
        self._into: tuple[dict[str, set[str]], dict[str, set[str]]] | None = None

    # -- wiring ----------------------------------------------------------------------------
    def attach(self, device: Transmitting) -> None:
        self.devices[device.name] = device
        self._steady.clear()
        self._reach.clear()
        self._feeds.clear()

    def _reach_of(self, source: str) -> set[str]:
        if source not in self._reach:
            self._reach[source] = self.reach(source)
        return self._reach[source]

    def _feeds_of(self, target: str) -> frozenset[str]:
        """Nodes from which light could reach ``target`` in any switch state (``target``
        too): a meter's reading follows only the light that can get to it, not the whole
        lab's (a mesh's interferometers are costly to work out)."""
        if target not in self._feeds:
            into, ports_in = self._inbound()
            seen = {target}
            frontier = [target]
            while frontier:
                node = frontier.pop()
                sources = set(into.get(node, ()))
                where = split_node(node)
                if where is not None and where[0] in self.devices and node in self._out:
                    sources |= ports_in[where[0]]  # out of a device: from any port into it
                for source in sources - seen:
                    seen.add(source)
                    frontier.append(source)
            self._feeds[target] = frozenset(seen)
        return self._feeds[target]

    def _inbound(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """Each node's fibres' sources, and each device's ports that fibres enter: worked
        out once (the fibres never change), not per node asked about (a pod's thousands of
        NICs would make that quadratic)."""
        if self._into is None:
            into: dict[str, set[str]] = defaultdict(set)
            ports_in: dict[str, set[str]] = defaultdict(set)
            for fiber in self.fibers:
                into[fiber.dst].add(fiber.src)
                if fiber.tap:
                    into[fiber.tap].add(fiber.src)
                where = split_node(fiber.dst)
                if where is not None and where[0] in self.devices:
                    ports_in[where[0]].add(fiber.dst)
            self._into = (into, ports_in)
        return self._into

    def add_meter(self, name: str, channels: int) -> None:
        self.meters[name] = channels
        self.watched.update(f"{name}:{c}" for c in range(1, channels + 1))

    # -- light -----------------------------------------------------------------------------
    def reach(self, source: str) -> set[str]:
        """Devices light from ``source`` could pass through in any switch state."""
        devices: set[str] = set()
        frontier = [source]
        seen = {source}
        while frontier:
            node = frontier.pop()
            for fiber in self._out.get(node, ()):
                where = split_node(fiber.dst)
                if where is None or where[0] not in self.devices or where[0] in devices:
                    continue
                devices.add(where[0])
                for src in self._out:
                    owner = split_node(src)
                    if owner is not None and owner[0] == where[0] and src not in seen:
                        seen.add(src)
                        frontier.append(src)
        return devices

    def powers(self, times: np.ndarray, *, through: str | None = None,
               to: str | None = None) -> dict[str, np.ndarray]:
        """Power (mW) arriving at every node the light reaches, at each time; with
        ``through``, only light from sources that can pass that device; with ``to``, only
        light that can reach that node (the others' figures are then incomplete)."""
        times = np.asarray(times, dtype=np.int64)
        feeds = self._feeds_of(to) if to is not None else None
        acc: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(times.shape))
        for endpoint in self.endpoints.values():
            if endpoint.launch_dbm is None:
                continue
            if through is not None and through not in self._reach_of(endpoint.id):
                continue
            if feeds is not None and endpoint.id not in feeds:
                continue
            start = np.full(times.shape, 10 ** (endpoint.launch_dbm / 10))
            stack: list[tuple[str, np.ndarray, frozenset[str]]] = [
                (endpoint.id, start, frozenset())]
            while stack:
                node, power, seen = stack.pop()
                for fiber in self._out.get(node, ()):
                    onward = feeds is None or fiber.dst in feeds
                    if not onward and fiber.tap != to:
                        continue
                    carried = power * 10 ** (-fiber.loss_db / 10)
                    if fiber.tap:
                        acc[fiber.tap] += carried * fiber.tap_ratio
                        carried = carried * (1 - fiber.tap_ratio)
                    acc[fiber.dst] += carried
                    where = split_node(fiber.dst)
                    if (not onward or where is None or fiber.dst in seen
                            or where[0] not in self.devices):
                        continue
                    device, port = where
                    for other, fraction in self.devices[device].transmissions(
                            port, times).items():
                        leaving = f"{device}:{other}"
                        if feeds is not None and leaving not in feeds:
                            continue
                        out = carried * fraction
                        if not out.any():
                            continue
                        acc[leaving] += out
                        stack.append((leaving, out, seen | {fiber.dst}))
        return dict(acc)

    def dbm(self, node: str, times: np.ndarray) -> np.ndarray:
        mw = self.powers(times, to=node).get(node)
        if mw is None:
            return np.full(np.shape(times), DARK_DBM)
        return to_dbm(mw)

    def dbm_now(self, node: str) -> float:
        """The power at ``node`` now. Polled often (every emulated NIC's carrier, every few
        ms), and the same while no device changes and no transient runs: an answer worked
        out after every device settled stands until a device's revision moves."""
        return self._now([node], lambda now: {
            node: float(self.dbm(node, np.array([now]))[0])})[node]

    def dbm_now_many(self, nodes: Iterable[str]) -> dict[str, float]:
        """:meth:`dbm_now` for many nodes at once: one pass of the whole lab's light where
        any of them is not known for the devices' state (a pass per node would cost the
        whole lab's nodes times over)."""
        wanted = list(nodes)

        def work_out(now: int) -> dict[str, float]:
            mw = self.powers(np.array([now]))
            return {node: float(to_dbm(mw[node])[0]) if node in mw else DARK_DBM
                    for node in wanted}

        return self._now(wanted, work_out)

    def _now(self, nodes: list[str], work_out: Callable[[int], dict[str, float]]
             ) -> dict[str, float]:
        """The power at ``nodes`` now: kept answers while the devices' revisions are those
        they were worked out at, else ``work_out(now)``, kept once every device settled."""
        now = time.monotonic_ns()
        devices = self.devices.values()
        revisions = tuple(d.revision for d in devices)
        known = [self._steady.get(node) for node in nodes]
        if all(k is not None and k[0] == revisions for k in known):
            return {node: k[1] for node, k in zip(nodes, known, strict=True) if k is not None}
        out = work_out(now)
        if all(d.settled_ns <= now for d in devices):
            self._steady.update((node, (revisions, dbm)) for node, dbm in out.items())
        return out

    def steady(self) -> tuple[int, ...] | None:
        """The devices' revisions while every device has settled (what :meth:`dbm_now`
        answers stays as it is until they move); None while a transient runs. Lets a poller
        of many nodes skip a poll that cannot find anything new."""
        now = time.monotonic_ns()
        devices = self.devices.values()
        if any(d.settled_ns > now for d in devices):
            return None
        return tuple(d.revision for d in devices)

    # -- ground truth ----------------------------------------------------------------------
    def on_change(self, change: Change) -> None:
        """Note a physical change. Its threshold crossings are worked out when someone asks
        (:meth:`crossings_since`), never on the device's reply path."""
        self._pending.append(change)

    def _settle_pending(self) -> None:
        while self._pending:
            self._crossings_of(self._pending.popleft())

    def _crossings_of(self, change: Change) -> None:
        """Find when the light at each watched node crossed the threshold during a change."""
        begin = change.arrived_ns - 100_000
        end = change.settled_ns + 1_000_000
        step = max(_STEP_NS // 10 if end - begin < 5_000_000 else _STEP_NS,
                   (end - begin) // _MAX_SAMPLES)
        times = np.arange(begin, end, step, dtype=np.int64)
        # Only light that can pass the changed device can have changed.
        powers = self.powers(times, through=change.emulator)
        for node in sorted(self.watched):
            mw = powers.get(node)
            if mw is None:
                continue
            above = to_dbm(mw) >= self.threshold_dbm
            flips = np.flatnonzero(above[1:] != above[:-1])
            for i in flips:
                self.crossings.append(Crossing(
                    next(self._seq), node, "rise" if above[i + 1] else "fall",
                    int(times[i + 1]), change.seq, change.emulator))

    def crossings_since(self, seq: int = 0) -> list[dict[str, Any]]:
        self._settle_pending()
        return [c.as_dict() for c in self.crossings if c.seq > seq]


def to_dbm(mw: np.ndarray) -> np.ndarray:
    out: np.ndarray = 10 * np.log10(np.maximum(mw, _FLOOR_MW))
    return out
