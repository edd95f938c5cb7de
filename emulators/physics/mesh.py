"""A programmable photonic mesh: a Beneš network of 2x2 Mach-Zehnder interferometers whose
heaters set their phases. Its optical transfer is computed from the heater voltages the
driver board holds: imperfect couplers give finite extinction (crosstalk exists), and each
heater's phase follows its voltage with a thermo-optic time constant.

Topology (this emulator's own reading of it): B(2) is one MZI; B(N) is a column of N/2 MZIs
on line pairs (2i, 2i+1), then output 2i of MZI i feeds line i of an upper B(N/2) and
output 2i+1 line i of a lower B(N/2); their outputs j are gathered by a last column, upper
j and lower j into MZI j, whose outputs are lines 2j and 2j+1. Inputs are ports 1..N,
outputs N+1..2N. An MZI unpowered (phase 0) crosses; at phase π it is in the bar state.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emulators.physics.truth import Change, GroundTruth


@dataclass(frozen=True)
class Mzi:
    """MZI ``element`` acting on lines ``a`` and ``b``."""

    element: int
    a: int
    b: int


@dataclass(frozen=True)
class Perm:
    """Line i moves to line ``lines[i]``."""

    lines: list[int]


Step = Mzi | Perm


@dataclass
class Calibration:
    """phase = phi0 + alpha * V**2 (rad), per heater."""

    alpha: list[float]
    phi0: list[float]


def benes_steps(n: int, first: int = 0) -> tuple[list[Step], int]:
    """The flattened network on lines 0..n-1 as a list of steps, numbering MZIs from
    ``first``; returns (steps, next free MZI number)."""
    if n == 2:
        return [Mzi(first, 0, 1)], first + 1
    half = n // 2
    steps: list[Step] = []
    element = first
    for i in range(half):
        steps.append(Mzi(element, 2 * i, 2 * i + 1))
        element += 1
    # MZI i output 2i -> upper line i, output 2i+1 -> lower line half+i
    unshuffle = [0] * n
    for i in range(half):
        unshuffle[2 * i] = i
        unshuffle[2 * i + 1] = half + i
    steps.append(Perm(unshuffle))
    upper, element = benes_steps(half, element)
    lower, element = benes_steps(half, element)
    steps.extend(_offset(upper, 0, n))
    steps.extend(_offset(lower, half, n))
    shuffle = [0] * n
    for j in range(half):
        shuffle[j] = 2 * j
        shuffle[half + j] = 2 * j + 1
    steps.append(Perm(shuffle))
    for j in range(half):
        steps.append(Mzi(element, 2 * j, 2 * j + 1))
        element += 1
    return steps, element


def _offset(steps: list[Step], base: int, n: int) -> list[Step]:
    """Place a sub-network's steps on lines base..base+len-1 of an n-line network."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, Mzi):
            out.append(Mzi(step.element, step.a + base, step.b + base))
        else:
            full = list(range(n))
            for line, target in enumerate(step.lines):
                full[line + base] = target + base
            out.append(Perm(full))
    return out


@dataclass
class MeshOptions:
    ports: int = 8
    coupler_error: float = 0.01
    """Spread of the couplers' splitting ratio around 0.5 (sets the extinction)."""
    tau_us: float = 6.0
    """Thermo-optic time constant; a change settles (99%) in 5 tau."""
    v_pi: float = 5.0
    calibration_error: float = 0.0
    """Fractional error of each heater's true alpha against the nominal calibration."""
    seed: int = 7


@dataclass
class _Heater:
    target: float = 0.0  # phase the current voltage asks for
    start: float = 0.0  # phase when that voltage was applied
    since_ns: int = 0


#: Heater changes whose previous settings are kept (see MeshModel._history).
_HISTORY = 2048
#: Settled routes remembered per heater setting: a replay's configurations recur.
_ROUTE_MEMO = 512
#: Where an input's two brightest outputs are this close (power fractions), the column path
#: of :meth:`MeshModel._column_routes` could rank them otherwise than the step-by-step one;
#: such a setting is worked out step by step, which is what defines the routes.
_NEAR_TIE = 1e-9


class MeshModel:
    def __init__(self, name: str, options: MeshOptions) -> None:
        n = options.ports
        if n < 2 or n & (n - 1) or n > 64:
            raise ValueError(f"mesh ports {n}: a Beneš mesh needs a power of two, 2..64")
        self.name = name
        self.options = options
        self.ports = n
        self.steps, self.elements = benes_steps(n)
        rng = random.Random(options.seed)
        self.kappa = [(0.5 + rng.uniform(-options.coupler_error, options.coupler_error),
                       0.5 + rng.uniform(-options.coupler_error, options.coupler_error))
                      for _ in range(self.elements)]
        alpha = math.pi / options.v_pi ** 2
        self.nominal = Calibration([alpha] * self.elements, [0.0] * self.elements)
        self.true_alpha = [alpha * (1 + rng.uniform(-options.calibration_error,
                                                    options.calibration_error))
                           for _ in range(self.elements)]
        self.heaters = [_Heater() for _ in range(self.elements)]
        self.volts: dict[int, float] = {}
        self.dead: set[int] = set()
        self.truth = GroundTruth(name)
        self.listeners: list[Callable[[Change], None]] = []
        # The settings before each change, for light at past instants: the optical model
        # works out a change's threshold crossings only when asked, perhaps hundreds of
        # heater commands later (the old settings must still be here then).
        self._history: deque[tuple[int, list[_Heater]]] = deque(maxlen=_HISTORY)
        self._stamps: tuple[int, np.ndarray] | None = None  # (version, the history's stamps)
        self._version = 0
        self.settled_ns = 0
        """When the latest heater change is exactly at its target (see _phases)."""
        self._phase_cache: tuple[tuple[int, int, int, int], np.ndarray,
                                 np.ndarray | None] | None = None
        self._route_memo: dict[tuple[float, ...], dict[int, int]] = {}
        self._column_plan = self._columns()
        # _mzi's entries m = scale·e^{iφ} + offset, rows m00, m01, m10, m11 per element, of
        # t = sqrt(1 - kappa) and c = j·sqrt(kappa): for _column_routes
        c = 1j * np.sqrt(np.array(self.kappa))
        t = np.sqrt(1 - np.array(self.kappa))
        t1, c1, t2, c2 = t[:, 0], c[:, 0], t[:, 1], c[:, 1]
        self._couplers = (np.stack((t2 * t1, t2 * c1, c2 * t1, c2 * c1)),
                          np.stack((c2 * c1, c2 * t1, t2 * c1, t2 * t1)))
        self.routes: dict[int, int] = self._routes()

    # -- heaters ---------------------------------------------------------------------------
    def phase_for(self, element: int, volts: float) -> float:
        if element in self.dead:
            return 0.0
        return self.true_alpha[element] * volts * volts

    def apply_voltages(self, volts: dict[int, float], arrived_ns: int, interface: str) -> None:
        """New heater voltages take effect now; phases move with the thermal constant."""
        self.volts.update(volts)
        self._retarget({e: self.phase_for(e, v) for e, v in volts.items()}, arrived_ns,
                       interface, "heaters")

    def kill_heater(self, element: int, now_ns: int) -> None:
        """A heater fails open: its phase relaxes to zero whatever it is driven with."""
        self.dead.add(element)
        self._retarget({element: 0.0}, now_ns, "control", "heater-dead")

    def revive_heater(self, element: int, now_ns: int) -> None:
        self.dead.discard(element)
        self._retarget({element: self.phase_for(element, self.volts.get(element, 0.0))},
                       now_ns, "control", "heater-revived")

    def _retarget(self, targets: dict[int, float], now: int, interface: str, op: str) -> None:
        # Heaters are replaced, never changed in place: the history keeps the list as it
        # was, and only the heaters a command touches are made anew.
        before_heaters = self.heaters
        self._history.append((now, before_heaters))
        self._version += 1
        self.settled_ns = max(self.settled_ns, now + int(40 * self.options.tau_us * 1000))
        before = self.routes
        tau_ns = self.options.tau_us * 1000
        heaters = list(before_heaters)
        for element, target in targets.items():
            heater = before_heaters[element]
            # Its phase now, by the first-order response of _phases, for this heater only.
            start = heater.target
            if now - heater.since_ns < 40 * tau_ns:
                decay = math.exp(-max(0, now - heater.since_ns) / tau_ns)
                start = heater.target + (heater.start - heater.target) * decay
            heaters[element] = _Heater(target, start, now)
        self.heaters = heaters
        self.routes = self._routes()
        settled = now + int(5 * self.options.tau_us * 1000)
        connected = sorted((a, b) for a, b in self.routes.items() if before.get(a) != b)
        disconnected = sorted((a, b) for a, b in before.items() if self.routes.get(a) != b)
        change = self.truth.record(interface, op, connected, disconnected, now, settled)
        for listener in list(self.listeners):
            listener(change)

    def _phases(self, times: np.ndarray, heaters: list[_Heater] | None = None) -> np.ndarray:
        """Heater phases (times x elements) under the given (default: current) settings."""
        hs = heaters if heaters is not None else self.heaters
        target = np.array([h.target for h in hs])
        start = np.array([h.start for h in hs])
        since = np.array([h.since_ns for h in hs], dtype=np.int64)
        tau_ns = self.options.tau_us * 1000
        out: np.ndarray = np.tile(target, (times.size, 1))
        if not times.size:
            return out
        # Past 40 time constants (e^-40 ≈ 4e-18) a heater is exactly at its target: only
        # heaters changed shortly before these times are worked out, and settled instants
        # have identical phases (they then share one propagation).
        moving = np.flatnonzero(times.min() - since < 40 * tau_ns)
        if moving.size:
            dt = np.maximum(0, times[:, None] - since[None, moving]) / tau_ns
            decay = np.where(dt > 40.0, 0.0, np.exp(-np.minimum(dt, 40.0)))
            out[:, moving] = target[moving] + (start[moving] - target[moving]) * decay
        return out

    def _cached_phases(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """phases_at as (each run of equal phases once, the run of each time; None: every
        time its own), remembered for the last times asked: the optical model asks once
        per input for the same instants. Light only changes while heaters move, so a log
        of a settled mesh is one propagation, not thousands."""
        key = (self._version, times.size, int(times[0]) if times.size else 0,
               int(times[-1]) if times.size else 0)
        if self._phase_cache is None or self._phase_cache[0] != key:
            phases = self.phases_at(times)
            runs = None
            if phases.shape[0] > 1:
                new = np.empty(phases.shape[0], dtype=bool)
                new[0] = True
                np.any(phases[1:] != phases[:-1], axis=1, out=new[1:])
                if not new.all():
                    phases, runs = phases[new], np.cumsum(new) - 1
            self._phase_cache = (key, phases, runs)
        return self._phase_cache[1], self._phase_cache[2]

    def phases_at(self, times: np.ndarray) -> np.ndarray:
        """Phases at each time, under the settings that were current then: those saved
        before the first change after it (the current ones after the last change)."""
        out = self._phases(times)
        if not self._history or not times.size:
            return out
        if self._stamps is None or self._stamps[0] != self._version:
            self._stamps = (self._version, np.array([stamp for stamp, _ in self._history],
                                                    dtype=np.int64))
        stamps = self._stamps[1]
        if np.any(stamps[1:] < stamps[:-1]):
            return self._phases_replayed(times, out)
        # Each time's settings at once (each instant was worked out again under every
        # later change's saved settings: thousands of instants times each change since).
        which = np.searchsorted(stamps, times, side="right")
        for index in np.unique(which):
            if index == len(stamps):
                continue  # after the last change: the current settings
            at = which == index
            out[at] = self._phases(times[at], self._history[int(index)][1])
        return out

    def _phases_replayed(self, times: np.ndarray, out: np.ndarray) -> np.ndarray:
        """phases_at for changes stamped out of order (commands from sessions whose clocks
        interleave): each saved setting, newest first, for the times before its change."""
        for stamp, heaters in reversed(self._history):
            earlier = times < stamp
            if not earlier.any():
                break
            out[earlier] = self._phases(times[earlier], heaters)
        return out

    # -- light -----------------------------------------------------------------------------
    def _mzi(self, element: int, phase: np.ndarray) -> tuple[np.ndarray, ...]:
        """The four entries (each over T) of one MZI's transfer
        coupler2 · diag(e^{iφ}, 1) · coupler1, a coupler being [[t, jc], [jc, t]]."""
        k1, k2 = self.kappa[element]
        t1, c1 = math.sqrt(1 - k1), 1j * math.sqrt(k1)
        t2, c2 = math.sqrt(1 - k2), 1j * math.sqrt(k2)
        e = np.exp(1j * phase)
        return (t2 * t1 * e + c2 * c1, t2 * c1 * e + c2 * t1,
                c2 * t1 * e + t2 * c1, c2 * c1 * e + t2 * t1)

    def propagate(self, inputs: list[int], times: np.ndarray) -> np.ndarray:
        """Output power fractions (T x inputs x N) for light entering each of ``inputs``
        (ports 1..N), at each time."""
        distinct, runs = self._cached_phases(times)
        power = self._propagate(inputs, distinct)
        return power if runs is None else power[runs]

    def _propagate(self, inputs: list[int], phases: np.ndarray) -> np.ndarray:
        amp = np.zeros((phases.shape[0], len(inputs), self.ports), dtype=complex)
        for k, port in enumerate(inputs):
            amp[:, k, port - 1] = 1.0
        for step in self.steps:
            if isinstance(step, Perm):
                moved = np.empty_like(amp)
                moved[:, :, np.asarray(step.lines)] = amp
                amp = moved
            else:
                m00, m01, m10, m11 = self._mzi(step.element, phases[:, step.element])
                a, b = amp[:, :, step.a].copy(), amp[:, :, step.b].copy()
                amp[:, :, step.a] = m00[:, None] * a + m01[:, None] * b
                amp[:, :, step.b] = m10[:, None] * a + m11[:, None] * b
        power: np.ndarray = np.abs(amp) ** 2
        return power

    def transmissions(self, port: int, times: np.ndarray) -> dict[int, np.ndarray]:
        if not 1 <= port <= self.ports:
            return {}  # light sent into an output goes nowhere useful
        power = self.propagate([port], np.asarray(times, dtype=np.int64))[:, 0, :]
        return {self.ports + j + 1: power[:, j] for j in range(self.ports)}

    def transfer_now(self) -> np.ndarray:
        """N x N settled power transfer, inputs as rows, with the current settings. Settled
        phases are the heaters' targets: nothing is replayed, and the optical model's
        cached phases (its instants, not this one) are left alone."""
        targets = np.array([[h.target for h in self.heaters]])
        transfer: np.ndarray = self._propagate(list(range(1, self.ports + 1)), targets)[0]
        return transfer

    def _routes(self) -> dict[int, int]:
        """Where most of each input's light ends up once settled."""
        return self._settled_routes(tuple(h.target for h in self.heaters))

    def _settled_routes(self, targets: tuple[float, ...]) -> dict[int, int]:
        """The routes of settled phases ``targets``. Every heater command asks for them (the
        ground truth's connected and disconnected pairs), so one instant is worked out by
        columns (_columns: a few array operations a column, not a dozen a step) and each
        setting is remembered."""
        known = self._route_memo.get(targets)
        if known is not None:
            return known
        routes = self._column_routes(targets)
        if routes is None:
            transfer = self._propagate(list(range(1, self.ports + 1)), np.array([targets]))[0]
            routes = {i + 1: self.ports + int(np.argmax(transfer[i])) + 1
                      for i in range(self.ports)}
        if len(self._route_memo) >= _ROUTE_MEMO:
            del self._route_memo[next(iter(self._route_memo))]
        self._route_memo[targets] = routes
        return routes

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The network regrouped for one instant into columns, each one matrix. A
        permutation only renames which row of the amplitudes holds which line; each MZI
        goes into the first column after the last one that touched either of its rows
        (MZIs on other rows commute with it). Returns the columns' matrices with the rows
        no MZI of theirs touches (identity), where in them (flat) each MZI's four entries
        go, which entries of _column_routes' (entry, element) array those are (flat), and
        the row of each output line."""
        n = self.ports
        row_of = list(range(n))
        last = [-1] * n
        columns: list[list[tuple[int, int, int]]] = []
        for step in self.steps:
            if isinstance(step, Perm):
                moved = [0] * n
                for line, target in enumerate(step.lines):
                    moved[target] = row_of[line]
                row_of = moved
                continue
            ra, rb = row_of[step.a], row_of[step.b]
            column = max(last[ra], last[rb]) + 1
            if column == len(columns):
                columns.append([])
            columns[column].append((ra, rb, step.element))
            last[ra] = last[rb] = column
        base = np.zeros((len(columns), n, n), dtype=complex)
        where: list[int] = []
        which: list[int] = []
        for index, members in enumerate(columns):
            untouched = set(range(n)) - {r for ra, rb, _ in members for r in (ra, rb)}
            for r in untouched:
                base[index, r, r] = 1.0
            for ra, rb, element in members:
                # new[ra] = m00·old[ra] + m01·old[rb]; new[rb] = m10·old[ra] + m11·old[rb]
                for entry, (r, c) in enumerate(((ra, ra), (ra, rb), (rb, ra), (rb, rb))):
                    where.append((index * n + r) * n + c)
                    which.append(entry * self.elements + element)
        return base, np.array(where), np.array(which), np.array(row_of)

    def _column_routes(self, targets: tuple[float, ...]) -> dict[int, int] | None:
        """Settled routes by columns; None where an input's two brightest outputs are too
        close to rank without the step-by-step path (see _NEAR_TIE)."""
        base, where, which, output_rows = self._column_plan
        scale, offset = self._couplers
        entries = scale * np.exp(1j * np.asarray(targets)) + offset  # _mzi's, per element
        columns = base.copy()
        np.put(columns, where, entries.take(which))
        amp = columns[0]  # row: a line; column: the input lit
        for column in columns[1:]:
            amp = column @ amp
        power = np.abs(amp[output_rows].T) ** 2  # input x output
        ranked = np.sort(power, axis=1)
        if (ranked[:, -1] - ranked[:, -2] < _NEAR_TIE).any():
            return None
        best = np.argmax(power, axis=1)
        return {i + 1: self.ports + int(best[i]) + 1 for i in range(self.ports)}

    @property
    def revision(self) -> int:
        """Counts changes of what light does through the mesh (see optics.Transmitting)."""
        return self._version

    def reset(self) -> None:
        self.heaters = [_Heater() for _ in range(self.elements)]
        self._history.clear()
        self.volts.clear()
        self.dead.clear()
        self._version += 1
        self.routes = self._routes()

    def snapshot(self) -> dict[str, object]:
        return {"size": f"{self.ports}x{self.ports}",
                "routes": [[a, b] for a, b in sorted(self.routes.items())],
                "dead_heaters": sorted(self.dead)}

