"""Failure profiles: how often each kind of failure stopped a training job, as a public
source counted them, turned into rates per GPU-hour and sampled as failure traces.

A profile is its source's counts per failure class over the source's duration and GPU
count; a class's rate is its count over (GPUs times hours), so a trace for a job of another
size or length scales with it. Each class has a *recovery path* on an emulated lab:
``gpu`` (a GPU reports a failure: the daemon swaps a spare in), ``host`` (the host stops
answering) or ``none`` (the rig has no recovery for it: software, a cable, a switch,
planned work). The classes without a path are the model's "other": every strategy pays
the same for them.

Two profiles are built in (``llama3-405b``, ``tpuv4``; their sources in
docs/measure.md#availability); a user's is a TOML file of counts or rates, or a CSV of
timestamped events.
"""

from __future__ import annotations

import csv
import math
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from labd.errors import ProfileError

#: How a class is recovered on the rig: a GPU's failure report, a host gone silent, or no
#: recovery path there (the model charges it the same under every strategy).
PATHS = ("gpu", "host", "none")
#: GPU failure signals the emulated hosts can raise (labd.agent.backends.SIGNALS), each one
#: the agent calls failed.
GPU_SIGNALS = ("xid79", "xid48", "xid46", "ecc", "remap-failed", "lost")
#: The most failures one trace may be expected to hold: the model costs each failure of
#: each draw in turn (and the rate sweep draws at 4x), so a profile or a job far past this
#: would take hours or exhaust memory instead of answering. Llama 3's 54 days hold 466.
MAX_EXPECTED_FAILURES = 100_000


@dataclass(frozen=True)
class FailureClass:
    """One kind of failure in a profile."""

    id: str
    label: str
    count: float
    """Interruptions of this class in the source, over its GPUs and hours."""
    path: str = "none"
    signal: str = "xid79"
    """The GPU failure the rig raises for it (path ``gpu``)."""
    planned: bool = False
    """Planned work: the job checkpoints first, so no training since the last one is lost."""
    quoted: str | None = None
    """The class's share as the source gives it (``30.1 %``), for the report."""


@dataclass(frozen=True)
class Profile:
    """A failure profile: counts per class over ``hours`` on ``gpus`` GPUs."""

    name: str
    source: str
    gpus: int
    hours: float
    classes: tuple[FailureClass, ...]
    note: str = ""
    events: tuple[tuple[float, str], ...] | None = field(default=None, compare=False)
    per_host: int = 8
    """GPUs (or chips) per host in the source: a host's failure takes them all out."""
    """A CSV profile's events (hours from the start, class id), in order."""

    def rate(self, cls: FailureClass) -> float:
        """The class's failures per GPU-hour."""
        return cls.count / (self.gpus * self.hours)

    def expected(self, gpus: int, hours: float, scale: float = 1.0) -> dict[str, float]:
        """Each class's expected failures on ``gpus`` GPUs over ``hours``."""
        return {c.id: self.rate(c) * gpus * hours * scale for c in self.classes}

    def total(self) -> float:
        return sum(c.count for c in self.classes)

    def driven(self) -> list[FailureClass]:
        """The classes the rig has a recovery path for."""
        return [c for c in self.classes if c.path != "none"]

    def other(self) -> list[FailureClass]:
        """The classes without a recovery path on the rig: the model's "other"."""
        return [c for c in self.classes if c.path == "none"]

    def index(self, class_id: str) -> int:
        for i, c in enumerate(self.classes):
            if c.id == class_id:
                return i
        raise ProfileError(f"profile {self.name}: no class {class_id!r} (classes: "
                           f"{', '.join(c.id for c in self.classes)})")


#: Meta, "The Llama 3 Herd of Models" (2024), §3.3.4: 466 job interruptions over 54 days
#: of pre-training on 16,384 H100 GPUs, 47 planned and 419 unexpected; the unexpected ones
#: by root cause (percentages as the paper gives them). What the paper lists beyond these
#: classes is counted as the remainder to 419.
LLAMA3_405B = Profile(
    name="llama3-405b",
    source="Meta, \"The Llama 3 Herd of Models\", 2024 (Llama 3 405B pre-training: 16,384 "
           "H100 GPUs, 54 days, 466 interruptions, 419 unexpected)",
    gpus=16_384, hours=54 * 24,
    classes=(
        FailureClass("gpu-faulty", "faulty GPU", 148, "gpu", "xid79", quoted="30.1 %"),
        FailureClass("gpu-hbm3", "GPU HBM3 memory", 72, "gpu", "remap-failed",
                     quoted="17.2 %"),
        FailureClass("gpu-sram", "GPU SRAM memory", 19, "gpu", "xid48", quoted="4.5 %"),
        FailureClass("gpu-gsp", "GPU system processor", 17, "gpu", "xid46", quoted="4.1 %"),
        FailureClass("cpu", "CPU", 2, "host"),
        FailureClass("network", "network switch or cable", 35, "none", quoted="8.4 %"),
        FailureClass("unexpected-other", "other unexpected (software, host, power, ...)",
                     419 - 148 - 72 - 19 - 17 - 2 - 35, "none"),
        FailureClass("planned", "planned (maintenance, configuration)", 47, "none",
                     planned=True),
    ),
    note="GPU-related 58.7 % of the unexpected interruptions; effective training time above "
         "90 % (the paper)")

#: Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer ...", ISCA 2023: daily
#: failure rates of 0.08 % of machines, 0.005 % of ICI cables and 0.04 % of OCSes. A pod:
#: 4,096 chips on 1,024 machines of 4, 64 cubes of 4x4x4 each with 96 optical links
#: (6,144 cables), 48 OCSes. Counted here over 30 days of a pod (the daily rates times 30):
#: one day of a pod sees less than one failure.
_TPU_CHIPS, _TPU_MACHINES, _TPU_CABLES, _TPU_OCS = 4096, 1024, 6144, 48
_TPU_DAYS = 30
TPUV4 = Profile(
    name="tpuv4",
    source="Jouppi et al., \"TPU v4: An Optically Reconfigurable Supercomputer for Machine "
           "Learning\", ISCA 2023 (daily failure rates; 30 days of a 4,096-chip pod)",
    gpus=_TPU_CHIPS, hours=_TPU_DAYS * 24,
    classes=(
        FailureClass("machine", "machine (host with 4 chips)",
                     _TPU_MACHINES * 0.0008 * _TPU_DAYS, "host",
                     quoted="0.08 % of machines a day"),
        FailureClass("ici-cable", "ICI optical cable", _TPU_CABLES * 0.00005 * _TPU_DAYS,
                     "none", quoted="0.005 % of ICI cables a day"),
        FailureClass("ocs", "optical circuit switch", _TPU_OCS * 0.0004 * _TPU_DAYS, "none",
                     quoted="0.04 % of OCSes a day"),
    ),
    note="chips stand for GPUs; the pod's machine, cable and OCS counts are the paper's "
         "4,096 chips, 1,024 machines, 6,144 cables and 48 OCSes", per_host=4)

BUILT_IN = {p.name: p for p in (LLAMA3_405B, TPUV4)}


def load_profile(spec: str) -> Profile:
    """A built-in profile by name, or a user's TOML (counts or rates) or CSV (events)."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    path = Path(spec)
    try:
        found = path.is_file()
    except OSError as exc:
        raise ProfileError(f"profile {spec!r}: cannot look at it ({exc.strerror})") from None
    if not found:
        raise ProfileError(f"profile {spec!r}: neither a built-in profile "
                           f"({', '.join(BUILT_IN)}) nor a file")
    if path.suffix.lower() == ".csv":
        return _from_csv(path)
    try:
        data = tomllib.loads(_read(path))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not TOML: {exc}") from None
    return profile_from_toml(data, str(path))


def _read(path: Path, errors: str = "strict") -> str:
    try:
        return path.read_text(errors=errors)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _number(data: dict[str, Any], key: str, where: str, *, required: bool = True,
            positive: bool = True) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ProfileError(f"{where}: '{key}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        number = math.nan
    else:
        try:
            number = float(value)
        except OverflowError:
            # An integer past a float's range (TOML's integers have no bound here).
            number = math.inf
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        shown = f"{str(value)[:12]}... ({len(str(value))} digits)" if isinstance(
            value, int) and len(str(value)) > 20 else repr(value)
        raise ProfileError(f"{where}: '{key}' = {shown}: expected a finite "
                           f"{'positive' if positive else 'non-negative'} number")
    return number


def _whole(value: float, key: str, where: str) -> int:
    """A count of GPUs: a whole number, at least 1."""
    if value != int(value) or value < 1:
        raise ProfileError(f"{where}: '{key}' = {value:g}: expected a whole number, at "
                           "least 1")
    return int(value)


def _check_counts(classes: list[FailureClass] | tuple[FailureClass, ...],
                  where: str) -> None:
    """A profile's own counts are one trace's expectation over its GPUs and hours: past
    MAX_EXPECTED_FAILURES the model cannot cost them."""
    for c in classes:
        if c.count > MAX_EXPECTED_FAILURES:
            raise ProfileError(f"{where}: class {c.id!r}: {c.count:g} failures over the "
                               f"profile's GPUs and hours: more than the "
                               f"{MAX_EXPECTED_FAILURES:,} a trace may hold")
    total = sum(c.count for c in classes)
    if total > MAX_EXPECTED_FAILURES:
        raise ProfileError(f"{where}: {total:g} failures over the profile's GPUs and hours: "
                           f"more than the {MAX_EXPECTED_FAILURES:,} a trace may hold")


def _path_and_signal(entry: dict[str, Any], where: str) -> tuple[str, str]:
    path = entry.get("path", "none")
    if path not in PATHS:
        raise ProfileError(f"{where}: 'path' = {path!r}: expected one of {', '.join(PATHS)}")
    signal = entry.get("signal", "xid79")
    if signal not in GPU_SIGNALS:
        raise ProfileError(f"{where}: 'signal' = {signal!r}: expected one of "
                           f"{', '.join(GPU_SIGNALS)}")
    return path, signal


_CLASS_KEYS = {"id", "label", "count", "rate_per_gpu_hour", "path", "signal", "planned",
               "quoted"}
_TOP_KEYS = {"name", "source", "gpus", "hours", "class", "note", "gpus_per_host"}


def profile_from_toml(data: dict[str, Any], where: str = "profile") -> Profile:
    """A profile from a TOML document: ``name``, ``source``, ``gpus``, ``hours`` and
    ``[[class]]`` tables, each with ``id``, ``path`` (gpu, host, none), and ``count`` (over
    the profile's GPUs and hours) or ``rate_per_gpu_hour``."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)} (expected "
                           f"{', '.join(sorted(_TOP_KEYS))})")
    gpus = _number(data, "gpus", where)
    hours = _number(data, "hours", where)
    assert gpus is not None and hours is not None
    whole_gpus = _whole(gpus, "gpus", where)
    entries = data.get("class")
    if not isinstance(entries, list) or not entries:
        raise ProfileError(f"{where}: no [[class]] tables")
    classes, seen = [], set()
    for i, entry in enumerate(entries):
        here = f"{where}: class {i + 1}"
        if not isinstance(entry, dict):
            raise ProfileError(f"{here}: expected a table")
        extra = sorted(set(entry) - _CLASS_KEYS)
        if extra:
            raise ProfileError(f"{here}: unknown key(s) {', '.join(extra)}")
        class_id = entry.get("id")
        if not isinstance(class_id, str) or not class_id.strip():
            raise ProfileError(f"{here}: 'id' is missing")
        here = f"{where}: class {class_id!r}"
        if class_id in seen:
            raise ProfileError(f"{here}: given twice")
        seen.add(class_id)
        count = _number(entry, "count", here, required=False, positive=False)
        rate = _number(entry, "rate_per_gpu_hour", here, required=False, positive=False)
        if (count is None) == (rate is None):
            raise ProfileError(f"{here}: give 'count' or 'rate_per_gpu_hour' (one of them)")
        path, signal = _path_and_signal(entry, here)
        classes.append(FailureClass(
            class_id, str(entry.get("label", class_id)),
            count if count is not None else (rate or 0.0) * gpus * hours, path, signal,
            bool(entry.get("planned", False)),
            str(entry["quoted"]) if "quoted" in entry else None))
    per_host = _number(data, "gpus_per_host", where, required=False) or 8
    _check_counts(classes, where)
    return Profile(str(data.get("name", Path(where).stem)), str(data.get("source", where)),
                   whole_gpus, hours, tuple(classes), str(data.get("note", "")),
                   per_host=_whole(per_host, "gpus_per_host", where))


def _from_csv(path: Path) -> Profile:
    """A profile from a CSV of events: ``# gpus: N`` and ``# hours: H`` comment lines
    first, then a header and one row per failure with ``at`` (hours from the start, or an
    ISO 8601 time), ``class``, and ``path`` (gpu, host, none), optionally ``signal``."""
    text = _read(path, errors="replace").splitlines()
    settings: dict[str, Any] = {}
    body = []
    for line in text:
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            try:
                settings[key.strip()] = float(value)
            except ValueError:
                raise ProfileError(f"{path}: comment line {line!r}: expected '# gpus: N' or "
                                   "'# hours: H'") from None
        elif line.strip():
            body.append(line)
    where = str(path)
    gpus = _number(settings, "gpus", f"{where} (a '# gpus: N' line)")
    hours = _number(settings, "hours", f"{where} (a '# hours: H' line)")
    assert gpus is not None and hours is not None
    whole_gpus = _whole(gpus, "gpus", f"{where} (a '# gpus: N' line)")
    reader = csv.DictReader(body)
    try:
        rows = list(reader)
    except csv.Error as exc:
        # A field past the csv module's limit (128 KiB), a NUL, a quote left open.
        raise ProfileError(f"{where}: row {reader.line_num}: not CSV ({exc})") from None
    if not rows or not {"at", "class", "path"} <= set(rows[0]):
        raise ProfileError(f"{where}: expected a header with at, class and path, and a row "
                           "per failure")
    start: datetime | None = None
    start_row = 0
    events: list[tuple[float, str]] = []
    kinds: dict[str, tuple[str, str]] = {}
    for n, row in enumerate(rows, start=2):
        here = f"{where}: row {n}"
        at = (row.get("at") or "").strip()
        try:
            hour = float(at)
        except ValueError:
            try:
                stamp = datetime.fromisoformat(at)
            except ValueError:
                raise ProfileError(f"{here}: at = {at!r}: expected hours from the start or "
                                   "an ISO 8601 time") from None
            if start is not None and (start.tzinfo is None) != (stamp.tzinfo is None):
                raise ProfileError(
                    f"{here}: at = {at!r}: {'no' if stamp.tzinfo is None else 'a'} UTC "
                    f"offset, where the first time (row {start_row}) has "
                    f"{'one' if stamp.tzinfo is None else 'none'}: give every row's offset "
                    "or none") from None
            if start is None:
                start, start_row = stamp, n
            hour = (stamp - start).total_seconds() / 3600
        if not math.isfinite(hour) or not 0 <= hour <= hours:
            raise ProfileError(f"{here}: at = {at!r}: outside the profile's 0 to {hours:g} "
                               "hours")
        class_id = (row.get("class") or "").strip()
        if not class_id:
            raise ProfileError(f"{here}: the class is empty")
        entry = {k: v.strip() for k, v in row.items() if k in ("path", "signal") and v}
        kind = _path_and_signal(entry, here)
        if kinds.setdefault(class_id, kind) != kind:
            raise ProfileError(f"{here}: class {class_id!r} was given path/signal "
                               f"{'/'.join(kinds[class_id])} before")
        events.append((hour, class_id))
    events.sort()
    counts: dict[str, int] = {}
    for _, class_id in events:
        counts[class_id] = counts.get(class_id, 0) + 1
    classes = tuple(FailureClass(c, c, n, *kinds[c]) for c, n in counts.items())
    _check_counts(classes, where)
    return Profile(path.stem, where, whole_gpus, hours, classes, events=tuple(events))


@dataclass(frozen=True)
class Trace:
    """Failures of one modelled job: when (hours from its start) and of which class (an
    index into the profile's classes), in order."""

    hours: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.hours)

    def counts(self, n_classes: int) -> np.ndarray:
        return np.bincount(self.classes, minlength=n_classes)


def check_expected(profile: Profile, gpus: int, hours: float, scale: float = 1.0, *,
                   why: str = "") -> float:
    """The failures one trace of the modelled job is expected to hold; past
    MAX_EXPECTED_FAILURES, a ProfileError saying so (``why`` says what scaled it)."""
    expected = sum(profile.expected(gpus, hours, scale).values())
    if not expected <= MAX_EXPECTED_FAILURES:  # also NaN and inf
        raise ProfileError(
            f"profile {profile.name} on {gpus:,} GPUs over {hours:g} h{why} expects "
            f"{expected:.3g} failures per trace: more than the {MAX_EXPECTED_FAILURES:,} the "
            "model can cost; model a smaller or shorter job (--gpus, --hours, --rate-scale)")
    return expected


def sample_trace(profile: Profile, gpus: int, hours: float, rng: np.random.Generator,
                 scale: float = 1.0) -> Trace:
    """One draw of the failure process: each class a Poisson process at its rate on
    ``gpus`` GPUs (``scale`` times it), over ``hours``."""
    check_expected(profile, gpus, hours, scale)
    means = np.array(list(profile.expected(gpus, hours, scale).values()))
    counts = rng.poisson(means)
    classes = np.repeat(np.arange(len(profile.classes)), counts)
    at = rng.uniform(0, hours, size=len(classes))
    order = np.argsort(at, kind="stable")
    return Trace(at[order], classes[order])


def events_trace(profile: Profile) -> Trace:
    """A CSV profile's own events as a trace."""
    assert profile.events is not None
    return Trace(np.array([h for h, _ in profile.events], dtype=float),
                 np.array([profile.index(c) for _, c in profile.events], dtype=int))


#: Standard deviations either side of the mean that the exact interval sums over: the
#: probability beyond is below 1e-30, far under any tail the interval is asked for.
_POISSON_WINDOW_SD = 12
#: Above this mean the count is normal to well under one count at the 95 % quantiles
#: (its skew is 1/sqrt(mean)), and summing the exact probabilities would take seconds.
_POISSON_NORMAL_ABOVE = 1e7


def poisson_interval(mean: float, level: float = 0.95) -> tuple[int, int]:
    """The central interval of a Poisson count with this mean: the smallest k_low and
    largest k_high with at most (1 - level) / 2 of the probability outside on each side.

    Exact (the probabilities summed) over the counts within 12 standard deviations of the
    mean, which hold all but 1e-30 of it; above a mean of 1e7, the normal approximation
    with the Cornish-Fisher skew term."""
    tail = (1 - level) / 2
    if not mean > 0:
        return 0, 0
    if not math.isfinite(mean):
        raise ProfileError(f"poisson_interval: mean {mean}: expected a finite number")
    sd = math.sqrt(mean)
    if mean > _POISSON_NORMAL_ABOVE:
        z = float(NormalDist().inv_cdf(1 - tail))

        def quantile(zz: float) -> int:
            return round(mean + zz * sd + (zz * zz - 1) / 6)

        return quantile(-z), quantile(z)
    first = max(0, math.floor(mean - _POISSON_WINDOW_SD * sd - 10))
    last = math.ceil(mean + _POISSON_WINDOW_SD * sd + 10)
    k = np.arange(first, last + 1, dtype=float)
    log_mean = math.log(mean)
    pmf = np.exp(k * log_mean - mean - np.array([math.lgamma(x + 1) for x in k]))
    cumulative = np.cumsum(pmf)
    low = first + int(np.argmax(cumulative > tail))
    at_least = np.flatnonzero(cumulative >= 1 - tail)
    high = first + int(at_least[0]) if len(at_least) else last
    return low, high


def scaled(profile: Profile, factor: float) -> Profile:
    """The profile with every class's count times ``factor``."""
    return replace(profile, classes=tuple(replace(c, count=c.count * factor)
                                          for c in profile.classes))
