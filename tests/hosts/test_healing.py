"""A degraded job heals by itself: a ring job whose member died with no spare to take its
place runs again once the member's host is back (restarted where it ran), or once a spare
is back (recovered onto it), each recorded as a recovery with an event. Real agents over a
real broker, emulated GPUs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from labd import deadlines
from labd.emulation.drill import hosts_ready, job_stepping, wait_for
from labd.emulation.emulators import EmulatedHost
from labd.emulation.rig import Rig
from labd.events import Event
from tests import labs
from tests.broker import MQTT
from tests.rigs import StartRig


def host(rig: Rig, name: str) -> EmulatedHost:
    return next(h for h in rig.hosts if h.id == name)


async def lost(rig: Rig, name: str) -> None:
    """Kill the host (its heartbeats stop) and wait until the daemon has declared it lost."""
    await host(rig, name).kill()
    await wait_for(rig.daemon.hub, lambda: rig.daemon.hosts.hosts[name].status == "lost",
                   deadlines.current().times(20), f"host {name} declared lost")


@pytest.fixture
async def degraded(start_rig: StartRig) -> AsyncIterator[tuple[Rig, list[Event]]]:
    """ring4 running, then both spares and member h1 dead: no spare, the job degraded."""
    async with start_rig("heal", labs.ring_lab(), mqtt=MQTT) as rig:
        daemon = rig.daemon
        seen: list[Event] = []
        daemon.hub.observe(seen.append)
        await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online",
                       "every host online")
        await daemon.jobs.start_job("ring4")
        await wait_for(daemon.hub, lambda: job_stepping(daemon, "ring4"), "first_step",
                       "the first step")
        await lost(rig, "s0")
        await lost(rig, "s1")
        await lost(rig, "h1")
        await wait_for(daemon.hub, lambda: daemon.jobs.job("ring4").status == "degraded",
                       deadlines.current().times(20), "ring4 degraded")
        outcomes = [e.data["outcome"] for e in seen if e.kind == "failover"
                    and e.data["outcome"] != "in-progress"]
        assert outcomes == ["no-spare"], outcomes
        yield rig, seen


def finished(seen: list[Event], trigger: str) -> Any:
    return next((e.data for e in seen if e.kind == "failover" and e.data["trigger"] == trigger
                 and e.data["outcome"] not in ("in-progress",)), None)


async def test_a_degraded_job_runs_again_when_its_member_comes_back(
        degraded: tuple[Rig, list[Event]]) -> None:
    rig, seen = degraded
    daemon = rig.daemon
    epoch = daemon.jobs.job("ring4").epoch
    host(rig, "h1").revive()
    healed = await wait_for(daemon.hub, lambda: finished(seen, "member-back"),
                            deadlines.current().times(30), "the job healed")
    assert healed["outcome"] == "recovered", healed
    assert healed["member"] == "h1.nic0"
    job = daemon.jobs.job("ring4")
    assert job.status == "running" and job.epoch == epoch + 1
    assert job.members == ["h0.nic0", "h1.nic0", "h2.nic0", "h3.nic0"]
    assert job_stepping(daemon, "ring4")
    # Told as it happened: the job's state went back to running with the new epoch.
    states = [e.data["status"] for e in seen if e.kind == "job.state"]
    assert states[-1] == "running"


async def test_a_degraded_job_recovers_onto_a_spare_that_comes_back(
        degraded: tuple[Rig, list[Event]]) -> None:
    rig, seen = degraded
    daemon = rig.daemon
    host(rig, "s0").revive()
    healed = await wait_for(daemon.hub, lambda: finished(seen, "spare-back"),
                            deadlines.current().times(30), "the job recovered onto s0")
    assert healed["outcome"] == "recovered", healed
    assert healed["member"] == "h1.nic0" and healed["plan"]["spare"] == "s0.nic0"
    job = daemon.jobs.job("ring4")
    assert job.status == "running" and "s0.nic0" in job.members
    assert "h1.nic0" not in job.members
