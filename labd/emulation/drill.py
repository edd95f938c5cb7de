"""Failover drills on an emulated lab: fail a member's GPU (or kill its host) through the
emulators' control endpoint, let the daemon recover the job, read the recorded timeline,
set it beside the optical model's ground truth, then repair the member and give it back to
the spare pool so the next drill starts from a lab like the first.

``labd measure failover`` runs many of them and prints each stage's p50/p99; ``labd demo``
runs one; the integration tests drive the same functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rich.table import Table

from instruments.errors import InstrumentError
from labd import deadlines
from labd.client.control import Backdoor
from labd.daemon.core import Daemon
from labd.deadlines import Wait
from labd.errors import DrillBusy, DrillError, JobError, LabdError, RequestError
from labd.events import EventHub
from labd.vocabulary import ACTIVE, STAGES

log = logging.getLogger(__name__)

FINAL = ("recovered", "no-spare", "declined", "recorded", "failed", "timeout", "skipped")


class DrillRig(Protocol):
    """What a drill needs of a rig (labd.emulation.rig.Rig): the daemon, and the emulators'
    control endpoint to fail and repair GPUs and hosts."""

    @property
    def daemon(self) -> Daemon: ...
    @property
    def backdoor(self) -> Backdoor: ...


async def wait_for(hub: EventHub, check: Callable[[], Any], timeout: float | Wait,
                   what: str | Callable[[], str]) -> Any:
    """Wait until ``check()`` is truthy, looking again after each daemon event; give up
    after ``timeout`` s (a name: that deadline of :func:`labd.deadlines.current`)."""
    if isinstance(timeout, str):
        timeout = deadlines.current().of(timeout)
    _, sub = hub.subscribe()
    try:
        async with asyncio.timeout(timeout):
            while not (found := check()):
                if await sub.next() is None:
                    _, sub = hub.subscribe()
            return found
    except TimeoutError:
        said = what() if callable(what) else what
        raise DrillError(deadlines.timed_out(timeout, said)) from None
    finally:
        sub.close()


def hosts_ready(daemon: Daemon) -> bool:
    """Every host online, and every GPU behind a fabric NIC reported healthy."""
    for host in daemon.lab.host:
        seen = daemon.hosts.hosts.get(host.id)
        if seen is None or seen.status != "online":
            return False
        if any(seen.gpu_health(gpu) != "healthy" for gpu in range(len(host.nics))):
            return False
    return True


#: A job in one of these, with no failure waiting for its recovery, takes no step until
#: someone acts: waiting longer for one would only wait out the deadline.
STALLED = ("idle", "stopped", "degraded")


def job_stepping(daemon: Daemon, job: str) -> bool:
    """Every rank of the job has taken a step; raises DrillError when the job is in a state
    it will not step from (stopped, or degraded by a recovery that could not be made)."""
    state = daemon.jobs.job(job)
    if state.status in STALLED and state.queue.empty() and state.decision is None:
        raise DrillError(f"job {job} is {state.status} and will take no step until someone "
                         f"acts (epoch {state.epoch}, members {', '.join(state.members)}, "
                         f"spares {', '.join(state.spares) or 'none'}; GET /v1/failovers "
                         "says why)")
    return state.status == "running" and all(
        "step" in state.progress.get(rank, {}) for rank in range(len(state.members)))


@dataclass
class DrillResult:
    kind: str  # gpu, host
    member: str
    injected_ns: int
    timeline: dict[str, Any]
    light_truth_ns: int | None
    """When light (by the optical model) arrived at the last new circuit's receiver."""
    heartbeat_s: float

    def ms(self, stage: str, since: str = "failure") -> float | None:
        stages = self.timeline["stages"]
        start = self.injected_ns if since == "failure" else stages.get(since)
        at = self.light_truth_ns if stage == "light_truth" else stages.get(stage)
        return None if at is None or start is None else (at - start) / 1e6

    def row(self) -> dict[str, Any]:
        """What a measurement run keeps of the drill: each stage in ms after the injected
        failure (``light_truth``: light at every new receiver by the optical model)."""
        plan = self.timeline.get("plan") or {}
        return {"kind": self.kind, "member": self.member, "spare": plan.get("spare"),
                "outcome": self.timeline["outcome"], "failover": self.timeline.get("id"),
                "heartbeat_s": self.heartbeat_s,
                "ms": {stage: v for stage in (*STAGES[1:], "light_truth")
                       if (v := self.ms(stage)) is not None},
                "report_to_light_ms": self.ms("light_truth", since="reported")}


def _failover_done(daemon: Daemon, job: str, member: str, since_seq: int
                   ) -> Callable[[], dict[str, Any] | None]:
    found: dict[str, dict[str, Any]] = {}
    _, sub = daemon.hub.subscribe()

    def check() -> dict[str, Any] | None:
        while not sub.queue.empty():
            event = sub.queue.get_nowait()
            if event is None:
                break
            data = event.data
            if (event.kind == "failover" and event.seq > since_seq and data["job"] == job
                    and data["member"] == member):
                found["latest"] = data
                if data["outcome"] in FINAL:
                    found["timeline"] = data
        if "timeline" in found:
            sub.close()
        return found.get("timeline")

    check.latest = found  # type: ignore[attr-defined]
    return check


async def run_drill(rig: DrillRig, job: str, rng: random.Random, *, kind: str = "gpu",
                    signal: str = "xid79", timeout: float | Wait = "recovery",
                    member: str | None = None) -> DrillResult:
    """Fail one member (``member``, or one at random) of a running job and wait for its
    recovery to end."""
    daemon = rig.daemon
    state = daemon.jobs.job(job)
    member = member or rng.choice(state.members)
    where = daemon.lab.placement(member)
    if where is None:
        raise DrillError(f"member {member!r} is on no host")
    host, gpu = where
    light_seq = max((c["seq"] for c in await rig.backdoor.light()), default=0)
    done = _failover_done(daemon, job, member, daemon.hub.last_seq)
    if kind == "gpu":
        injected = await rig.backdoor.fail_gpu(host.id, gpu, signal)
    else:
        injected = await rig.backdoor.kill_host(host.id)
    try:
        timeline = await wait_for(daemon.hub, done, timeout, f"the recovery of {member}")
    except DrillError as exc:
        so_far = done.latest.get("latest")  # type: ignore[attr-defined]
        raise DrillError(f"{exc}; its timeline so far: {so_far or 'none (never detected)'}; "
                         f"the job: {state.as_dict()}") from None
    receivers = {dst for _, dst in (timeline.get("plan") or {}).get("new_links", [])}
    # Light is on every new circuit once the last receiver saw its last rise.
    latest: dict[str, int] = {}
    for c in await rig.backdoor.light(light_seq):
        if c["node"] in receivers and c["direction"] == "rise" and c["at_ns"] > injected:
            latest[c["node"]] = c["at_ns"]
    truth = max(latest.values()) if receivers and len(latest) == len(receivers) else None
    return DrillResult(kind, member, injected, timeline, truth, host.heartbeat_s)


async def repair(rig: DrillRig, result: DrillResult, job: str,
                 timeout: float | Wait = "hosts_online") -> None:
    """Heal (or revive) the failed member's host and give the member back as a spare."""
    daemon = rig.daemon
    where = daemon.lab.placement(result.member)
    assert where is not None
    host, gpu = where
    if result.kind == "gpu":
        await rig.backdoor.heal(host.id, gpu)
    else:
        await rig.backdoor.revive_host(host.id)
    await wait_for(daemon.hub, lambda: hosts_ready(daemon), timeout,
                   f"host {host.id} to report healthy")
    if result.member not in daemon.jobs.job(job).members:
        await daemon.jobs.return_spare(job, result.member)


class DrillService:
    """Failover drills asked for through the API (``POST /v1/drills/failover``, the TUI's
    ``d``) on a daemon whose GPU hosts are emulated in its own process. A drill starts the
    job if it is not running, fails one member, lets the daemon recover, then repairs the
    member and gives it back as a spare, so the next drill finds the lab as the first did.
    Each step is published as a ``drill`` event; the recovery itself as ``failover``."""

    def __init__(self, rig: DrillRig) -> None:
        self.rig = rig
        self.task: asyncio.Task[None] | None = None
        self.rng = random.Random()

    def start(self, job: str | None, member: str | None, kind: str) -> dict[str, Any]:
        """Check the request and start the drill; raises RequestError (nothing started)."""
        daemon = self.rig.daemon
        if self.task is not None and not self.task.done():
            raise DrillBusy("a drill is already running; wait for its 'drill' event "
                            "with state done or failed")
        with_spares = [j.id for j in daemon.lab.job if j.spares]
        job_id = job or (with_spares[0] if with_spares else None)
        if job_id is None:
            raise JobError("no job of this lab has spares to swap in; a drill needs one")
        state = daemon.jobs.job(job_id)  # UnknownJob names the jobs
        if not state.entry.spares:
            raise JobError(f"job {job_id!r} has no spares to swap in")
        if state.status == "recovering":
            raise JobError(f"job {job_id!r} is recovering; wait for the recovery to end")
        if member is not None and member not in state.members:
            raise RequestError(f"{member!r} is not a member of job {job_id!r} (members: "
                               f"{', '.join(state.members)})")
        self.task = asyncio.create_task(self._run(job_id, member, kind),
                                        name=f"drill-{job_id}")
        return {"job": job_id, "member": member, "kind": kind, "state": "started"}

    async def _run(self, job: str, member: str | None, kind: str) -> None:
        daemon = self.rig.daemon

        def say(state: str, **more: Any) -> None:
            daemon.hub.publish("drill", {"job": job, "kind": kind, "state": state, **more})

        say("started", member=member)
        try:
            if daemon.jobs.job(job).status not in ACTIVE:
                await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online",
                               "every host online")
                await daemon.jobs.start_job(job)
            await wait_for(daemon.hub, lambda: job_stepping(daemon, job), "first_step",
                           f"job {job} to take its first step")
            result = await run_drill(self.rig, job, self.rng, kind=kind, member=member)
            say("recovered" if result.timeline["outcome"] == "recovered" else "ended",
                member=result.member, outcome=result.timeline["outcome"],
                failover=result.timeline.get("id"))
            await repair(self.rig, result, job)
            say("done", member=result.member, outcome=result.timeline["outcome"])
        except (LabdError, InstrumentError) as exc:
            say("failed", detail=str(exc))
        except Exception as exc:  # a bug: still the drill's end, for those waiting on it
            log.exception("the failover drill on job %s broke", job)
            say("failed", detail=f"the drill broke: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

def timeline_table(result: DrillResult) -> Table:
    """One recovery, stage by stage: when (after the failure) and how long each step took."""
    t = result.timeline
    plan = t.get("plan") or {}
    table = Table(title=f"Failover drill: {t['trigger']} on {t['member']} → "
                        f"{plan.get('spare', 'no spare')} ({t['outcome']})")
    for column in ("stage", "ms after failure", "step, ms"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    # In the order they happened (light can reach a receiver before the switch says done).
    reached = sorted(((result.injected_ns if stage == "failure" else t["stages"].get(stage),
                       stage) for stage in STAGES), key=lambda item: (item[0] is None,
                                                                      item[0] or 0))
    previous = result.injected_ns
    for at, stage in reached:
        if at is None:
            table.add_row(stage, "-", "-")
            continue
        table.add_row(stage, f"{(at - result.injected_ns) / 1e6:.2f}",
                      f"{(at - previous) / 1e6:.2f}")
        previous = at
    if result.light_truth_ns is not None:
        table.add_row("[dim]light at receivers (truth)[/]",
                      f"[dim]{(result.light_truth_ns - result.injected_ns) / 1e6:.2f}[/]", "")
    return table
