"""The availability model: what each failure of a training job costs under three ways of
recovering from it, and the effective training time ratio (ETTR) that is left.

A job of N GPUs on hosts of ``gpus_per_host`` needs ``hours`` of training and checkpoints
every ``checkpoint_min`` of it. Failures arrive while it trains, at the profile's rates per
GPU-hour; each stops all of it. What one costs, in hours of the whole job (times N for
GPU-hours):

- **optical spare swap** (labd): the failure detected and a spare host switched in through
  the optical fabric, as measured on the rig (failure → every new link up), with the
  switch's time replaced by ``ocs_ms`` where that is given; then the NICs' link-up
  (``link_up_s``), the framework's restart and the training since the last checkpoint;
- **checkpoint restart after repair** (no spare): detection, the class's repair time, the
  restart and the lost training;
- **standby without a fabric**: detection, moving the job onto a standby host by hand or
  scheduler (``standby_s``: re-cabling, rescheduling), the restart and the lost training.

The two that swap need a spare host: a pool of ``spares`` hosts, each swapped-out host
going back to it once repaired (on the wall clock: the training done and every hour lost
before); with none free, the failure costs what it costs without a spare. A class without
a recovery path on the rig (``none``: software, a cable, planned work) costs the same under
every strategy: its repair time (0 by default: restarted in place), the restart and,
unless planned, the lost training.

ETTR is ``hours / (hours + hours lost)``: the training's share of the wall clock. Its 95 %
interval is over ``traces`` draws of the failure process (labd.measure.failures), each
failure's measured recovery drawn from the rig's. Every strategy is costed on the same
draws, so their difference is paired.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from labd.errors import ProfileError
from labd.measure.failures import (
    Profile,
    Trace,
    check_expected,
    events_trace,
    sample_trace,
)

STRATEGIES = ("optical", "no-spare", "standby")
STRATEGY_LABELS = {"optical": "optical spare swap (labd)",
                   "no-spare": "checkpoint restart after repair",
                   "standby": "standby host, no fabric"}

#: TrainMover (citing Alibaba HPN): an 8,192-GPU job loses 6.47 min per interruption, 4.45
#: min of it the framework's initialisation: checkpoint load 35.1 %, NCCL communicators
#: 24.5 %, cold warm-up 40.4 %.
TRAINMOVER_LOST_S = 6.47 * 60
TRAINMOVER_INIT_S = 4.45 * 60
RESTART_DEFAULTS_S = {"checkpoint_load": 0.351 * TRAINMOVER_INIT_S,
                      "communicators": 0.245 * TRAINMOVER_INIT_S,
                      "warmup": 0.404 * TRAINMOVER_INIT_S}
#: Moving a job onto a standby host without a fabric: the rest of TrainMover's 6.47 min
#: (what is not the framework's initialisation).
STANDBY_DEFAULT_S = TRAINMOVER_LOST_S - TRAINMOVER_INIT_S
#: Operators keep about 6 % of GPUs as standby (TrainMover, citing Alibaba HPN).
STANDBY_SHARE = 0.06
#: MixNet (SIGCOMM 2025) on a Polatis over TL1: OCS done → NIC active, mean (p99 6.33 s).
MIXNET_LINK_UP_S = 5.67
#: Repair time per recovery path when the user gives none (hours): an assumption, no
#: source: a GPU or host swapped by a technician in a working day's queue.
REPAIR_DEFAULT_H = {"gpu": 4.0, "host": 4.0, "none": 0.0}
CHECKPOINT_DEFAULT_MIN = 30.0


@dataclass(frozen=True)
class ModelInputs:
    """What the model is given besides the failure profile and the rig's measurements."""

    gpus: int
    hours: float
    gpus_per_host: int = 8
    checkpoint_min: float = CHECKPOINT_DEFAULT_MIN
    restart_s: dict[str, float] = field(default_factory=lambda: dict(RESTART_DEFAULTS_S))
    link_up_s: float = 0.0
    standby_s: float = STANDBY_DEFAULT_S
    repair_h: dict[str, float] = field(default_factory=dict)
    """Per class id; a class not named takes REPAIR_DEFAULT_H of its path."""
    spares: int | None = None
    """Spare hosts (None: STANDBY_SHARE of the job's hosts)."""
    ocs_ms: float | None = None
    """The switch's time in place of the measured one (None: as measured)."""
    rate_scale: float = 1.0

    def check(self) -> None:
        problems = []
        if self.gpus < 1 or self.gpus_per_host < 1:
            problems.append("--gpus and --gpus-per-host must be at least 1")
        for name, value in (("--hours", self.hours), ("--checkpoint-min", self.checkpoint_min),
                            ("--rate-scale", self.rate_scale)):
            if not math.isfinite(value) or value <= 0:
                problems.append(f"{name} {value}: expected a positive number")
        for name, value in (("--link-up-s", self.link_up_s), ("--standby-s", self.standby_s),
                            *((f"--restart {k}", v) for k, v in self.restart_s.items()),
                            *((f"--repair-h {k}", v) for k, v in self.repair_h.items()),
                            ("--ocs-ms", self.ocs_ms if self.ocs_ms is not None else 0.0)):
            if not math.isfinite(value) or value < 0:
                problems.append(f"{name} {value}: expected a number ≥ 0")
        if self.spares is not None and self.spares < 0:
            problems.append(f"--spares {self.spares}: expected 0 or more")
        if problems:
            raise ProfileError("; ".join(problems))

    @property
    def hosts(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_host)

    @property
    def spare_hosts(self) -> int:
        return self.spares if self.spares is not None else math.ceil(
            STANDBY_SHARE * self.hosts)

    def repair_of(self, profile: Profile) -> np.ndarray:
        """Each class's repair time, hours."""
        unknown = sorted(set(self.repair_h) - {c.id for c in profile.classes})
        if unknown:
            raise ProfileError(f"--repair-h: no class {', '.join(unknown)} in profile "
                               f"{profile.name} (classes: "
                               f"{', '.join(c.id for c in profile.classes)})")
        return np.array([self.repair_h.get(c.id, REPAIR_DEFAULT_H[c.path])
                         for c in profile.classes])

    def restart_total_s(self) -> float:
        return sum(self.restart_s.values())


@dataclass(frozen=True)
class Recoveries:
    """The rig's recoveries per path (gpu, host), in seconds: failure → detected, and
    detected → every new link up split into the switch's part (spare chosen → switches
    acknowledged) and the rest (labd's own work, light, links)."""

    detect_s: dict[str, np.ndarray]
    switching_s: dict[str, np.ndarray]
    rest_s: dict[str, np.ndarray]
    pooled: tuple[str, ...] = ()
    """Paths with no recovery of their own, given every path's together."""

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]]) -> Recoveries:
        """From kept drill rows (labd.emulation.drill.DrillResult.row) that recovered."""
        detect: dict[str, list[float]] = {"gpu": [], "host": []}
        switching: dict[str, list[float]] = {"gpu": [], "host": []}
        rest: dict[str, list[float]] = {"gpu": [], "host": []}
        for row in rows:
            ms = row.get("ms") or {}
            if row.get("outcome") != "recovered" or not all(
                    k in ms for k in ("detected", "spare_chosen", "switches_acked",
                                      "links_up")):
                continue
            path = row["kind"]
            switch = max(0.0, ms["switches_acked"] - ms["spare_chosen"])
            detect[path].append(ms["detected"] / 1000)
            switching[path].append(switch / 1000)
            rest[path].append(max(0.0, ms["links_up"] - ms["detected"] - switch) / 1000)
        return cls.of(detect, switching, rest)

    @classmethod
    def of(cls, detect: dict[str, list[float]], switching: dict[str, list[float]],
           rest: dict[str, list[float]]) -> Recoveries:
        pooled = tuple(p for p in ("gpu", "host") if not detect.get(p))
        every = [p for p in ("gpu", "host") if detect.get(p)]
        if not every:
            raise ProfileError("no recovery was measured: the model needs at least one "
                               "drill that recovered")

        def arrays(values: dict[str, list[float]]) -> dict[str, np.ndarray]:
            together = np.concatenate([np.asarray(values[p], dtype=float) for p in every])
            return {p: np.asarray(values[p], dtype=float) if p in every else together
                    for p in ("gpu", "host")}

        return cls(arrays(detect), arrays(switching), arrays(rest), pooled)

    def draw(self, path: str, n: int, rng: np.random.Generator, ocs_ms: float | None
             ) -> tuple[np.ndarray, np.ndarray]:
        """(detection, detection → links up) for ``n`` failures, seconds, each a measured
        recovery drawn at random (the switch's part ``ocs_ms`` where given)."""
        pick = rng.integers(0, len(self.detect_s[path]), size=n)
        switch = (self.switching_s[path][pick] if ocs_ms is None
                  else np.full(n, ocs_ms / 1000))
        return self.detect_s[path][pick], switch + self.rest_s[path][pick]


def swap_or_wait(trace: Trace, uses_spare: np.ndarray, repair_h: np.ndarray, spares: int,
                 swap_h: np.ndarray, wait_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each failure, whether a spare host was free for it, and what it cost (hours):
    ``swap_h`` where one was, ``wait_h`` (no spare) where not. The pool holds ``spares``;
    each swap takes one, and the swapped-out host comes back its repair time later, on the
    wall clock (the training done plus every hour lost before)."""
    free = np.zeros(len(trace), dtype=bool)
    lost = np.array(wait_h, dtype=float)
    if spares <= 0:
        return free, lost
    back: list[float] = []  # when the hosts out for repair come back, wall clock
    pool, behind = spares, 0.0
    for i in range(len(trace)):
        wall = float(trace.hours[i]) + behind
        if uses_spare[i]:
            while back and back[0] <= wall:
                heapq.heappop(back)
                pool += 1
            if pool > 0:
                pool -= 1
                free[i] = True
                lost[i] = swap_h[i]
                heapq.heappush(back, wall + float(repair_h[i]))
        behind += lost[i]
    return free, lost


@dataclass(frozen=True)
class TraceCost:
    """One trace costed: hours of the whole job lost per failure per strategy, and for the
    two that swap, which failures found a spare."""

    trace: Trace
    lost_h: dict[str, np.ndarray]
    free: dict[str, np.ndarray]


def cost_trace(trace: Trace, profile: Profile, inputs: ModelInputs, recoveries: Recoveries,
               rng: np.random.Generator, *, spares: int | None = None) -> TraceCost:
    """Each failure's cost under each strategy, hours of the whole job."""
    paths = np.array([c.path for c in profile.classes])[trace.classes]
    planned = np.array([c.planned for c in profile.classes], dtype=bool)[trace.classes]
    repair = inputs.repair_of(profile)[trace.classes]
    interval_h = inputs.checkpoint_min / 60
    # Checkpoints come every interval of training: the work lost is the training since.
    redo_h = np.where(planned, 0.0, np.mod(trace.hours, interval_h))
    restart_h = inputs.restart_total_s() / 3600
    detect_h = np.zeros(len(trace))
    swap_h = np.zeros(len(trace))
    for path in ("gpu", "host"):
        mine = paths == path
        if mine.any():
            d, s = recoveries.draw(path, int(mine.sum()), rng, inputs.ocs_ms)
            detect_h[mine], swap_h[mine] = d / 3600, s / 3600
    uses_spare = paths != "none"
    pool = inputs.spare_hosts if spares is None else spares
    base = restart_h + redo_h
    no_spare = detect_h + repair + base
    lost, free = {"no-spare": no_spare}, {}
    for strategy, moving_h in (("optical", swap_h + inputs.link_up_s / 3600),
                               ("standby", np.full(len(trace), inputs.standby_s / 3600))):
        free[strategy], lost[strategy] = swap_or_wait(trace, uses_spare, repair, pool,
                                                      detect_h + moving_h + base, no_spare)
    return TraceCost(trace, {s: lost[s] for s in STRATEGIES}, free)


@dataclass(frozen=True)
class Estimate:
    """A figure over the traces: its mean and 95 % interval."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray) -> Estimate:
        low, high = np.percentile(values, [2.5, 97.5])
        return cls(float(np.mean(values)), float(low), float(high))

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Outcome:
    """The model's answer over many traces."""

    ettr: dict[str, Estimate]
    gpu_hours_lost: dict[str, Estimate]
    by_class: dict[str, dict[str, Estimate]]
    """class id → strategy → GPU-hours lost."""
    kept_over: dict[str, Estimate]
    """GPU-hours the optical swap keeps over each other strategy (paired, same traces)."""
    failures: Estimate
    traces: int
    no_spare_share: Estimate | None
    """The share of swappable failures that found no spare free, over the draws that had
    one (None: no draw had a failure with a recovery path)."""
    no_spare_traces: int = 0
    """The draws ``no_spare_share`` is over: those with a failure with a recovery path."""


def simulate(profile: Profile, inputs: ModelInputs, recoveries: Recoveries, *,
             traces: int = 200, seed: int = 0, spares: int | None = None,
             fixed: Trace | None = None) -> Outcome:
    """The model over ``traces`` draws of the failure process (or one ``fixed`` trace),
    every strategy costed on the same draws."""
    inputs.check()
    rng = np.random.default_rng(seed)
    lost = {s: np.zeros(traces) for s in STRATEGIES}
    per_class = {c.id: {s: np.zeros(traces) for s in STRATEGIES} for c in profile.classes}
    counts = np.zeros(traces)
    # A draw without a failure on a recovery path has no share of them: NaN, left out.
    unswapped = np.full(traces, np.nan)
    pool = inputs.spare_hosts if spares is None else spares
    for t in range(traces):
        trace = fixed if fixed is not None else sample_trace(
            profile, inputs.gpus, inputs.hours, rng, inputs.rate_scale)
        cost = cost_trace(trace, profile, inputs, recoveries, rng, spares=pool)
        counts[t] = len(trace)
        swappable = np.array([c.path != "none" for c in profile.classes])[trace.classes]
        if swappable.any():
            unswapped[t] = 1 - cost.free["optical"][swappable].mean()
        for s in STRATEGIES:
            lost[s][t] = cost.lost_h[s].sum()
            sums = np.bincount(trace.classes, weights=cost.lost_h[s],
                               minlength=len(profile.classes))
            for i, c in enumerate(profile.classes):
                per_class[c.id][s][t] = sums[i] * inputs.gpus
    return Outcome(
        ettr={s: Estimate.of(inputs.hours / (inputs.hours + lost[s])) for s in STRATEGIES},
        gpu_hours_lost={s: Estimate.of(lost[s] * inputs.gpus) for s in STRATEGIES},
        by_class={c: {s: Estimate.of(v) for s, v in by.items()} for c, by in per_class.items()},
        kept_over={s: Estimate.of((lost[s] - lost["optical"]) * inputs.gpus)
                   for s in STRATEGIES if s != "optical"},
        failures=Estimate.of(counts), traces=traces,
        no_spare_share=Estimate.of(had) if len(had := unswapped[~np.isnan(unswapped)])
        else None, no_spare_traces=len(had))


def replay_trace(profile: Profile, inputs: ModelInputs, seed: int) -> Trace:
    """The trace the rig replays: a CSV profile's own events where the modelled job is the
    source's, else one draw of the failure process."""
    if profile.events is not None and inputs.gpus == profile.gpus and \
            inputs.hours == profile.hours and inputs.rate_scale == 1.0:
        return events_trace(profile)
    return sample_trace(profile, inputs.gpus, inputs.hours, np.random.default_rng(seed),
                        inputs.rate_scale)


#: The sweeps: what each varies, its values, and the unit on the axis.
SWEEPS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ocs": ("OCS switching time, ms", (10, 30, 100, 300, 1000, 3000, 10000)),
    "link-up": ("NIC link-up after the switch, s", (0, 0.5, 1, 2, MIXNET_LINK_UP_S, 10)),
    "spares": ("spare hosts in the pool", (0, 1, 2, 4, 8, 16, 32)),
    "rate": ("failure rate, x the modelled job's", (0.25, 0.5, 1, 2, 4)),
}


def check_job(profile: Profile, inputs: ModelInputs) -> None:
    """The modelled job's failures per trace within what the model can cost
    (failures.MAX_EXPECTED_FAILURES), at the rate sweep's top value too."""
    top = max(SWEEPS["rate"][1])
    check_expected(profile, inputs.gpus, inputs.hours, inputs.rate_scale * top,
                   why=f" at the rate sweep's {top:g}x of its rates")


def sweep(name: str, profile: Profile, inputs: ModelInputs, recoveries: Recoveries, *,
          traces: int = 100, seed: int = 0) -> list[tuple[float, Outcome]]:
    """The model at each value of one sweep (SWEEPS), the same draws at every value."""
    if name not in SWEEPS:
        raise ProfileError(f"sweep {name!r}: expected one of {', '.join(SWEEPS)}")
    out = []
    for value in SWEEPS[name][1]:
        if name == "ocs":
            varied = replace(inputs, ocs_ms=value)
        elif name == "link-up":
            varied = replace(inputs, link_up_s=value)
        elif name == "spares":
            varied = replace(inputs, spares=int(value))
        else:
            varied = replace(inputs, rate_scale=inputs.rate_scale * value)
        out.append((value, simulate(profile, varied, recoveries, traces=traces, seed=seed)))
    return out
