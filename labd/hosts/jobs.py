"""Jobs and their recovery. The daemon starts a job (its circuits, then its ranks on the
hosts' agents), follows its progress, and when a member fails — a GPU verdict turns
``failed``, or its host is lost — swaps in a spare through the optical fabric and restarts
the job with the new rank map, timing every stage:

    failure → reported → detected → spare_chosen → switches_acked → light_verified
    → links_up → job_restarted → collectives_ready → first_step

Stages are CLOCK_MONOTONIC ns on the daemon's clock; what an agent observed (the report,
links, the job's progress) is moved onto it with the host's clock offset (labd.hosts.monitor).
``failure`` is when the host says the failure began (an emulated host knows exactly; a real
one reports when it saw it; a lost host, its last heartbeat).

Failures of one job are handled one after another: one that arrives while a recovery runs
waits for it, then sees the job as that recovery left it. Every recovery ends in a recorded
outcome: ``recovered``, ``no-spare``, ``declined``, ``recorded`` (policy ``off``),
``failed`` (a switch refused or light did not arrive), ``timeout`` (links or the restarted
job did not come up in time), or ``skipped`` (the member had already been replaced). A member
left failed is not reported again; returning a spare to the pool retries it. A degraded job
heals by itself: when a host comes back online or a GPU healthy, it is restarted where it
ran if every member can run again (trigger ``member-back``), or recovered onto a spare that
is usable now (``spare-back``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from labd.errors import JobError, LabdError, UnknownJob
from labd.events import Event, EventHub
from labd.fabric.engine import Engine, Result
from labd.hosts.monitor import HostMonitor
from labd.hosts.spares import Replacement, choose_spare
from labd.lab.file import JobEntry, Lab
from labd.lab.wiring import CircuitRoute, trace_circuit
from labd.store.models import FailoverTimeline, JobPool
from labd.store.store import Store
from labd.vocabulary import ACTIVE, STAGES

log = logging.getLogger(__name__)

SendToHost = Callable[[str, dict[str, Any]], Awaitable[None]]


def since_failure_ms(stages: dict[str, int | None]) -> dict[str, float]:
    """Each reached stage, in ms after the failure (after detection where the failure's
    own time is unknown)."""
    first = stages.get("failure") or stages.get("detected")
    return {k: round((v - first) / 1e6, 3) for k in STAGES
            if (v := stages.get(k)) is not None and first}


@dataclass
class Failure:
    job: str
    member: str
    host: str
    gpu: int | None
    trigger: str  # gpu-failed, host-lost
    reasons: list[str]
    failure_ns: int | None
    reported_ns: int | None
    detected_ns: int


@dataclass
class Timeline:
    job: str
    trigger: str
    member: str
    host: str
    gpu: int | None
    reasons: list[str]
    stages: dict[str, int | None]
    id: int | None = None
    outcome: str = "in-progress"
    detail: str = ""
    plan: dict[str, Any] | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    epoch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "job": self.job, "trigger": self.trigger, "member": self.member,
                "host": self.host, "gpu": self.gpu, "reasons": self.reasons,
                "outcome": self.outcome, "detail": self.detail, "plan": self.plan,
                "rejected": self.rejected, "epoch": self.epoch,
                "stages": {k: self.stages.get(k) for k in STAGES},
                "since_failure_ms": since_failure_ms(self.stages)}

    def row_detail(self) -> dict[str, Any]:
        data = self.as_dict()
        return {k: data[k] for k in ("trigger", "member", "host", "gpu", "reasons", "detail",
                                     "plan", "rejected", "epoch")}


@dataclass
class JobState:
    entry: JobEntry
    members: list[str]
    spares: list[str]
    epoch: int = 0
    run: str = ""
    """Names the current start alone (the agents echo it): a new leader may send again an
    epoch its predecessor sent but did not keep."""
    status: str = "idle"  # idle, running, recovering, degraded, stopped
    progress: dict[int, dict[str, int]] = field(default_factory=dict)
    """Rank → progress → when (daemon clock), for the current epoch."""
    queue: asyncio.Queue[Failure] = field(default_factory=asyncio.Queue)
    decision: asyncio.Future[bool] | None = None
    pending: Timeline | None = None
    incoming: str | None = None
    """The spare a running recovery is swapping in: its failures count as the job's."""
    failed: set[str] = field(default_factory=set)
    """Members known failed that no recovery replaced: further reports of them are not new
    failures; a spare returned to the pool retries them."""
    healing: bool = False
    """A look at whether the degraded job can run again is queued."""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.entry.id, "topology": self.entry.topology,
                "members": self.members, "spares": self.spares, "epoch": self.epoch,
                "status": self.status, "recovery": self.entry.recovery,
                "links": [list(link) for link in self.entry.links(self.members)],
                "awaiting_decision": self.pending.id if self.pending else None}

    def new_run(self) -> None:
        """A start or restart: the next epoch, under a name no earlier start had."""
        self.epoch += 1
        self.run = secrets.token_hex(4)
        self.progress = {}


class JobManager:
    def __init__(self, lab: Lab, engine: Engine, hosts: HostMonitor, hub: EventHub,
                 store: Store, send: SendToHost | None) -> None:
        self.lab, self.engine, self.hosts, self.hub, self.store = lab, engine, hosts, hub, store
        self.send = send
        self.jobs = {j.id: JobState(j, list(j.members), list(j.spares)) for j in lab.job}
        # By id: every GPU event looks its host up (a pod's start-up is thousands of them).
        self._host_entries = {h.id: h for h in lab.host}
        self._changed = asyncio.Event()
        """Set (and replaced) whenever a host reports something a recovery may wait for."""
        self.acting = True
        """False on a standby (``--ha``): host events are not acted on (the leader does),
        until :meth:`resume` at takeover looks at what happened meanwhile."""

    # -- lifecycle -------------------------------------------------------------------------
    async def load(self) -> None:
        """Members and spares as the last recovery or returned spare of each job left
        them (a store from before pools were kept: as the last recovery left them)."""
        def work(session: Session) -> tuple[list[FailoverTimeline], list[JobPool]]:
            return (list(session.scalars(select(FailoverTimeline).where(
                FailoverTimeline.outcome == "recovered").order_by(FailoverTimeline.id))),
                list(session.scalars(select(JobPool))))

        timelines, pools = await self.store.read(work)
        for row in timelines:
            state = self.jobs.get(row.job)
            plan = (row.detail or {}).get("plan") or {}
            if state is not None and isinstance(plan.get("members"), list):
                state.members = [str(m) for m in plan["members"]]
                state.spares = [s for s in state.spares if s not in state.members
                                and s != plan.get("failed")]
        for pool in pools:
            state = self.jobs.get(pool.job)
            if state is None:
                continue
            # Only endpoints the lab file still gives the job, as many members as it has.
            given = set(state.entry.members) | set(state.entry.spares)
            if (len(pool.members) == len(state.entry.members)
                    and set(pool.members) | set(pool.spares) <= given):
                state.members, state.spares = list(pool.members), list(pool.spares)
                # A recovery cut off (the daemon died in it) is the job running, with
                # whatever member failed still to be found again (resume).
                if pool.status in ACTIVE or pool.status in ("degraded", "stopped"):
                    state.status = "running" if pool.status == "recovering" else pool.status
                if pool.epoch is not None:
                    state.epoch = pool.epoch
            else:
                self.hub.publish("warning", {"detail": (
                    f"job {pool.job}: the kept members and spares are not the lab file's "
                    "(it changed): starting from the lab file's")})

    def _pool_write(self, state: JobState) -> Callable[[Session], None]:
        """The store write that keeps the job's members and spares as they are now."""
        pool = JobPool(job=state.entry.id, members=list(state.members),
                       spares=list(state.spares), wall_time=datetime.now(UTC),
                       status=state.status, epoch=state.epoch)

        def work(session: Session) -> None:
            session.merge(pool)
        return work

    def resume(self) -> int:
        """At takeover (``--ha``): act from now on, and queue a recovery for each member of
        a running job that failed while this daemon stood by (its host offline or lost, its
        GPU failed: what the leader it replaces may not have dealt with). A member whose
        host was not heard yet is left to the watchdog. Returns how many were queued."""
        self.acting = True
        queued = 0
        now = time.monotonic_ns()
        for state in self.jobs.values():
            if state.status not in ACTIVE:
                continue
            for member in state.members:
                where = self.lab.placement(member)
                seen = self.hosts.hosts.get(where[0].id) if where else None
                if where is None or seen is None:
                    continue
                if seen.status in ("offline", "lost"):
                    trigger, reasons = "host-lost", [f"host {seen.status} at takeover"]
                elif seen.gpu_health(where[1]) == "failed":
                    trigger, reasons = "gpu-failed", ["GPU failed at takeover"]
                else:
                    continue
                state.queue.put_nowait(Failure(state.entry.id, member, where[0].id,
                                               where[1], trigger, reasons,
                                               seen.last_sent_ns, None, now))
                queued += 1
        return queued

    async def run(self) -> None:
        """Each job's recovery worker, until cancelled (the daemon runs it among its
        background loops)."""
        async with asyncio.TaskGroup() as workers:
            for state in self.jobs.values():
                workers.create_task(self._worker(state), name=f"labd-recovery-{state.entry.id}")

    def job(self, job_id: str) -> JobState:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise UnknownJob(f"no job {job_id!r}; jobs: "
                           f"{', '.join(self.jobs) or 'none'}") from None

    # -- starting and stopping -------------------------------------------------------------
    def _ranks(self, members: list[str]) -> list[dict[str, Any]]:
        ranks = []
        for rank, endpoint in enumerate(members):
            where = self.lab.placement(endpoint)
            if where is None:
                raise JobError(f"member {endpoint!r} is no NIC of a [[host]]: labd cannot run "
                               "a rank there")
            ranks.append({"rank": rank, "host": where[0].id, "endpoint": endpoint,
                          "gpu": where[1]})
        return ranks

    def _sender(self) -> SendToHost:
        if self.send is None:
            raise JobError("jobs run through the hosts' agents: start the daemon with --mqtt")
        return self.send

    async def _command(self, state: JobState, hosts: set[str], action: str) -> None:
        send = self._sender()
        # Not into a broker the agents are still coming back to: one not yet back would
        # never hear it (their time to reconnect bounds the wait).
        await self.hosts.hearing(self.hosts.reconnect_s + 1.0)
        message: dict[str, Any] = {"action": action, "job": state.entry.id}
        if action == "start":
            message |= {"epoch": state.epoch, "run": state.run,
                        "ranks": self._ranks(state.members)}
        # All at once: each send waits for the broker's acknowledgement, and a restart
        # waits for the last host to hear of it.
        await asyncio.gather(*(send(host, message) for host in sorted(hosts)))

    def _hosts_of(self, members: list[str]) -> set[str]:
        return {w[0].id for m in members if (w := self.lab.placement(m)) is not None}

    async def start_job(self, job_id: str, *, verify_light: bool = True) -> dict[str, Any]:
        """Make the job's missing circuits, then start its ranks (a new epoch)."""
        state = self.job(job_id)
        if state.status == "recovering":
            raise JobError(f"job {job_id!r} is recovering; wait for the recovery to end")
        self._sender()  # before any circuit is made
        self._ranks(state.members)  # every member must be on a host
        missing = [(s, d) for s, d in state.entry.links(state.members)
                   if trace_circuit(self.lab, s, d, self.engine.intended) is None]
        if missing:
            _, results = await self.engine.connect_endpoints(missing, cause="api",
                                                             verify_light=verify_light)
            bad = [r for r in results if r.outcome == "failed"]
            if bad:
                raise JobError(f"job {job_id!r} not started: {bad[0].switch}: {bad[0].error}")
        state.new_run()
        await self._command(state, self._hosts_of(state.members), "start")
        state.status = "running"
        await self.store.run_write(self._pool_write(state))
        self.hub.publish("job.state", state.as_dict())
        return state.as_dict()

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        state = self.job(job_id)
        await self._command(state, self._hosts_of(state.members), "stop")
        state.status = "stopped"
        await self.store.run_write(self._pool_write(state))
        self.hub.publish("job.state", state.as_dict())
        return state.as_dict()

    async def return_spare(self, job_id: str, endpoint: str) -> dict[str, Any]:
        """Put a repaired endpoint (back) in the job's spare pool; kept in the store
        before it returns."""
        state = self.job(job_id)
        if self.lab.placement(endpoint) is None:
            raise JobError(f"{endpoint!r} is no NIC of a [[host]]")
        if any(endpoint in s.members for s in self.jobs.values()):
            raise JobError(f"{endpoint!r} is a member of a job; it cannot be a spare")
        if endpoint not in state.spares:
            state.spares.append(endpoint)
            await self.store.run_write(self._pool_write(state))
        for member in sorted(state.failed):
            where = self.lab.placement(member)
            state.queue.put_nowait(Failure(
                state.entry.id, member, where[0].id if where else "", where[1] if where else None,
                "spare-returned", [f"{endpoint} returned to the spare pool"], None, None,
                time.monotonic_ns()))
        self.hub.publish("job.state", state.as_dict())
        return state.as_dict()

    def decide(self, job_id: str, approve: bool) -> dict[str, Any]:
        """The operator's answer to a proposed swap (policy ``ask``)."""
        state = self.job(job_id)
        if state.decision is None or state.decision.done():
            raise JobError(f"job {job_id!r} has no recovery waiting for a decision")
        state.decision.set_result(approve)
        return state.as_dict()

    # -- following the hosts ---------------------------------------------------------------
    def host_event(self, event: Event) -> None:
        """What a host reported (HostListener): a failure is queued for recovery at once;
        progress, links and status wake the recoveries waiting on them."""
        if not self.acting:
            return
        self._heal_on(event)
        self._on_event(event)
        if event.kind in ("job.progress", "nic.link", "host.status", "host.lost"):
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def _heal_on(self, event: Event) -> None:
        """A host back online, or a GPU healthy again, may let a degraded job run again:
        each such job gets a look (queued behind whatever its worker is doing)."""
        data = event.data
        back = (event.kind == "host.status" and data.get("status") == "online") or (
            event.kind == "gpu.health" and data.get("health") == "healthy")
        if not back:
            return
        for state in self.jobs.values():
            if state.status == "degraded" and not state.healing and \
                    state.entry.recovery != "off":
                state.healing = True
                state.queue.put_nowait(Failure(
                    state.entry.id, "", str(data.get("host")), None, "member-back",
                    [f"host {data.get('host')} {data.get('status') or 'GPU healthy'}"],
                    None, None, event.at_ns))

    def _on_event(self, event: Event) -> None:
        data = event.data
        if event.kind == "gpu.health" and (placed := self._fabric_nic(data)) is not None:
            host_id, gpu, endpoint = placed
            if data.get("health") == "healthy":
                for state in self.jobs.values():  # a failed member that healed is usable
                    state.failed.discard(endpoint)
            elif data.get("health") == "failed":
                seen = self.hosts.hosts.get(host_id)
                self._enqueue(endpoint, host_id, gpu, "gpu-failed",
                              [str(r) for r in data.get("reasons") or []],
                              seen.to_daemon_clock(data.get("since_ns") or data.get("at_ns"))
                              if seen else None,
                              seen.to_daemon_clock(data.get("at_ns")) if seen else None,
                              event.at_ns)
        elif event.kind == "host.lost":
            host = self._host_entries.get(str(data.get("host")))
            if host is None:
                return
            # The host was last known alive when it sent its last heartbeat.
            last = data.get("last_sent_ns") or data.get("last_beat_ns")
            for nic in host.nics:
                self._enqueue(nic, host.id, None, "host-lost",
                              [f"host {data.get('status')}"],
                              last if isinstance(last, int) else None, None, event.at_ns)
        elif event.kind == "job.progress":
            self._on_progress(data)

    def _fabric_nic(self, data: dict[str, Any]) -> tuple[str, int, str] | None:
        """(host, GPU, its NIC endpoint) of a GPU event, for GPUs a fabric NIC serves (no
        job of ours runs on the others)."""
        host = self._host_entries.get(str(data.get("host")))
        gpu = data.get("gpu")
        if host is None or not isinstance(gpu, int) or not 0 <= gpu < len(host.nics):
            return None
        return host.id, gpu, host.nics[gpu]

    def _enqueue(self, member: str, host: str, gpu: int | None, trigger: str,
                 reasons: list[str], failure_ns: int | None, reported_ns: int | None,
                 detected_ns: int) -> None:
        for state in self.jobs.values():
            if (member in state.members or member == state.incoming) and \
                    state.status in ACTIVE:
                state.queue.put_nowait(Failure(state.entry.id, member, host, gpu, trigger,
                                               reasons, failure_ns, reported_ns, detected_ns))

    def _on_progress(self, data: dict[str, Any]) -> None:
        state = self.jobs.get(str(data.get("job")))
        if state is None or data.get("epoch") != state.epoch or \
                data.get("run") not in (None, "", state.run):
            return  # an earlier run of the job winding down
        host = self.hosts.hosts.get(str(data.get("host")))
        at = (host.to_daemon_clock(data.get("at_ns")) if host else None) or time.monotonic_ns()
        seen = state.progress.setdefault(int(data["rank"]), {})
        # A rank reports in order; a later report dated before an earlier one is the host's
        # clock offset estimate getting better (a slow first delivery overstated it), not
        # time going back: the stages built from them stay in order.
        seen.setdefault(str(data["progress"]), max(at, *seen.values()) if seen else at)

    async def _wait_for(self, check: Callable[[], int | None], timeout: float) -> int:
        """Wait until ``check()`` gives a time; TimeoutError after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            while (found := check()) is None:
                await self._changed.wait()
            return found

    # -- recovery --------------------------------------------------------------------------
    async def _worker(self, state: JobState) -> None:
        while True:
            failure = await state.queue.get()
            try:
                await self._recover(state, failure)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end recovery for this job for good
                # Said in the log too, with its traceback: a warning event alone left a
                # recovery that died this way invisible to whoever reads the journal.
                log.exception("recovery of job %s stopped by an internal error (%s of %s)",
                              state.entry.id, failure.trigger, failure.member,
                              extra={"job": state.entry.id})
                self.hub.publish("warning", {"detail": f"recovery of job {state.entry.id} "
                                                       f"stopped by an internal error: {exc!r}"})
                state.status = "degraded"

    def _publish(self, timeline: Timeline) -> None:
        self.hub.publish("failover", timeline.as_dict())

    def _stage(self, timeline: Timeline, stage: str, at: int | None) -> None:
        timeline.stages[stage] = at
        self._publish(timeline)

    async def _finish(self, state: JobState, timeline: Timeline, outcome: str, detail: str = "",
                      status: str | None = None) -> None:
        timeline.outcome, timeline.detail = outcome, detail
        if status is not None:
            state.status = status
        if outcome != "skipped" and timeline.member in state.members:
            state.failed.add(timeline.member)  # still in the job, and still failed
        else:
            state.failed.discard(timeline.member)
        if status is not None:
            self.store.run_write_nowait(self._pool_write(state))
        await self._save(timeline)
        self._publish(timeline)
        self.hub.publish("job.state", state.as_dict())

    async def _save(self, timeline: Timeline) -> None:
        timeline.id = await self.store.run_write(self._saving(timeline))

    def _saving(self, timeline: Timeline) -> Callable[[Session], int]:
        """The store write that keeps the timeline as it is now. Its id is set in the
        writer, so that a later write of it, queued behind, updates the same row."""
        values = {"job": timeline.job, "outcome": timeline.outcome,
                  "stages": {k: timeline.stages.get(k) for k in STAGES},
                  "trigger": timeline.trigger, "detail": timeline.row_detail()}

        def work(session: Session) -> int:
            if timeline.id is None:
                row = FailoverTimeline(**values, wall_time=datetime.now(UTC))
                session.add(row)
                session.flush()
                timeline.id = row.id
                return row.id
            session.execute(update(FailoverTimeline).where(
                FailoverTimeline.id == timeline.id).values(**values))
            return timeline.id
        return work

    def _unusable(self, endpoint: str) -> str | None:
        """Why ``endpoint`` cannot be a spare now (None: it can)."""
        if self.lab.placement(endpoint) is not None and any(
                endpoint in s.members for s in self.jobs.values() if s.status in ACTIVE):
            return "already in a running job"
        return self._member_problem(endpoint, spare=True)

    async def _heal(self, state: JobState, failure: Failure) -> None:
        """A degraded job, once something came back: every member usable again, it is
        restarted where it is (a recovery with trigger ``member-back``); a member still
        down, it is recovered onto a spare that is usable now; otherwise it stays
        degraded, and nothing is recorded."""
        state.healing = False
        if state.status != "degraded":
            return
        down = [m for m in state.members if self._member_problem(m) is not None]
        if down:
            if any(self._unusable(s) is None for s in state.spares):
                where = self.lab.placement(down[0])
                await self._recover(state, Failure(
                    state.entry.id, down[0], where[0].id if where else "",
                    where[1] if where else None, "spare-back",
                    [f"a spare is usable again ({failure.reasons[0]})"], None, None,
                    failure.detected_ns))
            return
        timeline = Timeline(state.entry.id, "member-back",
                            ", ".join(sorted(state.failed)) or "every member",
                            failure.host, None, failure.reasons,
                            {"failure": None, "reported": None,
                             "detected": failure.detected_ns})
        state.status = "recovering"
        self.store.run_write_nowait(self._saving(timeline))
        state.new_run()
        timeline.epoch = state.epoch
        now = time.monotonic_ns()
        problem = await self._restart(state, timeline, [], self._hosts_of(state.members),
                                      now, now)
        if problem is not None:
            await self._finish(state, timeline, *problem, status="degraded")
        else:
            state.failed.clear()
            await self._finish(state, timeline, "recovered", "every member is back: the job "
                               "was restarted where it ran", status="running")

    def _member_problem(self, endpoint: str, *, spare: bool = False) -> str | None:
        """Why ``endpoint`` cannot run a rank now (None: it can): its host is not online,
        or its GPU failed; for a ``spare``, its GPU must be reported healthy."""
        where = self.lab.placement(endpoint)
        if where is None:
            return "no NIC of a host"
        host, gpu = where
        seen = self.hosts.hosts.get(host.id)
        if seen is None or seen.status != "online":
            return f"host {host.id} is {seen.status if seen else 'unknown'}"
        health = seen.gpu_health(gpu)
        if health == "failed" or (spare and health != "healthy"):
            return f"GPU {gpu} of {host.id} is {health or 'not reported'}"
        return None

    async def _recover(self, state: JobState, failure: Failure) -> None:
        if failure.trigger == "member-back":
            await self._heal(state, failure)
            return
        timeline = Timeline(state.entry.id, failure.trigger, failure.member, failure.host,
                            failure.gpu, failure.reasons,
                            {"failure": failure.failure_ns, "reported": failure.reported_ns,
                             "detected": failure.detected_ns})
        if failure.member not in state.members:
            await self._finish(state, timeline, "skipped",
                               f"{failure.member} had already been replaced")
            return
        if failure.member in state.failed and failure.trigger not in ("spare-returned",
                                                                       "spare-back"):
            return  # another report of a failure already recorded
        if state.entry.recovery == "off":
            await self._finish(state, timeline, "recorded", "recovery is off for this job",
                               status="degraded")
            return
        before = state.status
        state.status = "recovering"
        # Recorded as it starts, without waiting (the swap is on the critical path): its
        # id is known to whoever follows it, and a daemon that dies in it leaves a trace.
        self.store.run_write_nowait(self._saving(timeline))
        plan, rejected = choose_spare(self.lab, self.engine, state.entry, state.members,
                                      failure.member, state.spares, self._unusable)
        timeline.rejected = rejected
        if plan is None:
            why = "; ".join(f"{k}: {v}" for k, v in rejected.items()) or "the job has none"
            await self._finish(state, timeline, "no-spare", f"no usable spare ({why})",
                               status="degraded")
            return
        timeline.plan = plan.describe()
        if state.entry.recovery == "ask":
            await self._save(timeline)
            timeline.outcome = "awaiting-operator"
            state.pending = timeline
            state.decision = asyncio.get_running_loop().create_future()
            self._publish(timeline)
            self.hub.publish("job.state", state.as_dict())
            try:
                approved = await state.decision
            finally:
                state.pending, state.decision = None, None
            if not approved:
                await self._finish(state, timeline, "declined", "the operator declined the swap",
                                   status="degraded" if before != "idle" else before)
                return
        state.incoming = plan.spare
        self._stage(timeline, "spare_chosen", time.monotonic_ns())
        try:
            await self._rewire(state, timeline, plan)
        finally:
            state.incoming = None

    async def _rewire(self, state: JobState, timeline: Timeline, plan: Replacement) -> None:
        # The restart waits for the switches' acknowledgements and the NIC links, not for
        # light verification (a meter's log completes only at the end of its window): that
        # runs alongside and its stage is recorded when it ends.
        acked: dict[str, int] = {}
        all_acked = asyncio.Event()

        def on_ack(switch: str, at: int) -> None:
            acked[switch] = at
            if len(acked) == len(plan.targets):
                all_acked.set()

        dispatched = time.monotonic_ns()
        rewiring: asyncio.Future[list[Result]] = asyncio.ensure_future(asyncio.gather(*(
            self.engine.reconfigure(name, replace=target, cause="recovery",
                                    on_acknowledged=on_ack)
            for name, target in plan.targets.items())))
        waiting: asyncio.Future[Any] = asyncio.ensure_future(all_acked.wait())
        try:
            await asyncio.wait([rewiring, waiting], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not all_acked.is_set():  # a switch refused, or the request itself did
            await self._rewiring_failed(state, timeline, rewiring, acked)
            return
        self._stage(timeline, "switches_acked", max(acked.values()))
        # The switches hold the new circuits: from here on the job's members are the new
        # ones, whatever comes next.
        state.members = plan.members
        state.spares = [s for s in state.spares if s != plan.spare]
        # Kept without waiting: the restart is on the failover's critical path.
        self.store.run_write_nowait(self._pool_write(state))
        state.new_run()
        timeline.epoch = state.epoch
        try:
            problem = await self._restart(state, timeline, plan.made,
                                          self._hosts_of(plan.members) | {timeline.host},
                                          dispatched, max(acked.values()))
        finally:
            results = await rewiring
        light = [t for r in results if (t := r.phases.get("light")) is not None]
        if light:
            self._stage(timeline, "light_verified", max(light))
        dark = "; ".join(f"{r.switch}: {r.error}" for r in results if r.outcome != "ok")
        if dark:
            await self._finish(state, timeline, "failed", dark, status="degraded")
        elif problem is not None:
            await self._finish(state, timeline, *problem, status="degraded")
        else:
            await self._finish(state, timeline, "recovered", status="running")

    async def _rewiring_failed(self, state: JobState, timeline: Timeline,
                               rewiring: asyncio.Future[list[Result]],
                               acked: dict[str, int]) -> None:
        try:
            results = await rewiring
            detail = "; ".join(f"{r.switch}: {r.error}" for r in results
                               if r.outcome == "failed")
        except LabdError as exc:
            detail = f"rewiring refused: {exc}"
        if acked:
            self._stage(timeline, "switches_acked", max(acked.values()))
        # Members stay as they were; a switch that did change while another refused is
        # reported as drift by the engine's read-back.
        await self._finish(state, timeline, "failed", detail, status="degraded")

    async def _restart(self, state: JobState, timeline: Timeline, made: list[CircuitRoute],
                       hosts: set[str], dispatched: int, acked: int
                       ) -> tuple[str, str] | None:
        """Wait for the links of the circuits ``made``, restart the job on ``hosts``, follow
        it to its first step; (outcome, detail) if that did not happen."""
        try:
            links = await self._wait_for(lambda: self._links_up(made, dispatched, acked),
                                         state.entry.link_timeout_s)
        except TimeoutError:
            return "timeout", (f"the new circuits' NIC links did not come up within "
                               f"{state.entry.link_timeout_s:g} s")
        if links > 0:
            self._stage(timeline, "links_up", links)
        try:
            await self._command(state, hosts, "start")
        except LabdError as exc:
            return "failed", f"restart not sent: {exc}"
        world = len(state.members)
        try:
            for stage, progress in (("job_restarted", "started"),
                                    ("collectives_ready", "ready"), ("first_step", "step")):
                at = await self._wait_for(partial(self._all_ranks, state, progress, world),
                                          state.entry.start_timeout_s)
                self._stage(timeline, stage, at)
        except TimeoutError:
            return "timeout", (f"the restarted job did not reach its first step within "
                               f"{state.entry.start_timeout_s:g} s")
        except JobError as exc:
            return "failed", str(exc)
        return None

    def _links_up(self, made: list[CircuitRoute], dispatched: int, acked: int) -> int | None:
        """When every receiving NIC of a new circuit was up (0: none of them reports its
        link, so there is nothing to wait for); None while one is still down. A link that
        came up after the switches were told counts from then; one seen up all along, from
        the acknowledgement (the earliest moment it is known to carry the new circuit)."""
        latest = 0
        for route in made:
            where = self.lab.placement(route.dst)
            host = self.hosts.hosts.get(where[0].id) if where else None
            if host is None or route.dst not in host.nics:
                continue
            if not host.nics[route.dst]:
                return None
            changed = host.to_daemon_clock(host.nic_since_ns.get(route.dst))
            latest = max(latest, changed if changed is not None and changed >= dispatched
                         else acked)
        return latest

    @staticmethod
    def _all_ranks(state: JobState, progress: str, world: int) -> int | None:
        """When the last rank reached ``progress``; None while one has not. A rank that
        exited before reaching it fails the wait."""
        times = []
        for rank in range(world):
            seen = state.progress.get(rank, {})
            if progress not in seen and "exited" in seen:
                raise JobError(f"rank {rank} exited before it was {progress}")
            times.append(seen.get(progress))
        if any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)
