"""How sure a figure is: how many values a percentile needs, and bootstrap confidence
intervals on the difference between two runs' percentiles, with a verdict in words.

A percentile q needs at least ``100 / (100 - q)`` values before one of them lies above it
(2 for a p50, 10 for a p90, 100 for a p99); from fewer it is only the largest value or
between the two largest, and is called what it is instead of being reported as a p99.

The intervals are percentile bootstraps: each run's values are resampled with replacement
(``RESAMPLES`` times, from a fixed seed so that the same runs always read the same), the
percentile taken of each resample, and the 2.5th and 97.5th percentiles of B's minus A's
are the 95 % interval of the difference. A bootstrap sees only the spread within each run,
not how a machine's load differs from one run to the next, so a difference is also held
against the run-to-run variation (:func:`run_to_run`): how far the figure moves between
repeats of one set-up where there are repeats, else between the halves of each run. A
difference smaller than that, or than a floor (``noise_ms``), is "within noise" even
where the interval excludes zero.

A share (how often a schedule's reconfiguration was hidden) is compared the same way: each
run's true-or-false values resampled, the interval on the difference of the shares, and a
floor of ``NOISE_SHARE``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Resamples per interval: enough that the 2.5th and 97.5th percentiles of the resampled
#: differences move by well under the figures' printed precision from seed to seed.
RESAMPLES = 2000
#: The resampling seed: the same two runs give the same interval every time they are compared.
SEED = 20
#: A difference smaller than this (ms) is no difference, whatever its interval says.
NOISE_MS = 0.5
#: Resamples drawn at once (keeps memory bounded for runs of many thousand rows).
_CHUNK = 250
#: Between the ends of a range, and in a cell with nothing to show.
DASH = "\N{EN DASH}"


def needed(q: float) -> int:
    """The fewest values from which the q-th percentile is more than the top value or two:
    one value in ``100 - q`` hundredths must lie above it."""
    return math.ceil(100 / (100 - q) - 1e-9) if q < 100 else 1


def enough(n: int, q: float) -> bool:
    return n >= needed(q)


def bootstrap_difference(a: Sequence[float], b: Sequence[float], q: float, *,
                         resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """The 95 % interval of (B's q-th percentile - A's), by resampling each run."""
    rng = np.random.default_rng(seed)
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    differences = []
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        pick_a = rng.integers(0, len(first), size=(size, len(first)))
        pick_b = rng.integers(0, len(second), size=(size, len(second)))
        differences.append(np.percentile(second[pick_b], q, axis=1)
                           - np.percentile(first[pick_a], q, axis=1))
    spread = np.concatenate(differences)
    low, high = np.percentile(spread, [2.5, 97.5])
    return float(low), float(high)


def run_to_run(runs: Sequence[Sequence[float]], q: float) -> float | None:
    """How far the q-th percentile moves between runs of one set-up: the larger of the
    range of the runs' own percentiles (where there are several) and the difference
    between the two halves (in the order measured) of any one run, since load that comes
    and goes moves a figure within a run as well as between runs; None where no part is
    long enough for the percentile."""
    runs = [list(values) for values in runs if len(values)]
    found = [within_run(run, q) for run in runs]
    if len(runs) > 1:
        found.append(_range(runs, q))
    return max((f for f in found if f is not None), default=None)


def within_run(values: Sequence[float], q: float) -> float | None:
    """How far the q-th percentile moves between the two halves of one run, in the order
    measured (None where a half is too short for it). The values must be of one set-up: a
    sweep's batch sizes, measured one after another, are each a set-up of their own."""
    half = len(values) // 2
    return _range([values[:half], values[half:]], q)


def between_runs(runs: Sequence[Sequence[float]], q: float) -> float | None:
    """The range of the q-th percentile over repeats of one set-up (None for one run)."""
    runs = [values for values in runs if len(values)]
    return _range(runs, q) if len(runs) > 1 else None


def _range(parts: Sequence[Sequence[float]], q: float) -> float | None:
    from labd.vocabulary import percentile

    if not all(enough(len(part), q) for part in parts):
        return None
    figures = [percentile(part, q) for part in parts]
    return max(figures) - min(figures)


@dataclass(frozen=True)
class Comparison:
    """One figure's percentile in two runs, and what can be said of the difference."""

    q: float
    n_a: int
    n_b: int
    a: float | None
    """A's percentile; None where A has too few values for it (or none)."""
    b: float | None
    verdict: str
    direction: int = 0
    """+1 where B is slower beyond noise, -1 where faster, 0 otherwise."""
    delta: float | None = None
    low: float | None = None
    high: float | None = None
    noise: float | None = None
    """The largest difference called noise: the floor, or the run-to-run variation."""

    @property
    def word(self) -> str:
        """The verdict in a word, for a table's narrow column: ``slower``, ``faster``,
        ``noise``, ``too few`` or ``only in …``."""
        if self.delta is None:
            return "too few" if "too few" in self.verdict else self.verdict
        return ("faster", "noise", "slower")[self.direction + 1]

    @property
    def interval(self) -> str:
        """The 95 % interval of the difference, compactly, as ``+4.90..+5.10``."""
        if self.low is None or self.high is None:
            return DASH
        return f"{self.low:+.2f}..{self.high:+.2f}"


def compare_values(a: Sequence[float], b: Sequence[float], q: float, *, names: tuple[str, str]
                   = ("A", "B"), noise_ms: float = NOISE_MS, spread: float | None = None,
                   resamples: int = RESAMPLES, seed: int = SEED) -> Comparison:
    """A's and B's q-th percentile and the verdict on the difference, in words: ``B is
    slower by …`` or ``B is faster by …`` with the interval, ``within noise``, or why
    nothing can be said (too few values, or the figure in one run only). ``spread`` is the
    run-to-run variation (:func:`run_to_run`): a difference under it is noise too."""
    from labd.vocabulary import percentile

    n_a, n_b = len(a), len(b)
    name = f"p{q:g}"
    if not n_a or not n_b:
        return Comparison(q, n_a, n_b, percentile(a, q) if enough(n_a, q) else None,
                          percentile(b, q) if enough(n_b, q) else None,
                          f"only in {names[0] if n_a else names[1]}")
    short = [f"n = {n}" for n in dict.fromkeys((n_a, n_b)) if not enough(n, q)]
    if short:
        return Comparison(q, n_a, n_b, percentile(a, q) if enough(n_a, q) else None,
                          percentile(b, q) if enough(n_b, q) else None,
                          f"{' and '.join(short)}: too few for a {name} (needs {needed(q)})")
    pa, pb = percentile(a, q), percentile(b, q)
    delta = pb - pa
    low, high = bootstrap_difference(a, b, q, resamples=resamples, seed=seed)
    noise = max(noise_ms, spread or 0.0)
    if low <= 0 <= high or abs(delta) <= noise:
        return Comparison(q, n_a, n_b, pa, pb, f"within noise (Δ {delta:+.3f}, 95 % CI "
                          f"{low:+.3f} to {high:+.3f}; noise {noise:.3f})", 0, delta, low,
                          high, noise)
    if delta > 0:
        return Comparison(q, n_a, n_b, pa, pb, f"{names[1]} is slower by {delta:.3f} ms "
                          f"(95 % CI {low:.3f}{DASH}{high:.3f})", 1, delta, low, high, noise)
    return Comparison(q, n_a, n_b, pa, pb, f"{names[1]} is faster by {-delta:.3f} ms "
                      f"(95 % CI {-high:.3f}{DASH}{-low:.3f})", -1, delta, low, high, noise)


#: A share differing by less than this (5 points in 100) is no difference, whatever its
#: interval says (the bootstrap sees only the spread within each run, as for NOISE_MS).
NOISE_SHARE = 0.05


def bootstrap_share_difference(a: Sequence[bool], b: Sequence[bool], *,
                               resamples: int = RESAMPLES, seed: int = SEED
                               ) -> tuple[float, float]:
    """The 95 % interval of (B's share of true values - A's), by resampling each run."""
    rng = np.random.default_rng(seed)
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    differences = []
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        pick_a = rng.integers(0, len(first), size=(size, len(first)))
        pick_b = rng.integers(0, len(second), size=(size, len(second)))
        differences.append(second[pick_b].mean(axis=1) - first[pick_a].mean(axis=1))
    low, high = np.percentile(np.concatenate(differences), [2.5, 97.5])
    return float(low), float(high)


@dataclass(frozen=True)
class ShareComparison:
    """How often something held in two runs (a share of 0 to 1), and the verdict."""

    n_a: int
    n_b: int
    a: float | None
    b: float | None
    verdict: str
    direction: int = 0
    """+1 where B's share is higher beyond noise, -1 where lower, 0 otherwise."""
    delta: float | None = None
    low: float | None = None
    high: float | None = None


def compare_shares(a: Sequence[bool], b: Sequence[bool], *, what: str = "true",
                   names: tuple[str, str] = ("A", "B"), noise: float = NOISE_SHARE,
                   resamples: int = RESAMPLES, seed: int = SEED) -> ShareComparison:
    """A's and B's share of true values and the verdict in words, in points of 100:
    ``B is hidden less often by …`` (``what`` names the value: ``hidden``), ``no
    difference beyond noise``, or the share in one run only."""
    n_a, n_b = len(a), len(b)
    share_a = sum(map(bool, a)) / n_a if n_a else None
    share_b = sum(map(bool, b)) / n_b if n_b else None
    if share_a is None or share_b is None:
        return ShareComparison(n_a, n_b, share_a, share_b,
                               f"only in {names[0] if n_a else names[1]}" if n_a or n_b
                               else "in neither run")
    delta = share_b - share_a
    low, high = bootstrap_share_difference(a, b, resamples=resamples, seed=seed)
    points = f"{abs(delta) * 100:.1f} points (95 % CI {min(abs(low), abs(high)) * 100:.1f}" \
             f"{DASH}{max(abs(low), abs(high)) * 100:.1f})"
    if low <= 0 <= high or abs(delta) < noise:
        return ShareComparison(n_a, n_b, share_a, share_b,
                               f"within noise (Δ {delta * 100:+.1f} points, "
                               f"95 % CI {low * 100:+.1f} to {high * 100:+.1f})",
                               0, delta, low, high)
    more = "more" if delta > 0 else "less"
    return ShareComparison(n_a, n_b, share_a, share_b,
                           f"{names[1]} is {what} {more} often by {points}",
                           1 if delta > 0 else -1, delta, low, high)
