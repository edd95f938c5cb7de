"""Recovery on the in-memory link (tests/memory_rig.py): the daemon's own code end to end,
the engine, the host monitor, the job manager and its recovery workers, with only the broker
and the agents' processes replaced by calls in this process. The emulated switch and meter
are reached by their drivers over ``memory://``; the hosts' agents are
:class:`tests.memory_rig.MemoryAgents`, which hand the monitor the bytes an agent would
publish and answer the daemon's job commands as an agent does. Checked against the
emulators' ground truth and the commands the agents were sent. The socket paths are
tests/hosts/test_failover.py's and test_healing.py's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from labd import deadlines
from labd.emulation.drill import wait_for
from labd.hosts.jobs import JobManager
from labd.hostwire import JobCommand, JobProgress
from labd.lab.wiring import trace_circuit
from tests.labs import ring_lab
from tests.memory_rig import JobsBench, memory_engine, memory_jobs

RING = ["h0.nic0", "h1.nic0", "h2.nic0", "h3.nic0"]


def within(seconds: float) -> float:
    return deadlines.current().times(seconds)


def stepping(side: JobsBench) -> bool:
    state = side.jobs.job("ring4")
    return state.status == "running" and all(
        "step" in state.progress.get(rank, {}) for rank in range(len(state.members)))


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[JobsBench]:
    """ring4 (tests.labs.ring_lab) started, every rank past its first step."""
    async with memory_engine(tmp_path, ring_lab(), tag="ring", light_window_s=0.1) as bench, \
            memory_jobs(bench) as side:
        # Its light is not what these tests look at: only the recoveries' is verified.
        await side.jobs.start_job("ring4", verify_light=False)
        await wait_for(bench.hub, lambda: stepping(side), within(5), "the first step")
        yield side


def finished(side: JobsBench, member: str, trigger: str | None = None
             ) -> Callable[[], dict[str, Any] | None]:
    """A check for wait_for: the finished timeline of ``member``'s recovery."""
    def check() -> dict[str, Any] | None:
        return next((e.data for e in side.bench.events if e.kind == "failover"
                     and e.data["member"] == member
                     and (trigger is None or e.data["trigger"] == trigger)
                     and e.data["outcome"] not in ("in-progress", "awaiting-operator")), None)
    return check


def starts(side: JobsBench, since: int = 0) -> list[tuple[str, JobCommand]]:
    return [(h, c) for h, c in side.agents.commands[since:] if c.action == "start"]


def ring_holds(side: JobsBench, members: list[str]) -> None:
    lab, engine = side.bench.lab, side.bench.engine
    for src, dst in lab.job[0].links(members):
        assert trace_circuit(lab, src, dst, engine.intended) is not None, (src, dst)
    assert len(engine.intended["ocs1"]) == len(members)  # one circuit per link, nothing else
    assert side.bench.circuits("ocs1") == engine.intended["ocs1"]  # the device's truth


async def test_a_failed_gpu_is_replaced_by_the_spare_in_its_rack(tmp_path: Path) -> None:
    async with running(tmp_path) as side:
        bench, state = side.bench, side.jobs.job("ring4")
        before, old_run = state.epoch, state.run
        sent, seq = len(side.agents.commands), bench.emulated.truth("ocs1")["changes"][-1]["seq"]
        failed_at = side.agents.fail_gpu("h1", 0, "xid 79")
        timeline = await wait_for(bench.hub, finished(side, "h1.nic0"), within(5),
                                  "the recovery")
        assert timeline["outcome"] == "recovered", timeline
        assert timeline["trigger"] == "gpu-failed" and timeline["reasons"] == ["xid 79"]
        # The spare in the failed member's rack won (both are one hop away).
        assert timeline["plan"]["spare"] == "s0.nic0"
        assert timeline["rejected"] == {"s1.nic0": "passed over: 2 switch hops, another rack"}
        assert state.members == ["h0.nic0", "s0.nic0", "h2.nic0", "h3.nic0"]
        assert state.spares == ["s1.nic0"] and state.status == "running"
        assert state.epoch == before + 1 == timeline["epoch"] and state.run != old_run
        ring_holds(side, state.members)

        # The stages, in order, against the ground truth.
        stages = timeline["stages"]
        assert failed_at <= stages["failure"] <= stages["reported"] <= stages["detected"] \
            <= stages["spare_chosen"]
        truth = bench.emulated.truth("ocs1", seq)
        (change,) = truth["changes"]  # one command moved both circuits
        assert stages["spare_chosen"] <= change["arrived_ns"]
        assert change["settled_ns"] <= stages["switches_acked"]
        assert stages["light_verified"] is not None
        assert change["arrived_ns"] <= stages["light_verified"]
        # The new circuits' receivers (s0 from h0, h2 from s0) lit, by the optical model;
        # their links came up after that.
        lit = max(c["at_ns"] for c in bench.emulated.light()
                  if c["node"] in ("s0.nic0", "h2.nic0") and c["direction"] == "rise"
                  and c["at_ns"] >= change["arrived_ns"])
        assert lit <= stages["links_up"] <= stages["job_restarted"] \
            <= stages["collectives_ready"] <= stages["first_step"]

        # The restart: the new rank map, a new epoch and run, to every host of the new
        # ring and to the failed member's (which stops its rank).
        restarts = starts(side, sent)
        assert sorted(h for h, _ in restarts) == ["h0", "h1", "h2", "h3", "s0"]
        for _, command in restarts:
            assert (command.epoch, command.run) == (state.epoch, state.run)
            assert [r.endpoint for r in command.ranks] == state.members
        assert stepping(side)

        # Kept: what a restarted daemon reloads.
        assert timeline["id"] is not None
        again = JobManager(bench.lab, bench.engine, side.hosts, bench.hub, bench.store, None)
        await again.load()
        assert again.job("ring4").members == state.members
        assert again.job("ring4").spares == ["s1.nic0"]


@contextlib.asynccontextmanager
async def degraded(tmp_path: Path) -> AsyncIterator[JobsBench]:
    """ring4 running, then both spares and member h1 lost: no spare, the job degraded."""
    async with running(tmp_path) as side:
        side.agents.lose("s0")
        side.agents.lose("s1")
        side.agents.lose("h1")
        timeline = await wait_for(side.bench.hub, finished(side, "h1.nic0"), within(5),
                                  "the recovery of h1")
        assert timeline["trigger"] == "host-lost" and timeline["outcome"] == "no-spare"
        yield side


async def test_no_usable_spare_leaves_the_job_degraded(tmp_path: Path) -> None:
    async with degraded(tmp_path) as side:
        bench, state = side.bench, side.jobs.job("ring4")
        (timeline,) = [e.data for e in bench.events if e.kind == "failover"
                       and e.data["outcome"] != "in-progress"]
        assert "no usable spare" in timeline["detail"]
        assert timeline["rejected"] == {"s0.nic0": "host s0 is offline",
                                        "s1.nic0": "host s1 is offline"}
        assert state.status == "degraded" and state.epoch == 1
        assert state.members == RING and state.spares == ["s0.nic0", "s1.nic0"]
        ring_holds(side, RING)  # nothing moved
        assert timeline["stages"]["spare_chosen"] is None
        assert len(starts(side)) == 4  # the first start alone: no restart was sent
        assert [e.data["status"] for e in bench.events if e.kind == "job.state"][-1] == \
            "degraded"


async def test_a_degraded_job_runs_again_when_its_member_comes_back(tmp_path: Path) -> None:
    async with degraded(tmp_path) as side:
        bench, state = side.bench, side.jobs.job("ring4")
        epoch, sent = state.epoch, len(side.agents.commands)
        side.agents.revive("h1")
        healed = await wait_for(bench.hub, finished(side, "h1.nic0", "member-back"),
                                within(5), "the job healed")
        assert healed["outcome"] == "recovered", healed
        assert state.status == "running" and state.epoch == epoch + 1 == healed["epoch"]
        assert state.members == RING
        ring_holds(side, RING)
        # Restarted where it ran: every member's host told the new run.
        restarts = starts(side, sent)
        assert sorted(h for h, _ in restarts) == ["h0", "h1", "h2", "h3"]
        assert {(c.epoch, c.run) for _, c in restarts} == {(state.epoch, state.run)}
        assert stepping(side)
        assert [e.data["status"] for e in bench.events if e.kind == "job.state"][-1] == \
            "running"


async def test_a_degraded_job_recovers_onto_a_spare_that_comes_back(tmp_path: Path) -> None:
    async with degraded(tmp_path) as side:
        bench, state = side.bench, side.jobs.job("ring4")
        side.agents.revive("s0")
        healed = await wait_for(bench.hub, finished(side, "h1.nic0", "spare-back"),
                                within(5), "the job recovered onto s0")
        assert healed["outcome"] == "recovered", healed
        assert healed["plan"]["spare"] == "s0.nic0"
        assert state.status == "running" and state.spares == ["s1.nic0"]
        assert state.members == ["h0.nic0", "s0.nic0", "h2.nic0", "h3.nic0"]
        ring_holds(side, state.members)
        assert stepping(side)


async def test_a_member_that_came_back_is_recovered_when_it_fails_again(
        tmp_path: Path) -> None:
    """A heal (member-back) names the member that came back; once the job runs again
    that member is no longer known failed, or its next failure would be dropped as one
    already recorded (no recovery, no event, the job left running)."""
    async with degraded(tmp_path) as side:
        bench, state = side.bench, side.jobs.job("ring4")
        side.agents.revive("h1")
        await wait_for(bench.hub, finished(side, "h1.nic0", "member-back"), within(5),
                       "the job healed")
        assert state.status == "running"
        assert state.failed == set()  # no member is known failed any more
        side.agents.revive("s0")
        side.agents.fail_gpu("h1", 0, "xid 79")
        timeline = await wait_for(bench.hub, finished(side, "h1.nic0", "gpu-failed"),
                                  within(2), "the recovery of h1's GPU")
        assert timeline["outcome"] == "recovered" and timeline["plan"]["spare"] == "s0.nic0"


async def test_the_old_runs_last_words_under_a_reused_epoch_are_ignored(tmp_path: Path) -> None:
    """A new leader starts from the epoch its predecessor last kept, so a restart can reuse
    the epoch of the run it stops: that run's ``exited`` reports (same epoch, its own run)
    must not pass for the new run's, which would fail the recovery."""
    async with running(tmp_path) as side:
        state = side.jobs.job("ring4")
        old_run = state.run
        state.epoch -= 1  # as a new leader would have it
        side.agents.fail_gpu("h1", 0, "xid 79")
        timeline = await wait_for(side.bench.hub, finished(side, "h1.nic0"), within(5),
                                  "the recovery")
        assert timeline["outcome"] == "recovered", timeline
        assert timeline["epoch"] == state.epoch == 1 and state.run != old_run
        stale = [m for _, m in side.agents.sent if isinstance(m, JobProgress)
                 and (m.epoch, m.run, m.progress) == (state.epoch, old_run, "exited")]
        assert len(stale) == 4  # every rank of the old run said so, under the new epoch
        assert all("exited" not in seen for seen in state.progress.values())
        assert stepping(side)
