"""Switching-time models: how long the mirrors (or heaters) take to settle."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: Defaults per technology, in milliseconds (see docs/protocols.md §5.3 and §2.3).
TECHNOLOGY_DEFAULTS: dict[str, dict[str, float]] = {
    "beam-steering": {"switch_time_ms": 25.0, "jitter_ms": 3.0, "per_pair_ms": 0.0},
    "mems-3d": {"switch_time_ms": 40.0, "jitter_ms": 5.0, "per_pair_ms": 0.5},
    "thermo-optic": {"switch_time_ms": 0.05, "jitter_ms": 0.01, "per_pair_ms": 0.0},
    "ideal": {"switch_time_ms": 0.0, "jitter_ms": 0.0, "per_pair_ms": 0.0},
}


@dataclass(frozen=True)
class Profile:
    """A switch's time as a publication measured it: the mean per batch size (pairs, ms),
    and a tail, exponential with mean ``tail_ms``, that puts the p99 where it was measured
    (for a shifted exponential, p99 - mean = ln(100) - 1 = 3.605 tail means)."""

    technology: str
    pairs_ms: tuple[tuple[int, float], ...]
    tail_ms: float
    source: str


#: Published timings (docs/emulators.md, "Timing profiles").
PROFILES: dict[str, Profile] = {
    # MixNet (SIGCOMM 2025), a Polatis driven over TL1, command to done: 1 pair 41.44 ms
    # mean with its p99 near 60 ms; 4 pairs 42.44; 16 pairs 46.75; 99 % under 70 ms.
    "mixnet-polatis-tl1": Profile("beam-steering", ((1, 41.44), (4, 42.44), (16, 46.75)),
                                  tail_ms=(60.0 - 41.44) / 3.605,
                                  source="MixNet, SIGCOMM 2025: Polatis over TL1"),
}


#: NIC link-up after a circuit change, as published: (mean s, p99 s, source).
LINK_UP_PROFILES: dict[str, tuple[float, float, str]] = {
    "mixnet": (5.67, 6.33, "MixNet, SIGCOMM 2025: OCS done to NIC active"),
}


def link_up_draw(name: str, rng: random.Random) -> Callable[[], float]:
    """Seconds from light to link, drawn as the profile measured them (a shifted
    exponential with its mean and p99)."""
    if name not in LINK_UP_PROFILES:
        raise ValueError(f"unknown link-up profile {name!r}; known: "
                         f"{', '.join(LINK_UP_PROFILES)}")
    mean, p99, _ = LINK_UP_PROFILES[name]
    tail = (p99 - mean) / 3.605
    return lambda: mean - tail + rng.expovariate(1 / tail)


@dataclass
class TimingModel:
    """Settling time of one batch = switch_time + per_pair * (pairs - 1) + jitter.

    Mirrors in one batch move in parallel, so a batch costs about one switching time; the
    jitter is drawn uniformly from [-jitter, +jitter] and the total never goes below zero.
    A model from a :class:`Profile` takes its mean per batch size from the measured points
    instead (straight lines between them, the last one carried on) and draws the rest from
    its tail.
    """

    switch_time_ms: float = 25.0
    jitter_ms: float = 3.0
    per_pair_ms: float = 0.0
    technology: str = "beam-steering"
    seed: int | None = None
    profile: str | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def for_technology(cls, technology: str, **overrides: Any) -> TimingModel:
        if technology not in TECHNOLOGY_DEFAULTS:
            raise ValueError(f"unknown technology {technology!r}; "
                             f"known: {', '.join(TECHNOLOGY_DEFAULTS)}")
        values = {**TECHNOLOGY_DEFAULTS[technology], **overrides}
        return cls(technology=technology, **values)

    @classmethod
    def for_profile(cls, name: str, **overrides: Any) -> TimingModel:
        """The model of a published profile; ``overrides`` (switch_time_ms, …) leave the
        profile for a plain model, as a PUT of the timing does."""
        if name not in PROFILES:
            raise ValueError(f"unknown timing profile {name!r}; known: {', '.join(PROFILES)}")
        profile = PROFILES[name]
        (first, first_ms), (last, last_ms) = profile.pairs_ms[0], profile.pairs_ms[-1]
        model = cls(technology=profile.technology, switch_time_ms=first_ms, jitter_ms=0.0,
                    per_pair_ms=(last_ms - first_ms) / max(last - first, 1),
                    seed=overrides.pop("seed", None), profile=name)
        model.update(**overrides)
        return model

    def mean_ms(self, pairs: int) -> float:
        if self.profile is None:
            return self.switch_time_ms + self.per_pair_ms * (pairs - 1)
        points = PROFILES[self.profile].pairs_ms
        for (n0, ms0), (n1, ms1) in itertools.pairwise(points):
            if pairs <= n1 or (n1, ms1) == points[-1]:
                return ms0 + (ms1 - ms0) * (pairs - n0) / (n1 - n0)
        return points[0][1]

    def sample_ns(self, pairs: int) -> int:
        if pairs <= 0:
            return 0
        ms = self.mean_ms(pairs)
        if self.profile is not None:
            tail = PROFILES[self.profile].tail_ms
            ms += self._rng.expovariate(1 / tail) - tail
        if self.jitter_ms:
            ms += self._rng.uniform(-self.jitter_ms, self.jitter_ms)
        return max(0, int(ms * 1e6))

    def update(self, **values: Any) -> None:
        for key in ("switch_time_ms", "jitter_ms", "per_pair_ms"):
            if key in values and values[key] is not None:
                if float(values[key]) < 0:
                    raise ValueError(f"{key} must be ≥ 0, got {values[key]}")
                setattr(self, key, float(values[key]))
                if key != "jitter_ms":
                    self.profile = None  # a time set by hand is no longer the profile's
        if values.get("seed") is not None:
            self.seed = int(values["seed"])
            self._rng = random.Random(self.seed)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_rng")
        return data


# -- transients: how light fades from the old path and arrives on the new one --------------
# ``frac`` runs from 0 (the command starts moving the mirrors / heating) to 1 (settled).
# Transmissions are fractions of the settled coupling, as numpy arrays.

def _mems_fall(frac: np.ndarray) -> np.ndarray:
    # The beam walks off the old output fibre within the first tenth of the move.
    return np.clip(1.0 - frac / 0.1, 0.0, 1.0)


def _mems_rise(frac: np.ndarray) -> np.ndarray:
    # Nothing until the mirror nears its target, a smooth ramp onto the fibre, then a
    # damped ringing of a few percent until it has settled.
    out = np.zeros_like(frac)
    ramp = (frac >= 0.75) & (frac < 0.9)
    out[ramp] = 0.5 - 0.5 * np.cos(np.pi * (frac[ramp] - 0.75) / 0.15)
    ring = (frac >= 0.9) & (frac < 1.0)
    phase = (frac[ring] - 0.9)
    out[ring] = 1.0 + 0.03 * np.sin(2 * np.pi * phase / 0.05) * np.exp(-phase / 0.03)
    out[frac >= 1.0] = 1.0
    return out


_TAU = 5.0
_NORM = 1.0 - np.exp(-_TAU)


def _thermal_rise(frac: np.ndarray) -> np.ndarray:
    # First-order heater response, scaled to be complete at "settled".
    out: np.ndarray = np.clip((1.0 - np.exp(-_TAU * frac)) / _NORM, 0.0, 1.0)
    return out


def _thermal_fall(frac: np.ndarray) -> np.ndarray:
    return 1.0 - _thermal_rise(frac)


def _ideal_rise(frac: np.ndarray) -> np.ndarray:
    return np.ones_like(frac)


def _ideal_fall(frac: np.ndarray) -> np.ndarray:
    return np.zeros_like(frac)


#: technology → (fall, rise) transmission profiles
TRANSIENTS: dict[str, tuple[Callable[[np.ndarray], np.ndarray],
                            Callable[[np.ndarray], np.ndarray]]] = {
    "beam-steering": (_mems_fall, _mems_rise),
    "mems-3d": (_mems_fall, _mems_rise),
    "thermo-optic": (_thermal_fall, _thermal_rise),
    "ideal": (_ideal_fall, _ideal_rise),
}
