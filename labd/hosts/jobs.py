"""Jobs: the daemon starts a job (its circuits, then its ranks on the hosts' agents), stops
it, keeps its pool of spares, and follows what its hosts report: a member's failure is
queued for its recovery (labd.hosts.recovery), progress and links wake the recoveries that
wait for them, and a degraded job heals by itself when a host comes back online or a GPU
healthy.
"""

from __future__ import annotations

import time
from typing import Any

from labd.errors import JobError, UnknownJob
from labd.events import EventHub
from labd.fabric.engine import Engine
from labd.hosts.commands import JobCommands
from labd.hosts.jobstate import (
    Failure,
    JobState,
    SendToHost,
    Timeline,
    cut_off,
    keep,
    since_failure_ms,
)
from labd.hosts.monitor import HostListener, HostMonitor
from labd.hosts.recovery import Recovery
from labd.hosts.state import HostState
from labd.hostwire import GpuHealth, JobProgress, NicLink
from labd.lab.loader import Lab
from labd.lab.wiring import trace_circuit
from labd.store.pools import load_pools, open_timelines
from labd.store.writer import Store
from labd.vocabulary import ACTIVE, EventKind

__all__ = ["Failure", "JobManager", "JobState", "SendToHost", "Timeline", "since_failure_ms"]


class JobManager(HostListener):
    def __init__(self, lab: Lab, engine: Engine, hosts: HostMonitor, hub: EventHub,
                 store: Store, send: SendToHost | None) -> None:
        self.lab, self.engine, self.hosts, self.hub, self.store = lab, engine, hosts, hub, store
        self.jobs = {j.id: JobState(j, list(j.members), list(j.spares)) for j in lab.job}
        self.commands = JobCommands(lab, hosts, send)
        self.recovery = Recovery(lab, engine, hosts, hub, store, self.commands, self.jobs)
        # By id: every GPU event looks its host up (a pod's start-up is thousands of them).
        self._host_entries = {h.id: h for h in lab.host}
        self.acting = True
        """False on a standby (``--ha``): host reports are not acted on (the leader does),
        until :meth:`resume` at takeover looks at what happened meanwhile."""
        self._cut_off: list[Timeline] = []
        """Recoveries the daemon before this one stopped in (a leader change), read at the
        takeover's load, taken up by :meth:`resume`."""

    # -- lifecycle -------------------------------------------------------------------------
    async def load(self) -> None:
        """Members and spares as the last recovery or returned spare of each job left
        them (a store from before pools were kept: as the last recovery left them)."""
        timelines, pools = await self.store.read(load_pools)
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
                self.hub.publish(EventKind.WARNING, {"detail": (
                    f"job {pool.job}: the kept members and spares are not the lab file's "
                    "(it changed): starting from the lab file's")})
        cut = [cut_off(row.job, row.trigger, row.stages, row.detail, row.id)
               for row in await self.store.read(open_timelines) if row.job in self.jobs]
        if not self.acting:  # a takeover: resume() carries them on, the hosts heard
            self._cut_off = cut
            return
        # A start: the daemon that ran them is gone, and no one carries them on; a member
        # still failed is reported again by its host's heartbeats (a new recovery).
        for timeline in cut:
            timeline.outcome = "failed"
            timeline.detail = "cut off: the daemon stopped before the recovery ended"
            await self.recovery.close(timeline)

    async def run(self) -> None:
        """Each job's recovery worker, until cancelled (the daemon runs it among its
        background loops)."""
        await self.recovery.run()

    def resume(self) -> int:
        """At takeover (``--ha``): act from now on, and queue a recovery for each member of
        a running job that failed while this daemon stood by (its host offline or lost, its
        GPU failed: what the leader it replaces may not have dealt with). A member whose
        host was not heard yet is left to the watchdog. Returns how many were queued."""
        self.acting = True
        queued = 0
        now = time.monotonic_ns()
        # A recovery the leader before stopped in is carried on under its own record
        # (docs/reliability.md, "The run after"): whoever waits for its outcome gets one.
        taken: set[tuple[str, str]] = set()
        for timeline in self._cut_off:
            state = self.jobs[timeline.job]
            state.queue.put_nowait(Failure(
                timeline.job, timeline.member, timeline.host, timeline.gpu, timeline.trigger,
                timeline.reasons, timeline.stages.get("failure"),
                timeline.stages.get("reported"), now, taken=timeline))
            taken.add((timeline.job, timeline.member))
            queued += 1
        self._cut_off = []
        for state in self.jobs.values():
            if state.status not in ACTIVE:
                continue
            for member in state.members:
                if (state.entry.id, member) in taken:
                    continue  # its recovery is carried on
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


    def job(self, job_id: str) -> JobState:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise UnknownJob(f"no job {job_id!r}; jobs: "
                           f"{', '.join(self.jobs) or 'none'}") from None


    # -- starting and stopping -------------------------------------------------------------
    async def start_job(self, job_id: str, *, verify_light: bool = True) -> dict[str, Any]:
        """Make the job's missing circuits, then start its ranks (a new epoch)."""
        state = self.job(job_id)
        if state.status == "recovering":
            raise JobError(f"job {job_id!r} is recovering; wait for the recovery to end")
        self.commands.sender()  # before any circuit is made
        self.commands.ranks(state.members)  # every member must be on a host
        missing = [(s, d) for s, d in state.entry.links(state.members)
                   if trace_circuit(self.lab, s, d, self.engine.intended) is None]
        if missing:
            _, results = await self.engine.connect_endpoints(missing, cause="api",
                                                             verify_light=verify_light)
            bad = [r for r in results if r.outcome == "failed"]
            if bad:
                raise JobError(f"job {job_id!r} not started: {bad[0].switch}: {bad[0].error}")
        state.new_run()
        await self.commands.command(state, self.commands.hosts_of(state.members), "start")
        state.status = "running"
        await self.store.run_write(keep(state))
        self.hub.publish(EventKind.JOB_STATE, state.as_dict())
        return state.as_dict()

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        state = self.job(job_id)
        await self.commands.command(state, self.commands.hosts_of(state.members), "stop")
        state.status = "stopped"
        await self.store.run_write(keep(state))
        self.hub.publish(EventKind.JOB_STATE, state.as_dict())
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
            await self.store.run_write(keep(state))
        for member in sorted(state.failed):
            where = self.lab.placement(member)
            state.queue.put_nowait(Failure(
                state.entry.id, member, where[0].id if where else "", where[1] if where else None,
                "spare-returned", [f"{endpoint} returned to the spare pool"], None, None,
                time.monotonic_ns()))
        self.hub.publish(EventKind.JOB_STATE, state.as_dict())
        return state.as_dict()

    def decide(self, job_id: str, approve: bool) -> dict[str, Any]:
        """The operator's answer to a proposed swap (policy ``ask``)."""
        state = self.job(job_id)
        if state.decision is None or state.decision.done():
            raise JobError(f"job {job_id!r} has no recovery waiting for a decision")
        state.decision.set_result(approve)
        return state.as_dict()

    # -- following the hosts (HostListener) ------------------------------------------------
    def gpu_health(self, host: HostState, report: GpuHealth, at_ns: int) -> None:
        """A failed GPU's member is queued for recovery; a healthy one is usable again,
        and may let a degraded job run again."""
        if not self.acting:
            return
        if report.health == "healthy":
            self._heal_on(host.id, "GPU healthy", at_ns)
        entry = self._host_entries.get(host.id)
        if entry is None or not 0 <= report.gpu < len(entry.nics):
            return  # no job of ours runs on a GPU no fabric NIC serves
        endpoint = entry.nics[report.gpu]
        if report.health == "healthy":
            for state in self.jobs.values():  # a failed member that healed is usable
                state.failed.discard(endpoint)
        elif report.health == "failed":
            self._enqueue(endpoint, host.id, report.gpu, "gpu-failed", list(report.reasons),
                          host.to_daemon_clock(report.since_ns or report.at_ns),
                          host.to_daemon_clock(report.at_ns), at_ns)

    def host_status(self, host: HostState, was: str, at_ns: int) -> None:
        """A lost host's members are queued for recovery; one back online may let a
        degraded job run again."""
        if not self.acting:
            return
        if host.status == "online":
            self._heal_on(host.id, "online", at_ns)
        elif was == "online" and (entry := self._host_entries.get(host.id)) is not None:
            # The host was last known alive when it sent its last heartbeat.
            last = host.last_sent_ns or host.last_beat_ns
            for nic in entry.nics:
                self._enqueue(nic, host.id, None, "host-lost", [f"host {host.status}"],
                              last, None, at_ns)
        self.commands.wake()

    def nic_link(self, host: HostState, report: NicLink, at_ns: int) -> None:
        if self.acting:
            self.commands.wake()

    def job_progress(self, host: HostState, report: JobProgress, at_ns: int) -> None:
        if not self.acting:
            return
        state = self.jobs.get(report.job)
        if state is not None and report.epoch == state.epoch and \
                report.run in (None, "", state.run):  # else an earlier run winding down
            at = host.to_daemon_clock(report.at_ns) or time.monotonic_ns()
            seen = state.progress.setdefault(report.rank, {})
            # A rank reports in order; a later report dated before an earlier one is the
            # host's clock offset estimate getting better (a slow first delivery overstated
            # it), not time going back: the stages built from them stay in order.
            seen.setdefault(report.progress, max(at, *seen.values()) if seen else at)
        self.commands.wake()

    def _heal_on(self, host: str, what: str, at_ns: int) -> None:
        """A host back online, or a GPU healthy again, may let a degraded job run again:
        each such job gets a look (queued behind whatever its worker is doing)."""
        for state in self.jobs.values():
            if state.status == "degraded" and not state.healing and \
                    state.entry.recovery != "off":
                state.healing = True
                state.queue.put_nowait(Failure(state.entry.id, "", host, None, "member-back",
                                               [f"host {host} {what}"], None, None, at_ns))

    def _enqueue(self, member: str, host: str, gpu: int | None, trigger: str,
                 reasons: list[str], failure_ns: int | None, reported_ns: int | None,
                 detected_ns: int) -> None:
        for state in self.jobs.values():
            if (member in state.members or member == state.incoming) and \
                    state.status in ACTIVE:
                state.queue.put_nowait(Failure(state.entry.id, member, host, gpu, trigger,
                                               reasons, failure_ns, reported_ns, detected_ns))

