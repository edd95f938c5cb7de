"""Failover drill campaigns (``labd measure failover``, the demo's drill): many drills on
an emulated rig, one after another, each member repaired and returned before the next, and
every stage's p50/p99 over the runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from labd import deadlines
from labd.daemon.core import Daemon
from labd.emulation.drill import DrillResult, hosts_ready, job_stepping, repair, run_drill, wait_for
from labd.emulation.emulators import write_resolved
from labd.emulation.rig import Rig, emulated_rig, rig_bus
from labd.errors import DrillError
from labd.ha.role import HaSettings
from labd.lab.loader import Lab
from labd.mqtt.credentials import BusSettings
from labd.vocabulary import STAGES, percentile


async def measure_failover(lab: Lab, *, drills: int, lost: int, mqtt: str | None,
                           console: Console,
                           seed: int | None = None, signal: str = "xid79",
                           db: str | None = None, job: str | None = None,
                           each: Callable[[DrillResult], Awaitable[None]] | None = None,
                           done: int = 0, ha: str | None = None) -> list[DrillResult]:
    """``drills`` GPU failures then ``lost`` hosts lost on the lab in emulation; ``each``
    is awaited with every result as it comes (a run keeps it); a progress bar starts at
    ``done`` (drills a resumed run already has). ``ha``: a PostgreSQL URL where the
    drills' daemon leads by a lease (its store there too, every write fenced) with a
    standby (``labd run --ha``, a process of its own) beside it."""
    job_id = check_drillable(lab, job, ha=ha, mqtt=mqtt)
    rng = random.Random(seed)
    results: list[DrillResult] = []
    plan = ["gpu"] * drills + ["host"] * lost
    async with drill_rig(lab, job_id, mqtt=mqtt, db=db, ha=ha) as rig:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("failover drills", total=len(plan) + done,
                                     completed=done)
            for kind in plan:
                result = await run_drill(rig, job_id, rng, kind=kind, signal=signal)
                results.append(result)
                if each is not None:
                    await each(result)
                await restore(rig, result, job_id)
                progress.advance(task)
    return results


def check_drillable(lab: Lab, job: str | None, *, ha: str | None = None,
                    mqtt: str | None = None) -> str:
    """The job drills fail members of (``job``, or the lab's first), after checking that
    the lab can be drilled: the job has spares and every host is emulated; raises
    DrillError saying what is missing."""
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
    if ha is not None and mqtt is None:
        raise DrillError("--ha needs a broker (--mqtt): a standby hears the lab's hosts "
                         "there")
    return job_id


@contextlib.asynccontextmanager
async def drill_rig(lab: Lab, job: str, *, mqtt: str | None, db: str | None = None,
                    ha: str | None = None) -> AsyncIterator[Rig]:
    """The lab in emulation with its daemon (and with ``ha``, a standby beside it), every
    host online and ``job`` taking steps: where drills start (``labd measure failover``,
    ``labd measure availability``)."""
    # With a standby, the rig's instance and host keys are made here: the standby hears the
    # same hosts on the same topics.
    bus = rig_bus(lab, mqtt) if ha is not None and mqtt is not None else mqtt
    with tempfile.TemporaryDirectory() as scratch:
        async with contextlib.AsyncExitStack() as stack:
            rig = await stack.enter_async_context(emulated_rig(
                lab, db=ha or db or str(Path(scratch) / "drill.sqlite"), mqtt=bus,
                ha=HaSettings(ha) if ha is not None else None))
            daemon = rig.daemon
            if ha is not None and isinstance(bus, BusSettings):
                await stack.enter_async_context(standby(rig, lab, ha, bus, Path(scratch)))
            await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online",
                           "every host online")
            await daemon.jobs.start_job(job)
            await wait_for(daemon.hub, lambda: job_stepping(daemon, job), "first_step",
                           f"job {job} to take its first step")
            yield rig


async def restore(rig: Rig, result: DrillResult, job: str) -> None:
    """After a drill: the failed member repaired and given back as a spare, and the job
    taking steps again, so that the next drill finds the lab as the first did."""
    await repair(rig, result, job)
    await wait_for(rig.daemon.hub, lambda: job_stepping(rig.daemon, job), "first_step",
                   partial(_not_running, rig.daemon, job, result))


@dataclass(frozen=True)
class Standby:
    url: str
    token: str
    """Its admin key (one of its own)."""


@contextlib.asynccontextmanager
async def standby(rig: Rig, lab: Lab, ha: str, bus: BusSettings, folder: Path
                  ) -> AsyncIterator[Standby]:
    """A standby beside the rig's daemon: ``labd run --ha`` in a process of its own, on a
    copy of the lab file that points at the rig's emulators and plays no host; yielded
    once it says it stands by."""
    if rig.daemon.role is None or rig.daemon.role.name != "leader":
        leader = (rig.daemon.role.describe()["leader"] if rig.daemon.role is not None
                  else None)
        raise DrillError(f"the drills' daemon does not lead lab {lab.lab.name!r} at {ha}: "
                         f"another daemon holds its lease ({leader or 'unknown'}); stop it, "
                         "or give another database")
    assert rig.emulated is not None
    resolved, keys = folder / "standby.toml", folder / "standby-keys.toml"
    write_resolved(lab, rig.emulated, [e for e in lab.instrument if e.emulate], resolved,
                   [h.id for h in lab.host if h.emulate])
    bus.credentials.write(keys)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    token = secrets.token_urlsafe(16)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "run", str(resolved), "--ha", ha, "--port", str(port),
        "--mqtt", bus.url, "--mqtt-credentials", str(keys), "--instance", bus.instance,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LABD_TOKEN": token})
    url = f"http://127.0.0.1:{port}"
    try:
        await _stands_by(process, url, token)
        yield Standby(url, token)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _stands_by(process: asyncio.subprocess.Process, url: str, token: str) -> None:
    """Until the standby answers that it stands by (another process: no event to wait on,
    so its health is asked every 50 ms, up to the ``process_ready`` deadline)."""
    timeout = deadlines.current().of("process_ready")
    try:
        async with asyncio.timeout(timeout), httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {token}"},
                timeout=2) as http:
            while process.returncode is None:
                with contextlib.suppress(httpx.TransportError):
                    health = (await http.get("/v1/health")).json()
                    if (health.get("ha") or {}).get("role") == "standby":
                        return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise DrillError(deadlines.timed_out(timeout, "the standby (labd run --ha) to stand "
                                                      "by")) from None
    assert process.stderr is not None
    said = (await process.stderr.read()).decode(errors="replace").strip().splitlines()
    raise DrillError(f"the standby (labd run --ha) exited ({process.returncode}) before it "
                     f"stood by: {said[-1] if said else 'it said nothing'}")


def _not_running(daemon: Daemon, job: str, last: DrillResult) -> str:
    state = daemon.jobs.job(job)
    return (f"job {job} to run again (after {last.timeline['outcome']} on {last.member}; "
            f"the job is {state.status}, epoch {state.epoch}, ranks' progress "
            f"{state.progress})")


#: How far above the switch's own time light may reach every new circuit after a failure
#: report, at p50 (ms): the daemon's share of a recovery.
ABOVE_SWITCH_MS = 5.0
#: Stages of a GPU failure and how soon after the injection each must be reached at p50, ms.
GPU_STAGES_MS = {"reported": 1.0, "detected": 2.0, "first_step": 250.0}
#: A lost host is detected within this many heartbeat intervals, in every drill.
LOST_INTERVALS = 1.5


def _targets(rows: list[dict[str, Any]], switch_ms: float | None
             ) -> list[tuple[str, list[float], str, bool]]:
    """(figure, its values, the target, whether they meet it) for each target the drills
    have values for."""
    gpu = [r for r in rows if r["kind"] == "gpu"]
    out: list[tuple[str, list[float], str, bool]] = []
    light = [v for r in gpu if (v := r.get("report_to_light_ms")) is not None]
    if light and switch_ms is not None:
        out.append(("failure report → light on every new circuit (truth), ms", light,
                    f"p50 ≤ {switch_ms:g} + {ABOVE_SWITCH_MS:g}",
                    percentile(light, 50) <= switch_ms + ABOVE_SWITCH_MS))
    for stage, bound in GPU_STAGES_MS.items():
        values = [v for r in gpu if (v := r["ms"].get(stage)) is not None]
        if values:
            out.append((f"GPU failure → {stage.replace('_', ' ')}, ms", values,
                        f"p50 ≤ {bound:g}", percentile(values, 50) <= bound))
    detect = [r["ms"]["detected"] / (r["heartbeat_s"] * 1000) for r in rows
              if r["kind"] == "host" and "detected" in r["ms"]]
    if detect:
        out.append(("host lost → detected, heartbeat intervals", detect,
                    f"≤ {LOST_INTERVALS:g}", max(detect) <= LOST_INTERVALS))
    return out


def failover_report(rows: list[dict[str, Any]], switch_ms: float | None) -> list[Table]:
    """Each stage's p50/p99/max over the drills (rows from DrillResult.row), and the
    targets (:func:`_targets`): failure report → light on every new circuit, the report,
    its detection and the first step after it, and lost-host detection."""
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
    for figure, values, shown, met in _targets(rows, switch_ms):
        target.add_row(figure, str(len(values)), f"{percentile(values, 50):.2f}",
                       f"{percentile(values, 99):.2f}", shown, "yes" if met else "NO")
    tables.append(target)
    return tables
