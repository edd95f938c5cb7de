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
import random
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiomqtt
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from instruments.errors import InstrumentError
from labd.client.control import Backdoor
from labd.daemon.core import Daemon
from labd.emulation.rig import EmulatedHost, emulated_hosts, emulated_lab, endpoint_of
from labd.errors import DrillBusy, DrillError, JobError, LabdError, RequestError
from labd.events import EventHub
from labd.lab.file import Lab
from labd.mqtt import parse_url
from labd.vocabulary import ACTIVE, STAGES, percentile

FINAL = ("recovered", "no-spare", "declined", "recorded", "failed", "timeout", "skipped")


@dataclass
class Rig:
    """An emulated lab (instruments and hosts, in this process) with the daemon on it."""

    daemon: Daemon
    backdoor: Backdoor
    hosts: list[EmulatedHost]


@contextlib.asynccontextmanager
async def emulated_rig(lab: Lab, *, db: str, mqtt: str | None, port: int = 0,
                       token: str | None = None) -> AsyncIterator[Rig]:
    """Start the lab's emulators and emulated hosts and a daemon on them; stop them all
    after (and clear the hosts' retained MQTT status, which would outlive the run). Without
    ``mqtt`` the hosts report to the daemon over HTTP."""
    emulated, entries = emulated_lab(lab)
    async with emulated:
        daemon = Daemon(lab, db=db, port=port, token=token, mqtt=mqtt,
                        addresses={e.id: endpoint_of(emulated, e) for e in entries})
        await daemon.start()
        hosts = emulated_hosts(lab, mqtt, emulated, daemon=(daemon.url, daemon.token))
        backdoor = Backdoor(emulated.control_url)
        rig = Rig(daemon, backdoor, hosts)
        daemon.drills = drills = DrillService(rig)
        try:
            if daemon.bus is not None:
                await daemon.bus.wait_sessions(1, timeout=10)
            for host in hosts:
                host.start()
                emulated.hosts[host.id] = host
            yield rig
        finally:
            await drills.close()
            for host in hosts:
                await host.stop()
            await backdoor.close()
            await daemon.stop()
            if mqtt is not None:
                await clear_retained(lab.lab.name, [h.id for h in lab.host], mqtt)


async def clear_retained(lab: str, hosts: Iterable[str], mqtt: str) -> None:
    """Clear the retained status topics a run leaves on the broker (hosts' and daemon's)."""
    with contextlib.suppress(aiomqtt.MqttError):
        async with aiomqtt.Client(*parse_url(mqtt)) as cleaner:
            for host in hosts:
                await cleaner.publish(f"labd/{lab}/hosts/{host}/status", b"", retain=True)
            await cleaner.publish(f"labd/{lab}/daemon", b"", retain=True)


async def wait_for(hub: EventHub, check: Callable[[], Any], timeout: float,
                   what: str | Callable[[], str]) -> Any:
    """Wait until ``check()`` is truthy, looking again after each daemon event."""
    _, sub = hub.subscribe()
    try:
        async with asyncio.timeout(timeout):
            while not (found := check()):
                if await sub.next() is None:
                    _, sub = hub.subscribe()
            return found
    except TimeoutError:
        said = what() if callable(what) else what
        raise DrillError(f"timed out after {timeout:g} s waiting for {said}") from None
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


def job_stepping(daemon: Daemon, job: str) -> bool:
    state = daemon.jobs.job(job)
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


async def run_drill(rig: Rig, job: str, rng: random.Random, *, kind: str = "gpu",
                    signal: str = "xid79", timeout: float = 60,
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


async def repair(rig: Rig, result: DrillResult, job: str, timeout: float = 30) -> None:
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

    def __init__(self, rig: Rig) -> None:
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
                await wait_for(daemon.hub, lambda: hosts_ready(daemon), 30, "every host online")
                await daemon.jobs.start_job(job)
            await wait_for(daemon.hub, lambda: job_stepping(daemon, job), 60,
                           f"job {job} to take its first step")
            result = await run_drill(self.rig, job, self.rng, kind=kind, member=member)
            say("recovered" if result.timeline["outcome"] == "recovered" else "ended",
                member=result.member, outcome=result.timeline["outcome"],
                failover=result.timeline.get("id"))
            await repair(self.rig, result, job)
            say("done", member=result.member, outcome=result.timeline["outcome"])
        except (LabdError, InstrumentError) as exc:
            say("failed", detail=str(exc))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


# -- labd measure failover -----------------------------------------------------------------
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
            await wait_for(daemon.hub, lambda: hosts_ready(daemon), 30, "every host online")
            await daemon.jobs.start_job(job_id)
            await wait_for(daemon.hub, lambda: job_stepping(daemon, job_id), 60,
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
                    await wait_for(daemon.hub, lambda: job_stepping(daemon, job_id), 60,
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


LOCAL_BROKER = "mqtt://127.0.0.1:1883"


def local_broker() -> str | None:
    """The MQTT broker on this machine, if one answers."""
    return LOCAL_BROKER if broker_reachable(LOCAL_BROKER) is None else None


def broker_reachable(url: str) -> str | None:
    """None when an MQTT broker listens at ``url``; otherwise why not."""
    import socket

    try:
        socket.create_connection(parse_url(url), timeout=2).close()
    except (OSError, LabdError) as exc:
        return str(exc)
    return None
