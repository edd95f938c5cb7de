"""The availability replay (``labd measure availability``): a sample of a modelled job's
failures driven, time-compressed, through labd's real recovery path on an emulated lab,
each recovery measured stage by stage as the failover drills measure it.

The modelled job's failure trace (labd.measure.failures) has far more failures than a
lab of a few hosts would see: the replay drives a sample of those with a recovery path on
the rig (``gpu``: the host reports the class's GPU failure; ``host``: the host stops),
each on a member chosen at random, at its time in the trace divided by the compression,
and lets the member's repair take its class's repair time divided by the same. The rest
are modelled, not driven, and the report says how many of each.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console

from labd.emulation.campaign import check_drillable, drill_rig, restore
from labd.emulation.drill import run_drill
from labd.errors import ProfileError
from labd.lab.loader import Lab
from labd.measure.ettr import ModelInputs
from labd.measure.failures import FailureClass, Profile, Trace
from labd.measure.reconfig import progress_bar

#: Failures driven when the user does not say: enough for a p50 and a rough spread of each
#: recovery path, in about a second each on the failover lab.
DRIVE_DEFAULT = 24
#: How long the replay of the whole modelled run should take, minutes.
MINUTES_DEFAULT = 2.0


@dataclass(frozen=True)
class Planned:
    """One failure of the trace, to be driven on the rig."""

    index: int
    """Its place in the trace."""
    cls: FailureClass
    at_h: float
    repair_h: float

    def at_s(self, compression: float) -> float:
        """When it is due in the replay, seconds from its start."""
        return self.at_h * 3600 / compression


@dataclass(frozen=True)
class ReplayPlan:
    failures: list[Planned]
    compression: float
    """Modelled seconds per replayed second."""
    modelled: dict[str, int]
    """Failures of each class in the trace."""

    def driven(self) -> dict[str, int]:
        out = dict.fromkeys(self.modelled, 0)
        for p in self.failures:
            out[p.cls.id] += 1
        return out


def plan_replay(profile: Profile, trace: Trace, inputs: ModelInputs, *, drive: int,
                minutes: float, seed: int) -> ReplayPlan:
    """Which of the trace's failures the rig drives: ``drive`` of those with a recovery
    path, at random but at least one of each path the trace has (the model needs every
    path's recovery measured), in the trace's order; and the compression that fits the
    modelled run into ``minutes``."""
    if drive < 1 or not math.isfinite(minutes) or minutes <= 0:
        raise ProfileError("--drive must be at least 1 and --minutes positive")
    rng = np.random.default_rng(seed)
    paths = np.array([c.path for c in profile.classes])[trace.classes]
    candidates = np.flatnonzero(paths != "none")
    chosen: list[int] = []
    for path in ("gpu", "host"):
        mine = np.flatnonzero(paths == path)
        if len(mine) and len(chosen) < drive:
            chosen.append(int(rng.choice(mine)))
    rest = np.setdiff1d(candidates, chosen)
    more = min(drive - len(chosen), len(rest))
    if more > 0:
        chosen += [int(i) for i in rng.choice(rest, size=more, replace=False)]
    repair = inputs.repair_of(profile)
    failures = [Planned(i, profile.classes[trace.classes[i]], float(trace.hours[i]),
                        float(repair[trace.classes[i]])) for i in sorted(chosen)]
    counts = trace.counts(len(profile.classes))
    return ReplayPlan(failures, inputs.hours * 3600 / (minutes * 60),
                      {c.id: int(counts[i]) for i, c in enumerate(profile.classes)})


async def replay(lab: Lab, plan: ReplayPlan, *, mqtt: str | None, console: Console,
                 seed: int, job: str | None = None, db: str | None = None,
                 each: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
                 skip: int = 0) -> list[dict[str, Any]]:
    """Drive the plan's failures (after the first ``skip``, which a resumed run has) on the
    lab in emulation, each at its compressed time; ``each`` is awaited with every row as
    it comes. A failure due while the last is still being recovered or repaired waits for
    it (its row says how late it was injected)."""
    job_id = check_drillable(lab, job, mqtt=mqtt)
    rng = random.Random(seed + skip)
    rows: list[dict[str, Any]] = []
    todo = plan.failures[skip:]
    async with drill_rig(lab, job_id, mqtt=mqtt, db=db) as rig:
        with progress_bar(console) as progress:
            task = progress.add_task("availability replay", total=len(plan.failures),
                                     completed=skip)
            # The replay's clock starts at the first failure still to drive.
            origin = time.monotonic() - (todo[0].at_s(plan.compression) if todo else 0)
            for planned in todo:
                wait = planned.at_s(plan.compression) - (time.monotonic() - origin)
                if wait > 0:
                    # The replay's schedule: the gap between two failures, compressed.
                    await asyncio.sleep(wait)
                late = max(0.0, -wait)
                progress.update(task, description=f"{planned.cls.id} at "
                                                  f"{planned.at_h:.1f} h")
                result = await run_drill(rig, job_id, rng, kind=planned.cls.path,
                                         signal=planned.cls.signal)
                row = {**result.row(), "class": planned.cls.id, "path": planned.cls.path,
                       "signal": planned.cls.signal if planned.cls.path == "gpu" else None,
                       "index": planned.index, "modelled_h": planned.at_h,
                       "late_s": round(late, 3),
                       "repair_s": planned.repair_h * 3600 / plan.compression}
                rows.append(row)
                if each is not None:
                    await each(row)
                if row["repair_s"] > 0:
                    # The member is out for its repair time, compressed.
                    await asyncio.sleep(row["repair_s"])
                await restore(rig, result, job_id)
                progress.advance(task)
    return rows
