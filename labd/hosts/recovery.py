"""A job's recovery: when a member fails (a GPU verdict turns ``failed``, or its host is
lost), the daemon swaps in a spare through the optical fabric and restarts the job with the
new rank map, timing every stage:

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
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from labd.errors import BusError, JobError, LabdError
from labd.events import EventHub
from labd.fabric.engine import Engine, Result
from labd.hosts.commands import JobCommands
from labd.hosts.jobstate import Failure, JobState, Timeline, keep
from labd.hosts.monitor import HostMonitor
from labd.hosts.spares import Replacement, choose_spare
from labd.lab.loader import Lab
from labd.lab.wiring import CircuitRoute
from labd.store.pools import save_timeline
from labd.store.writer import Store
from labd.vocabulary import ACTIVE, STAGES, EventKind

log = logging.getLogger(__name__)

RESEND_INTERVALS = 3
"""Heartbeat intervals between a restart's looks for hosts that did not get it."""
SEND_RETRY_S = 1.0
"""Between tries of a restart that the broker did not take (within ``start_timeout_s``)."""


class Recovery:
    """Each job's recovery worker: it takes the job's failures in turn and swaps in a
    spare, or restarts the job where it ran once every member is back."""

    def __init__(self, lab: Lab, engine: Engine, hosts: HostMonitor, hub: EventHub,
                 store: Store, commands: JobCommands, jobs: dict[str, JobState]) -> None:
        self.lab, self.engine, self.hosts, self.hub, self.store = lab, engine, hosts, hub, store
        self.commands, self.jobs = commands, jobs

    async def run(self) -> None:
        """Each job's recovery worker, until cancelled."""
        async with asyncio.TaskGroup() as workers:
            for state in self.jobs.values():
                workers.create_task(self._worker(state), name=f"labd-recovery-{state.entry.id}")

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
                self.hub.publish(EventKind.WARNING, {"detail": (
                    f"recovery of job {state.entry.id} stopped by an internal error: "
                    f"{exc!r}")})
                state.status = "degraded"

    def _publish(self, timeline: Timeline) -> None:
        self.hub.publish(EventKind.FAILOVER, timeline.as_dict())

    def _stage(self, timeline: Timeline, stage: str, at: int | None) -> None:
        timeline.stages[stage] = at
        self._publish(timeline)

    async def _finish(self, state: JobState, timeline: Timeline, outcome: str, detail: str = "",
                      status: str | None = None) -> None:
        timeline.outcome, timeline.detail = outcome, detail
        if status is not None:
            state.status = status
        if outcome not in ("skipped", "recovered") and timeline.member in state.members:
            state.failed.add(timeline.member)  # still in the job, and still failed
        else:  # replaced, or (a heal) back and running: its next failure is a new one
            state.failed.discard(timeline.member)
        if status is not None:
            self.store.run_write_nowait(keep(state))
        await self._save(timeline)
        self._publish(timeline)
        self.hub.publish(EventKind.JOB_STATE, state.as_dict())

    async def close(self, timeline: Timeline) -> None:
        """Record ``timeline``'s outcome as it is set, and say so (a ``failover`` event)."""
        await self._save(timeline)
        self._publish(timeline)

    async def _save(self, timeline: Timeline) -> None:
        timeline.id = await self.store.run_write(self._saving(timeline))

    def _saving(self, timeline: Timeline) -> Callable[..., int]:
        """The store write that keeps the timeline as it is now."""
        return save_timeline(timeline, {
            "job": timeline.job, "outcome": timeline.outcome,
            "stages": {k: timeline.stages.get(k) for k in STAGES},
            "trigger": timeline.trigger, "detail": timeline.row_detail()})

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
        problem = await self._restart(state, timeline, [], self.commands.hosts_of(state.members),
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

    async def _take_up(self, state: JobState, failure: Failure, timeline: Timeline) -> bool:
        """A recovery the leader before stopped in, carried on under its record: its
        member still the only one down, it goes on as a recovery (True); every member
        usable (the swap was made, or the member came back), the job is restarted where
        it is now, since its ranks may run any run or none; else the record is closed and
        what is down is recovered anew."""
        timeline.reasons = [*timeline.reasons, "taken up at a takeover"]
        if state.status not in ACTIVE:
            await self._finish(state, timeline, "failed",
                               f"cut off by a leader change; the job is {state.status}")
            return False
        down = [m for m in state.members if self._member_problem(m) is not None]
        if down == [timeline.member] and timeline.trigger != "member-back":
            timeline.stages["detected"] = failure.detected_ns
            return True
        if down:
            await self._finish(state, timeline, "failed", (
                f"cut off by a leader change; {', '.join(down)} "
                f"{'is' if len(down) == 1 else 'are'} down, recovered anew"))
            if timeline.member in down:  # resume() left it to this record
                state.failed.discard(timeline.member)  # not dealt with: a new failure
                state.queue.put_nowait(Failure(
                    state.entry.id, timeline.member, timeline.host, timeline.gpu,
                    timeline.trigger, failure.reasons, failure.failure_ns,
                    failure.reported_ns, failure.detected_ns))
            return False
        state.status = "recovering"
        self._publish(timeline)
        state.new_run()
        timeline.epoch = state.epoch
        now = time.monotonic_ns()
        problem = await self._restart(state, timeline, [], self.commands.hosts_of(state.members),
                                      now, now)
        if problem is not None:
            await self._finish(state, timeline, *problem, status="degraded")
        else:
            await self._finish(state, timeline, "recovered", (
                "taken up at a takeover: every member usable, the job was restarted on "
                f"{', '.join(state.members)}"), status="running")
        return False

    async def _recover(self, state: JobState, failure: Failure) -> None:
        if failure.taken is not None:
            timeline = failure.taken
            if not await self._take_up(state, failure, timeline):
                return
        elif failure.trigger == "member-back":
            await self._heal(state, failure)
            return
        else:
            timeline = Timeline(state.entry.id, failure.trigger, failure.member, failure.host,
                                failure.gpu, failure.reasons,
                                {"failure": failure.failure_ns,
                                 "reported": failure.reported_ns,
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
            self.hub.publish(EventKind.JOB_STATE, state.as_dict())
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
        self.store.run_write_nowait(keep(state))
        state.new_run()
        timeline.epoch = state.epoch
        try:
            problem = await self._restart(state, timeline, plan.made,
                                          self.commands.hosts_of(plan.members) | {timeline.host},
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
            links = await self.commands.wait_for(lambda: self._links_up(made, dispatched, acked),
                                         state.entry.link_timeout_s)
        except TimeoutError:
            return "timeout", (f"the new circuits' NIC links did not come up within "
                               f"{state.entry.link_timeout_s:g} s")
        if links > 0:
            self._stage(timeline, "links_up", links)
        world = len(state.members)
        sent: int | None = None
        # One deadline for the whole restart, as the lab file says: its first step within
        # start_timeout_s of the links, however many tries the start took.
        try:
            async with asyncio.timeout(state.entry.start_timeout_s):
                sent = await self._send_start(state, hosts)
                at = await self._started(state, hosts, sent, world)
                self._stage(timeline, "job_restarted", at)
                for stage, progress in (("collectives_ready", "ready"),
                                        ("first_step", "step")):
                    at = await self.commands.wait_for(
                        partial(self._all_ranks, state, progress, world),
                        state.entry.start_timeout_s)
                    self._stage(timeline, stage, at)
        except TimeoutError:
            if sent is None:
                return "failed", (f"restart not sent within {state.entry.start_timeout_s:g} s: "
                                  "the broker did not take it")
            return "timeout", (f"the restarted job did not reach its first step within "
                               f"{state.entry.start_timeout_s:g} s")
        except JobError as exc:
            return "failed", str(exc)
        except LabdError as exc:
            return "failed", f"restart not sent: {exc}"
        return None

    async def _send_start(self, state: JobState, hosts: set[str]) -> int:
        """Send the start to ``hosts``; when it was sent. The broker gone in the send (or
        away), it is tried again every SEND_RETRY_S: the agents come back to it, and so
        does the daemon."""
        while True:
            try:
                await self.commands.command(state, hosts, "start")
                return time.monotonic_ns()
            except BusError as exc:
                log.warning("job %s: restart not sent (%s); trying again", state.entry.id,
                            exc, extra={"job": state.entry.id})
                await asyncio.sleep(SEND_RETRY_S)

    async def _started(self, state: JobState, hosts: set[str], sent: int, world: int) -> int:
        """When the last rank started. A host whose heartbeats, sent since the start was,
        show it does not run the start (the broker acknowledged the command and died
        before delivering it) is sent it again, every few heartbeat intervals: an agent
        takes a start it runs already as a repeat."""
        check = partial(self._all_ranks, state, "started", world)
        while True:
            every = RESEND_INTERVALS * max(
                [h.interval_s or 1.0 for n in hosts if (h := self.hosts.hosts.get(n))]
                or [1.0])
            with contextlib.suppress(TimeoutError):
                return await self.commands.wait_for(check, every)
            unheard = {n for n in hosts if self._not_running(n, state, sent)}
            if unheard:
                log.warning("job %s: %s did not get its start (run %s); sending it again",
                            state.entry.id, ", ".join(sorted(unheard)), state.run,
                            extra={"job": state.entry.id})
                with contextlib.suppress(LabdError):  # tried again at the next round
                    await self.commands.command(state, unheard, "start")

    def _not_running(self, host: str, state: JobState, sent: int) -> bool:
        """Whether ``host``'s agent said, in a heartbeat sent after ``sent``, that it does
        not run the job's current start (an agent that does not say is not judged)."""
        seen = self.hosts.hosts.get(host)
        if seen is None or seen.jobs is None or seen.jobs_sent_ns is None or \
                seen.jobs_sent_ns <= sent or seen.status != "online":
            return False
        return not any(r["job"] == state.entry.id and r["run"] == state.run
                       for r in seen.jobs)

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
