"""A programmable photonic mesh as an optical switch: a Beneš network of 2x2 MZIs whose
heaters hang off a Qontrol-style board (heater k on channel k).

Routing is the looping algorithm: a Beneš network is rearrangeably non-blocking, so every
permutation routes, but adding a pair may need to move others. :meth:`connect` therefore
refuses, before sending anything, a request that would disturb an existing circuit (and
says which); :meth:`replace` rearranges freely. Where the algorithm has a free choice it
keeps an element in the state it already holds, so circuits stay put when they can.

An MZI crosses when unpowered (phase 0) and is in the bar state at phase π; a heater's phase
is ``phi0 + alpha * V**2`` (its calibration, from the lab file or nominal ``v_pi``).
Ports 1..N are inputs, N+1..2N outputs. The mesh cannot make light vanish: a disconnected
input still goes somewhere, so :meth:`disconnect` only retires the circuit.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from instruments import qontrol
from instruments.errors import ConnectError, InvalidRequest
from instruments.link import Link, LinkSettings
from instruments.switch import CrossConnects, OpticalSwitch, Pair, PortState, SwitchInfo

BAR, CROSS = "bar", "cross"


def element_count(n: int) -> int:
    return n // 2 * (2 * int(math.log2(n)) - 1)


def route(perm: list[int], prefer: dict[int, str] | None = None, first: int = 0
          ) -> dict[int, str]:
    """Element states that realise ``perm`` (input i → output perm[i], 0-based) on a Beneš
    network whose elements are numbered from ``first`` (first column, upper sub-network,
    lower sub-network, last column). ``prefer`` breaks free choices."""
    n = len(perm)
    prefer = prefer or {}
    if n == 2:
        return {first: BAR if perm[0] == 0 else CROSS}
    half = n // 2
    inverse = [0] * n
    for i, o in enumerate(perm):
        inverse[o] = i
    # Colour inputs upper/lower: the two inputs of a first-column element differ, and so
    # do the two inputs whose outputs share a last-column element. Each input has exactly
    # these two constraints, so they form even cycles and a 2-colouring always exists.
    upper: list[bool | None] = [None] * n
    for start in range(n):
        if upper[start] is not None:
            continue
        # A free choice: keep the first-column element as it is, if we know how it is.
        state = prefer.get(first + start // 2)
        upper[start] = (start % 2 == 0) == (state != CROSS)
        stack = [start]
        while stack:
            x = stack.pop()
            for y in (x ^ 1, inverse[perm[x] ^ 1]):
                if upper[y] is None:
                    upper[y] = not upper[x]
                    stack.append(y)
    states: dict[int, str] = {}
    for i in range(half):
        states[first + i] = BAR if upper[2 * i] else CROSS
    sub_up, sub_down = [0] * half, [0] * half
    out_from_upper = [False] * n
    for i in range(n):
        if upper[i]:
            sub_up[i // 2] = perm[i] // 2
            out_from_upper[perm[i]] = True
        else:
            sub_down[i // 2] = perm[i] // 2
    up_first = first + half
    down_first = up_first + element_count(half)
    last_first = down_first + element_count(half)
    states.update(route(sub_up, prefer, up_first))
    states.update(route(sub_down, prefer, down_first))
    for j in range(half):
        states[last_first + j] = BAR if out_from_upper[2 * j] else CROSS
    return states


def trace(states: dict[int, str], n: int, line: int, first: int = 0
          ) -> tuple[int, list[int]]:
    """Follow input ``line`` (0-based) through ideal elements: (output, elements passed)."""
    if n == 2:
        return (line if states[first] == BAR else line ^ 1), [first]
    half = n // 2
    element = first + line // 2
    lower = (line % 2 == 0) != (states[element] == BAR)  # leaves on its element's odd line
    up_first = first + half
    down_first = up_first + element_count(half)
    last_first = down_first + element_count(half)
    sub_first = down_first if lower else up_first
    out, passed = trace(states, half, line // 2, sub_first)
    last = last_first + out
    # the last column: from the upper half arrives on its even line, from the lower its odd
    arrives_even = not lower
    output = 2 * out + (0 if arrives_even == (states[last] == BAR) else 1)
    return output, [element, *passed, last]


class MeshSwitch(OpticalSwitch):
    """Options: ``size`` (``NxN``, N a power of two), ``v_pi`` (default 5 V) or
    ``calibration`` ({"alpha": [...], "phi0": [...]} per heater), ``settle_us`` (thermal
    settling waited after each change, default 50), and the heaters' limits ``vmax``
    (V), ``imax`` (mA), ``channel_limits`` (:class:`instruments.qontrol.Limits`)."""

    driver = "qontrol-mesh"
    done_on_reply = False  # the heaters settle after the board's reply
    disconnect_darkens = False  # light keeps its way until the pair is routed elsewhere
    default_settings = LinkSettings(write_termination="\n", read_termination="\n", timeout=1.0)

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        if not self.declared_size or self.declared_size[0] != self.declared_size[1]:
            raise InvalidRequest("a mesh needs size = 'NxN'", instrument=self.name)
        n = self.declared_size[0]
        if n < 2 or n & (n - 1):
            raise InvalidRequest(f"mesh size {n}x{n}: N must be a power of two",
                                 instrument=self.name)
        self.n = n
        self.elements = element_count(n)
        calibration = self.options.get("calibration") or {}
        alpha = math.pi / float(self.options.get("v_pi", 5.0)) ** 2
        self.alpha = [float(a) for a in calibration.get("alpha", [alpha] * self.elements)]
        self.phi0 = [float(p) for p in calibration.get("phi0", [0.0] * self.elements)]
        if len(self.alpha) != self.elements or len(self.phi0) != self.elements:
            raise InvalidRequest(f"calibration needs {self.elements} alpha and phi0 values "
                                 f"for a {n}x{n} mesh", instrument=self.name)
        self.settle_s = float(self.options.get("settle_us", 50)) * 1e-6
        self.limits = qontrol.Limits.of(self.options)
        self._refuse_unreachable()
        self.board: qontrol.BoardInfo | None = None
        self.states: dict[int, str] = {}
        self.volts: dict[int, float] = {}
        """What each heater's channel holds, as read back or as last sent (so a vector
        command may run over a channel it does not change)."""

    # -- physics of the driver's side ------------------------------------------------------
    def volts_for(self, element: int, state: str) -> float:
        target = math.pi if state == BAR else 0.0
        phase = (target - self.phi0[element]) % (2 * math.pi)
        return math.sqrt(phase / self.alpha[element])

    def _refuse_unreachable(self) -> None:
        """Every heater must reach both states within its limit: a calibration that asks
        more of a heater than its ``vmax`` is refused here, before any connect, rather
        than leaving a route that can never be made."""
        for k in range(self.elements):
            limit = self.limits.limit(k, "v")
            if limit is None:
                continue
            for state in (BAR, CROSS):
                needed = float(qontrol.number(self.volts_for(k, state)))
                if needed > limit:
                    raise InvalidRequest(
                        f"heater {k} needs {needed:g} V for the {state} state (its "
                        f"calibration) but {self.limits.name(k, 'v')} forbids it; fix the "
                        "calibration or the limit", instrument=self.name)

    def state_from(self, element: int, volts: float) -> str:
        phase = (self.phi0[element] + self.alpha[element] * volts * volts) % (2 * math.pi)
        return BAR if abs(phase - math.pi) < math.pi / 2 else CROSS

    def paths(self) -> dict[int, list[tuple[int, str]]]:
        """Each circuit's elements, one per column of the network, as the mesh holds them."""
        if not self.states:
            return {}
        return {a: [(k, self.states[k]) for k in trace(self.states, self.n, a - 1)[1]]
                for a in sorted(self.expected)}

    def routing(self, states: dict[int, str]) -> dict[int, int]:
        return {i + 1: self.n + trace(states, self.n, i)[0] + 1 for i in range(self.n)}

    # -- OpticalSwitch ---------------------------------------------------------------------
    async def _identify(self, link: Link) -> SwitchInfo:
        board = await qontrol.identify(link)
        if board.channels < self.elements:
            raise ConnectError(f"a {self.n}x{self.n} mesh has {self.elements} heaters but the "
                               f"board drives {board.channels} channels", instrument=self.name)
        differed = await qontrol.program_limits(link, self.limits, board)
        if differed and self.board is not None:
            self._warn(qontrol.limits_reset(differed, self.limits, board))
        self.board = board
        self._read_back(await qontrol.read_volts(link, board.channels))
        return SwitchInfo("Qontrol", f"Benes {self.n}x{self.n} mesh", board.id,
                          f"{len(board.modules)} modules", self.n, self.n)

    async def _probe(self, link: Link) -> None:
        assert self.board is not None
        await qontrol.probe(link, self.board.id)

    def _read_back(self, volts: list[float]) -> None:
        self.volts = {k: volts[k] for k in range(self.elements)}
        self.states = {k: self.state_from(k, volts[k]) for k in range(self.elements)}

    async def _read_map(self, link: Link) -> CrossConnects:
        assert self.board is not None
        self._read_back(await qontrol.read_volts(link, self.board.channels))
        routes = self.routing(self.states)
        # Every input goes somewhere; only the circuits we were asked for are circuits.
        return {a: b for a, b in routes.items() if a in self.expected}

    def plan(self, circuits: CrossConnects, *, keep: CrossConnects) -> dict[int, str]:
        """States for ``circuits``; raises InvalidRequest if a circuit in ``keep`` would be
        disturbed on the way."""
        perm = [-1] * self.n
        used = set()
        for a, b in circuits.items():
            perm[a - 1] = b - self.n - 1
            used.add(b - self.n - 1)
        current = self.routing(self.states) if self.states else {}
        free = [o for o in range(self.n) if o not in used]
        for i in range(self.n):  # inputs without a circuit keep their way if it is free
            if perm[i] < 0:
                now = current.get(i + 1, 0) - self.n - 1
                perm[i] = now if now in free else free[0]
                free.remove(perm[i])
        states = route(perm, self.states)
        moved = {k for k, s in states.items() if self.states.get(k, CROSS) != s}
        disturbed = sorted(
            (a, b) for a, b in keep.items()
            if moved & set(trace(self.states, self.n, a - 1)[1]))
        if disturbed:
            raise InvalidRequest(
                f"routing {sorted(set(circuits.items()) - set(keep.items()))} through the "
                f"mesh would disturb circuits {disturbed}; replace() rearranges them",
                instrument=self.name)
        return states

    async def _apply(self, link: Link, states: dict[int, str]) -> None:
        changed = {k: self.volts_for(k, s) for k, s in states.items()
                   if self.states.get(k) != s}
        if changed:
            # Never believed to be in range: checked against the limits on every change,
            # whatever plan made it, before a byte is written.
            qontrol.refuse_beyond(self.limits, {k: float(qontrol.number(v))
                                                for k, v in changed.items()}, "v", self.name)
            try:
                await qontrol.set_and_sync(link, qontrol.vector_commands(changed,
                                                                         known=self.volts))
            except BaseException:
                # Some of the batch may have been applied: what those channels hold is not
                # known until read back, and no vector runs over them meanwhile.
                for k in changed:
                    self.volts.pop(k, None)
                raise
            self.volts.update({k: float(qontrol.number(v)) for k, v in changed.items()})
            self.states.update(states)
            await self._settle()

    async def _settle(self) -> None:
        """Thermal settling after the board's answer: then the change is done. A loop timer
        cannot time tens of µs: uvloop runs a sub-millisecond timer at once (a change was
        acknowledged before its heaters had settled) and the standard loop's fire a
        millisecond or more late. So the wait yields to the loop until the monotonic clock
        passes the end, sleeping on a timer only the part of a long settling it can time."""
        end = time.monotonic() + self.settle_s
        while (left := end - time.monotonic()) > 0:  # noqa: ASYNC110 - a clock, not a state
            await asyncio.sleep(left - 0.002 if left > 0.003 else 0)

    async def _connect(self, link: Link, pairs: list[Pair]) -> None:
        for a, b in pairs:
            if self.partner_map().get(a, b) != b or self.partner_map().get(b, a) != a:
                raise InvalidRequest(f"pair ({a}, {b}): a port is already in a circuit",
                                     instrument=self.name)
        circuits = {**self.expected, **dict(pairs)}
        await self._apply(link, self.plan(circuits, keep=dict(self.expected)))

    async def _disconnect(self, link: Link, lows: list[int]) -> None:
        return None  # light keeps its way; the circuit is only retired

    async def _replace(self, link: Link, target: CrossConnects) -> None:
        await self._apply(link, self.plan(target, keep={}))

    async def _port_states(self, link: Link, ports: list[int] | None) -> dict[int, PortState]:
        return {p: PortState.ENABLED for p in (ports or range(1, 2 * self.n + 1))}
