"""The physical state of an optical circuit switch: which port is joined to which, port
health, settling mirrors. Protocol interfaces (SCPI, TL1) share one model per device."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from emulators.physics.timing import TRANSIENTS, TimingModel
from emulators.physics.truth import Change, GroundTruth

Pair = tuple[int, int]
DARK_DBM = -60.0
#: Transitions remembered per port: enough to replay any trace a meter can still fetch.
HISTORY = 64


class Transition(NamedTuple):
    """A port's light moving from ``old`` partner to ``new`` (either may be None). A tuple
    of plain values, so the garbage collector stops tracking it: a 384-port switch keeps
    tens of thousands of these, and tracked objects make for long collector pauses."""

    start_ns: int
    settle_ns: int
    old: int | None
    new: int | None
    technology: str


@dataclass
class ModelError(ValueError):
    """A request the switch refuses. ``reason``: range, side, busy, failed, duplicate, self."""

    reason: str
    port: int
    message: str

    def __str__(self) -> str:
        return self.message


#: epoll waits in whole milliseconds, so a plain sleep can wake up to 1 ms late; the last
#: stretch before a deadline is spent yielding to the loop instead,
_SPIN_NS = 1_500_000
#: and the very last is held: no other device's work (a meter's reading) can make this
#: one late by more than its own share of the loop.
_HOLD_NS = 200_000


async def sleep_until(deadline_ns: int) -> None:
    """Sleep until CLOCK_MONOTONIC reaches ``deadline_ns``, accurate to tens of µs, so that
    a reply leaves when the truth log says the mirrors settled."""
    remaining = deadline_ns - time.monotonic_ns()
    if remaining > _SPIN_NS:
        await asyncio.sleep((remaining - _SPIN_NS) / 1e9)
    while deadline_ns - time.monotonic_ns() > _HOLD_NS:  # noqa: ASYNC110 - a deliberate spin
        await asyncio.sleep(0)
    while time.monotonic_ns() < deadline_ns:
        pass


_PORT_OPS = {("E", "D"): "port-disable", ("D", "E"): "port-enable", ("E", "F"): "port-fail",
             ("D", "F"): "port-fail", ("F", "E"): "port-restore", ("F", "D"): "port-restore"}


class SwitchModel:
    """An NxM switch (ingress 1..N, egress N+1..N+M) or, with ``egress == 0``, an
    any-to-any switch of N ports."""

    def __init__(self, name: str, ingress: int, egress: int, *, timing: TimingModel,
                 busy_policy: str = "deny", input_dbm: float = -3.0,
                 loss_db: float = 1.2) -> None:
        if busy_policy not in ("deny", "replace"):
            raise ValueError("busy_policy must be 'deny' or 'replace'")
        self.name = name
        self.ingress, self.egress = ingress, egress
        self.timing = timing
        self.truth = GroundTruth(name)
        self.busy_policy = busy_policy
        self.input_dbm, self.loss_db = input_dbm, loss_db
        self.connections: dict[int, int] = {}
        self._partner: dict[int, int] = {}
        self.port_state: dict[int, str] = {}  # only ports not enabled: "D" or "F"
        self.listeners: list[Callable[[Change], None]] = []
        self.port_listeners: list[Callable[[int, str], None]] = []
        self._history: dict[int, deque[Transition]] = {}
        self._state_history: dict[int, deque[tuple[int, str]]] = {}
        self.revision = 0
        """Counts changes of what light does through the switch (see optics.Transmitting)."""
        self.settled_ns = 0
        """When the latest change's transient ends."""
        #: Set by an optical model: light at a port, in dBm, now.
        self.power_probe: Callable[[int], float] | None = None

    @property
    def ports(self) -> int:
        return self.ingress + self.egress

    @property
    def any_to_any(self) -> bool:
        return self.egress == 0

    # -- queries -------------------------------------------------------------------------
    def partner(self, port: int) -> int | None:
        return self._partner.get(port)

    def state_of(self, port: int) -> str:
        return self.port_state.get(port, "E")

    def power_dbm(self, port: int) -> float:
        """Light at a port. In a lab with an optical model, what really arrives there;
        standing alone, ingress ports see ``input_dbm``, a connected egress port that less
        insertion loss; failed or shuttered paths are dark."""
        if self.power_probe is not None:
            return self.power_probe(port)
        if self.state_of(port) != "E":
            return DARK_DBM
        if not self.any_to_any and port <= self.ingress:
            return self.input_dbm
        other = self._partner.get(port)
        if other is None or self.state_of(other) != "E":
            return DARK_DBM
        return self.input_dbm - self.loss_db

    def transmissions(self, port: int, times: np.ndarray) -> dict[int, np.ndarray]:
        """For light entering ``port``, the fraction leaving through each other port at each
        of ``times`` (monotonic ns), transients and insertion loss included."""
        out: dict[int, np.ndarray] = {}
        history = self._history.get(port)
        if not history:
            partner = self._partner.get(port)
            if partner is not None:
                out[partner] = np.ones(times.shape)
        else:
            starts = np.fromiter((h.start_ns for h in history), np.int64, len(history))
            index = np.searchsorted(starts, times, side="right") - 1
            for k in np.unique(index):
                mask = index == k
                if k < 0:  # before the oldest transition we remember
                    _add(out, history[0].old, mask, 1.0, times.shape)
                    continue
                h = history[int(k)]
                span = max(1, h.settle_ns - h.start_ns)
                frac = np.clip((times[mask] - h.start_ns) / span, 0.0, 1.0)
                fall, rise = TRANSIENTS[h.technology]
                _add(out, h.old, mask, fall(frac), times.shape)
                _add(out, h.new, mask, rise(frac), times.shape)
        loss = 10 ** (-self.loss_db / 10)
        lit_here = self._lit(port, times)
        return {p: tr * loss * lit_here * self._lit(p, times) for p, tr in out.items()}

    def _lit(self, port: int, times: np.ndarray) -> np.ndarray:
        """1 where the port was enabled at each time, 0 where shuttered or failed."""
        history = self._state_history.get(port)
        if not history:
            return np.full(times.shape, 1.0 if self.state_of(port) == "E" else 0.0)
        stamps = np.fromiter((t for t, _ in history), np.int64, len(history))
        enabled = np.array([1.0 if s == "E" else 0.0 for _, s in history])
        index = np.searchsorted(stamps, times, side="right") - 1
        before = 1.0 if history[0][1] != "E" else 0.0  # the state before the first change
        return np.where(index < 0, before, enabled[np.maximum(index, 0)])

    # -- validation ------------------------------------------------------------------------
    def check_port(self, port: int) -> None:
        if not 1 <= port <= self.ports:
            raise ModelError("range", port, f"port {port} out of range 1..{self.ports}")

    def canonical(self, a: int, b: int) -> Pair:
        self.check_port(a)
        self.check_port(b)
        if a == b:
            raise ModelError("self", a, f"port {a} cannot connect to itself")
        lo, hi = min(a, b), max(a, b)
        if not self.any_to_any and not lo <= self.ingress < hi:
            raise ModelError("side", lo, f"ports {a} and {b} are on the same side")
        return lo, hi

    def canonical_batch(self, pairs: Iterable[Pair], *, refuse_failed: bool) -> list[Pair]:
        """Every pair canonical, every port once; optionally no failed port."""
        batch: list[Pair] = []
        seen: set[int] = set()
        for a, b in pairs:
            lo, hi = self.canonical(a, b)
            for p in (lo, hi):
                if p in seen:
                    raise ModelError("duplicate", p, f"port {p} appears twice")
                seen.add(p)
                if refuse_failed and self.state_of(p) == "F":
                    raise ModelError("failed", p, f"port {p} has failed")
            batch.append((lo, hi))
        return batch

    def plan_connect(self, pairs: Iterable[Pair]) -> tuple[list[Pair], list[Pair]]:
        """(to connect, to disconnect first) for adding pairs; raises ModelError."""
        add = [(lo, hi) for lo, hi in self.canonical_batch(pairs, refuse_failed=True)
               if self.connections.get(lo) != hi]
        drop: list[Pair] = []
        for lo, hi in add:
            for p in (lo, hi):
                other = self._partner.get(p)
                if other is not None:
                    if self.busy_policy == "deny":
                        raise ModelError("busy", p, f"port {p} is already connected to {other}")
                    drop.append((min(p, other), max(p, other)))
        return add, sorted(set(drop))

    def plan_disconnect(self, ports: Iterable[int]) -> list[Pair]:
        drop = set()
        for p in ports:
            self.check_port(p)
            other = self._partner.get(p)
            if other is not None:
                drop.add((min(p, other), max(p, other)))
        return sorted(drop)

    def plan_only(self, pairs: Iterable[Pair]) -> tuple[list[Pair], list[Pair]]:
        """(to connect, to disconnect) so that exactly ``pairs`` remain; unchanged pairs stay."""
        target = dict(self.canonical_batch(pairs, refuse_failed=False))
        drop = [(a, b) for a, b in self.connections.items() if target.get(a) != b]
        add = [(a, b) for a, b in target.items() if self.connections.get(a) != b]
        for p in (p for pair in add for p in pair):
            if self.state_of(p) == "F":
                raise ModelError("failed", p, f"port {p} has failed")
        return sorted(add), sorted(drop)

    # -- changes ---------------------------------------------------------------------------
    async def change(self, interface: str, op: str, connect: list[Pair],
                     disconnect: list[Pair], arrived_ns: int) -> Change | None:
        """Apply a planned change, wait until the mirrors settle, record the truth."""
        partner, connections = self._partner, self.connections
        before = {p: partner.get(p) for pair in (*connect, *disconnect) for p in pair}
        for lo, hi in disconnect:
            if connections.get(lo) == hi:
                del connections[lo]
                partner.pop(lo, None)
                partner.pop(hi, None)
        for lo, hi in connect:
            connections[lo] = hi
            partner[lo], partner[hi] = hi, lo
        moved = len(set(connect).union(disconnect))
        if not moved:
            return None
        # The mirrors start when the command reached the device, not when this process
        # got round to it: the device keeps its timing model however busy the machine.
        start = arrived_ns
        settled = start + self.timing.sample_ns(moved)
        history, technology = self._history, self.timing.technology
        for p, old in before.items():
            new = partner.get(p)
            if new != old:
                kept = history.get(p)
                if kept is None:
                    kept = history[p] = deque(maxlen=HISTORY)
                kept.append(Transition(start, settled, old, new, technology))
        self.revision += 1
        self.settled_ns = max(self.settled_ns, settled)
        await sleep_until(settled)
        change = self.truth.record(interface, op, connect, disconnect, arrived_ns, settled)
        for listener in list(self.listeners):
            listener(change)
        return change

    def set_port_state(self, port: int, state: str, interface: str = "control") -> None:
        """Enable (E), disable (D, a closed shutter) or fail (F) a port; light through it
        changes at once, so the change goes into the ground truth."""
        self.check_port(port)
        before = self.state_of(port)
        if state == before:
            return
        if state == "E":
            self.port_state.pop(port, None)
        else:
            self.port_state[port] = state
        now = time.monotonic_ns()
        self._state_history.setdefault(port, deque(maxlen=HISTORY)).append((now, state))
        self.revision += 1
        self.settled_ns = max(self.settled_ns, now)
        self.truth.record(interface, _PORT_OPS[before, state], [], [], now, now, ports=[port])
        for listener in list(self.port_listeners):
            listener(port, state)

    def reset(self) -> None:
        self.connections.clear()
        self._partner.clear()
        self.port_state.clear()
        self._history.clear()
        self._state_history.clear()
        self.revision += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "size": f"{self.ingress}x{self.egress}" if self.egress else str(self.ingress),
            "connections": [[a, b] for a, b in sorted(self.connections.items())],
            "ports": {str(p): s for p, s in sorted(self.port_state.items())},
        }


def _add(out: dict[int, np.ndarray], port: int | None, mask: np.ndarray,
         values: np.ndarray | float, shape: tuple[int, ...]) -> None:
    if port is None:
        return
    if port not in out:
        out[port] = np.zeros(shape)
    out[port][mask] = values
