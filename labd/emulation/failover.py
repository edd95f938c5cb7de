"""Failover drill campaigns (``labd measure failover``, the demo's drill): many drills on
an emulated rig, one after another, each member repaired and returned before the next, and
every stage's p50/p99 over the runs."""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from labd.daemon.core import Daemon
from labd.emulation.drill import DrillResult, hosts_ready, job_stepping, repair, run_drill, wait_for
from labd.emulation.rig import emulated_rig
from labd.errors import DrillError
from labd.lab.file import Lab
from labd.vocabulary import STAGES, percentile


async def measure_failover(lab: Lab, *, drills: int, lost: int, mqtt: str | None,
                           console: Console,
                           seed: int | None = None, signal: str = "xid79",
                           db: str | None = None, job: str | None = None,
                           each: Callable[[DrillResult], Awaitable[None]] | None = None,
                           done: int = 0) -> list[DrillResult]:
    """``drills`` GPU failures then ``lost`` hosts lost on the lab in emulation; ``each``
    is awaited with every result as it comes (a run keeps it); a progress bar starts at
    ``done`` (drills a resumed run already has)."""
    if not lab.job:
        raise DrillError(f"{lab.source}: the lab has no [[job]] to drill")
    job_id = job or lab.job[0].id
    entry = next((j for j in lab.job if j.id == job_id), None)
    if entry is None:
        raise DrillError(f"no job {job_id!r}; jobs: {', '.join(j.id for j in lab.job)}")
    if not entry.spares:
        raise DrillError(f"job {job_id!r} has no spares to swap in")
    unplayed = [h.id for h in lab.host if not h.emulate]
    if unplayed:
        raise DrillError(f"drills fail GPUs in emulation; hosts {', '.join(unplayed)} are "
                         "not emulate = true")
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as scratch:
        async with emulated_rig(lab, db=db or str(Path(scratch) / "drill.sqlite"),
                                mqtt=mqtt) as rig:
            daemon = rig.daemon
            await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online",
                           "every host online")
            await daemon.jobs.start_job(job_id)
            await wait_for(daemon.hub, lambda: job_stepping(daemon, job_id), "first_step",
                           f"job {job_id} to take its first step")
            results: list[DrillResult] = []
            plan = ["gpu"] * drills + ["host"] * lost
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("failover drills", total=len(plan) + done,
                                         completed=done)
                for kind in plan:
                    result = await run_drill(rig, job_id, rng, kind=kind, signal=signal)
                    results.append(result)
                    if each is not None:
                        await each(result)
                    await repair(rig, result, job_id)
                    await wait_for(daemon.hub, lambda: job_stepping(daemon, job_id),
                                   "first_step",
                                   partial(_not_running, daemon, job_id, result))
                    progress.advance(task)
    return results


def _not_running(daemon: Daemon, job: str, last: DrillResult) -> str:
    state = daemon.jobs.job(job)
    return (f"job {job} to run again (after {last.timeline['outcome']} on {last.member}; "
            f"the job is {state.status}, epoch {state.epoch}, ranks' progress "
            f"{state.progress})")


def failover_report(rows: list[dict[str, Any]], switch_ms: float | None) -> list[Table]:
    """Each stage's p50/p99/max over the drills (rows from DrillResult.row), and the
    targets: failure report → light on every new circuit, and lost-host detection."""
    tables = []
    for kind, title in (("gpu", "GPU failures"), ("host", "Hosts lost (no failure report)")):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        outcomes = Counter(r["outcome"] for r in mine)
        table = Table(title=f"{title}: {len(mine)} drills "
                            f"({', '.join(f'{v} {k}' for k, v in sorted(outcomes.items()))}); "
                            "ms after the failure was injected")
        for column in ("stage", "n", "p50", "p99", "max"):
            table.add_column(column, justify="left" if column == "stage" else "right")
        for stage in (*STAGES[1:], "light_truth"):
            values = [v for r in mine if (v := r["ms"].get(stage)) is not None]
            if values:
                label = "light at receivers (truth)" if stage == "light_truth" else stage
                table.add_row(label, str(len(values)), f"{percentile(values, 50):.2f}",
                              f"{percentile(values, 99):.2f}", f"{max(values):.2f}")
        tables.append(table)
    target = Table(title="Targets", show_header=True)
    for column in ("figure", "n", "p50", "p99", "target", "met"):
        target.add_column(column, justify="left" if column in ("figure", "target") else "right")
    report_to_light = [v for r in rows if r["kind"] == "gpu"
                       and (v := r.get("report_to_light_ms")) is not None]
    if report_to_light and switch_ms is not None:
        p50 = percentile(report_to_light, 50)
        target.add_row("failure report → light on every new circuit (truth), ms",
                       str(len(report_to_light)), f"{p50:.2f}",
                       f"{percentile(report_to_light, 99):.2f}",
                       f"p50 ≤ {switch_ms:g} + 10", "yes" if p50 <= switch_ms + 10 else "NO")
    detect = [r["ms"]["detected"] / (r["heartbeat_s"] * 1000) for r in rows
              if r["kind"] == "host" and "detected" in r["ms"]]
    if detect:
        target.add_row("host lost → detected, heartbeat intervals", str(len(detect)),
                       f"{percentile(detect, 50):.2f}", f"{percentile(detect, 99):.2f}",
                       "≤ 1.5", "yes" if max(detect) <= 1.5 else "NO")
    tables.append(target)
    return tables
