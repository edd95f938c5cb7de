"""Recovery end to end: emulated switches, meters and GPU hosts (real sockets, real agents
over the real broker, real job processes), the daemon swapping spares in; timelines checked
against the emulators' ground truth."""

import asyncio
import functools
import json
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import pytest
from sqlalchemy import select

from labd import deadlines
from labd.emulation.drill import hosts_ready, job_stepping, run_drill, wait_for
from labd.emulation.rig import Rig
from labd.errors import DrillError
from labd.hosts.jobs import JobManager
from labd.lab.wiring import trace_circuit
from labd.store.models import FailoverTimeline, JobPool
from labd.store.writer import Store
from tests.broker import BROKER, MQTT
from tests.labs import ring_lab
from tests.rigs import AUTH, StartRig


def within(seconds: float) -> float:
    """A test's own limit, on the suite's deadline scale (tests/conftest.py)."""
    return deadlines.current().times(seconds)


def bounded(seconds: float) -> Callable[[Callable[..., Awaitable[None]]],
                                        Callable[..., Awaitable[None]]]:
    """Fail a test that runs past ``seconds`` with the traceback of what it was awaiting
    (pytest-timeout's own limit is a backstop that shows less)."""
    def wrap(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(test)
        async def run(*args: Any, **kwargs: Any) -> None:
            async with asyncio.timeout(deadlines.current().times(seconds)):
                await test(*args, **kwargs)
        return run
    return wrap


async def running(rig: Rig) -> None:
    daemon = rig.daemon
    await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online", "every host online")
    await daemon.jobs.start_job("ring4")
    await wait_for(daemon.hub, lambda: job_stepping(daemon, "ring4"), "first_step",
                   "the first step")


def final(rig: Rig, member: str, seen: list[dict[str, Any]]) -> Any:
    """A check for wait_for: the finished timeline of ``member``'s recovery."""
    def check() -> dict[str, Any] | None:
        return next((t for t in seen if t["member"] == member and t["outcome"] not in (
            "in-progress", "awaiting-operator")), None)
    return check


def told(seen: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """What a failing test says of the recoveries it saw."""
    return [(t["member"], t["trigger"], t["outcome"], t["detail"]) for t in seen]


async def collect(rig: Rig, seen: list[dict[str, Any]]) -> None:
    _, sub = rig.daemon.hub.subscribe()
    try:
        while (event := await sub.next()) is not None:
            if event.kind == "failover":
                seen.append(event.data)
    finally:
        sub.close()


def circuits_hold_the_ring(rig: Rig, members: list[str]) -> None:
    daemon = rig.daemon
    entry = daemon.lab.job[0]
    for src, dst in entry.links(members):
        assert trace_circuit(daemon.lab, src, dst, daemon.engine.intended) is not None, (src, dst)
    # Nothing else: one circuit per link.
    assert len(daemon.engine.intended["ocs1"]) == len(members)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@bounded(50)
async def test_a_failed_gpu_is_replaced_by_a_spare_and_the_job_restarted(
        start_rig: StartRig) -> None:
    async with start_rig("fo", ring_lab(), mqtt=MQTT, token="t") as rig, \
            aiomqtt.Client(*BROKER) as watcher:
        lab = rig.daemon.lab
        assert rig.daemon.bus is not None
        await watcher.subscribe(f"{rig.daemon.bus.prefix}/events/failover")
        await running(rig)
        daemon = rig.daemon
        before = daemon.jobs.job("ring4").epoch
        result = await run_drill(rig, "ring4", random.Random(1), member="h1.nic0",
                                 timeout="recovery")
        timeline = result.timeline
        assert timeline["outcome"] == "recovered", timeline
        # The spare in the failed member's rack won (both are one hop away).
        assert timeline["plan"]["spare"] == "s0.nic0"
        assert timeline["rejected"] == {
            "s1.nic0": "passed over: 2 switch hops, another rack"}
        state = daemon.jobs.job("ring4")
        assert state.members == ["h0.nic0", "s0.nic0", "h2.nic0", "h3.nic0"]
        assert state.spares == ["s1.nic0"] and state.epoch == before + 1
        circuits_hold_the_ring(rig, state.members)
        truth = (await rig.backdoor.truth("ocs1"))
        assert dict(map(tuple, truth["state"]["connections"])) == daemon.engine.intended["ocs1"]

        # The stages against ground truth.
        stages = timeline["stages"]
        assert stages["failure"] >= result.injected_ns  # the injection, on the daemon clock
        assert stages["failure"] <= stages["reported"] <= stages["detected"] \
            <= stages["spare_chosen"]
        change = [c for c in truth["changes"] if c["arrived_ns"] > stages["spare_chosen"]]
        assert len(change) == 1  # one command moved both circuits
        assert change[0]["settled_ns"] <= stages["switches_acked"]
        assert result.light_truth_ns is not None
        # The meter's log (100 µs samples) dates the arrival as the optical model does
        # (bench_light measures how closely; a loaded CI machine gets a few ms of slack).
        assert abs(stages["light_verified"] - result.light_truth_ns) < 5_000_000
        assert stages["links_up"] >= result.light_truth_ns
        assert stages["links_up"] <= stages["job_restarted"] <= stages["collectives_ready"] \
            <= stages["first_step"]

        # The job runs with the new rank map: the spare's host runs rank 1 of epoch 2.
        (proc,) = next(h for h in rig.hosts if h.id == "s0").agent.jobs.running["ring4"]
        env = environ(proc.pid)
        assert (env["LABD_RANK"], env["LABD_EPOCH"]) == ("1", str(state.epoch))
        assert [r["endpoint"] for r in json.loads(env["LABD_RANK_MAP"])] == state.members
        assert next(h for h in rig.hosts if h.id == "h1").agent.jobs.running["ring4"] == []

        # Kept: the store (through the API), MQTT, and what a restarted daemon reloads.
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as api:
            rows = (await api.get("/v1/failovers", params={"job": "ring4"})).json()
            assert [(r["id"], r["outcome"]) for r in rows] == [
                (timeline["id"], "recovered")], rows
            assert rows[0]["stages"] == stages and rows[0]["plan"]["spare"] == "s0.nic0"
            one = (await api.get(f"/v1/failovers/{timeline['id']}")).json()
            assert one["since_failure_ms"]["first_step"] > 0
            jobs = (await api.get("/v1/jobs")).json()
            assert jobs[0]["members"] == state.members and jobs[0]["status"] == "running"
            made = (await api.get("/v1/circuits")).json()  # exactly the new ring's circuits
            assert sorted((c["from"], c["to"]) for c in made) == sorted(
                daemon.lab.job[0].links(state.members))
        async with asyncio.timeout(within(10)):
            async for message in watcher.messages:
                data = json.loads(message.payload)["data"]  # type: ignore[arg-type]
                if data["outcome"] == "recovered":
                    assert data["stages"] == stages
                    break
        again = JobManager(lab, daemon.engine, daemon.hosts, daemon.hub, daemon.store, None)
        await again.load()
        assert again.job("ring4").members == state.members
        assert again.job("ring4").spares == ["s1.nic0"]
        # The failed member, repaired and returned to the pool, is a spare after a restart.
        await daemon.jobs.return_spare("ring4", "h1.nic0")
        again = JobManager(lab, daemon.engine, daemon.hosts, daemon.hub, daemon.store, None)
        await again.load()
        assert again.job("ring4").members == state.members
        assert again.job("ring4").spares == ["s1.nic0", "h1.nic0"]
        # A kept pool the lab file no longer allows (it was edited) is not used.
        odd = JobPool(job="ring4", members=["h0.nic0", "x.nic0"], spares=[],
                      wall_time=datetime.now(UTC))
        await daemon.store.run_write(lambda session: session.merge(odd))
        again = JobManager(lab, daemon.engine, daemon.hosts, daemon.hub, daemon.store, None)
        await again.load()
        assert again.job("ring4").members == state.members
        assert again.job("ring4").spares == ["s1.nic0"]


@bounded(50)
async def test_a_failure_during_recovery_then_no_spare_left(start_rig: StartRig) -> None:
    async with start_rig("fo2", ring_lab(), mqtt=MQTT, token="t") as rig:
        await running(rig)
        daemon = rig.daemon
        seen: list[dict[str, Any]] = []
        collector = asyncio.create_task(collect(rig, seen))
        try:
            # h1 fails; the moment its recovery has chosen s0, s0 fails too.
            await rig.backdoor.fail_gpu("h1", 0, "ecc")
            chosen = await wait_for(daemon.hub, lambda: next(
                (t for t in seen if t["stages"]["spare_chosen"]), None),
                    within(20), "a spare chosen")
            assert chosen["plan"]["spare"] == "s0.nic0"
            await rig.backdoor.fail_gpu("s0", 0, "xid79")
            first = await wait_for(daemon.hub, final(rig, "h1.nic0", seen),
                                   within(30), "recovery 1")
            second = await wait_for(daemon.hub, final(rig, "s0.nic0", seen),
                                    within(30), "recovery 2")
            assert (first["outcome"], second["outcome"]) == ("recovered", "recovered")
            assert second["plan"]["spare"] == "s1.nic0" and second["id"] > first["id"]
            state = daemon.jobs.job("ring4")
            assert state.members == ["h0.nic0", "s1.nic0", "h2.nic0", "h3.nic0"]
            circuits_hold_the_ring(rig, state.members)
            try:
                await wait_for(daemon.hub, lambda: job_stepping(daemon, "ring4"), within(30),
                               "steps")
            except DrillError as exc:
                raise AssertionError(f"{exc}; the failovers: {told(seen)}") from None

            # A third failure finds no spare: recorded, the job degraded, nothing moved.
            intended = dict(daemon.engine.intended["ocs1"])
            epoch = state.epoch
            await rig.backdoor.fail_gpu("h2", 0, "remap-failed")
            third = await wait_for(daemon.hub, final(rig, "h2.nic0", seen),
                                   within(30), "recovery 3")
            assert third["outcome"] == "no-spare" and "no usable spare" in third["detail"]
            assert state.status == "degraded" and state.epoch == epoch
            assert daemon.engine.intended["ocs1"] == intended
            assert state.members == ["h0.nic0", "s1.nic0", "h2.nic0", "h3.nic0"]
            # A drill waiting for this job's next step is told it will not come.
            with pytest.raises(DrillError, match="degraded and will take no step"):
                job_stepping(daemon, "ring4")
            async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as api:
                rows = (await api.get("/v1/failovers")).json()
            assert [r["outcome"] for r in rows] == ["no-spare", "recovered", "recovered"]
        finally:
            collector.cancel()


@bounded(50)
async def test_a_failure_reported_while_the_event_stream_overflows_is_still_recovered(
        start_rig: StartRig) -> None:
    """Recovery does not ride the observers' bounded stream: a flood that overflows every
    subscription, with the failure report landing right behind it in the same turn of the
    loop, still gets the member replaced. (Agents over HTTP: an MQTT bridge whose own
    subscription overflows reconnects, which would add a timing of its own.)"""
    async with start_rig("fo5", ring_lab(), token="t") as rig:
        await running(rig)
        daemon = rig.daemon
        _, slow = daemon.hub.subscribe(size=1)
        for i in range(20_001):  # beyond any subscription's queue (10,000 by default)
            daemon.hub.publish("warning", {"detail": f"flood {i}"})
        assert slow.overflowed
        slow.close()
        problem = daemon.hosts.handle("h1", "events", json.dumps({
            "gpu": 0, "health": "failed", "was": "healthy", "reasons": ["xid 79"],
            "at_ns": time.monotonic_ns()}).encode())
        assert problem is None
        state = daemon.jobs.job("ring4")
        await wait_for(daemon.hub, lambda: "s0.nic0" in state.members
                       and state.status == "running", within(30), "h1 replaced by s0")
        assert state.members == ["h0.nic0", "s0.nic0", "h2.nic0", "h3.nic0"]
        circuits_hold_the_ring(rig, state.members)


@bounded(50)
async def test_a_lost_host_is_detected_without_a_report_and_replaced(start_rig: StartRig) -> None:
    async with start_rig("fo3", ring_lab(), mqtt=MQTT) as rig:
        await running(rig)
        daemon = rig.daemon
        result = await run_drill(rig, "ring4", random.Random(1), kind="host", member="h3.nic0",
                                 timeout="recovery")
        timeline = result.timeline
        assert (timeline["trigger"], timeline["outcome"]) == ("host-lost", "recovered")
        assert timeline["plan"]["spare"] == "s1.nic0"  # h3's rack
        stages = timeline["stages"]
        # The failure is dated by when the host sent its last heartbeat (on the daemon's
        # clock: late by at most the fastest delivery seen, ``offset_ns``).
        offset = daemon.hosts.hosts["h3"].offset_ns or 0
        assert stages["failure"] - offset <= result.injected_ns <= stages["detected"]
        assert stages["reported"] is None
        assert daemon.hosts.hosts["h3"].status == "lost"
        assert daemon.jobs.job("ring4").members[3] == "s1.nic0"
        circuits_hold_the_ring(rig, daemon.jobs.job("ring4").members)


@bounded(50)
async def test_a_restart_that_reuses_an_epoch_is_not_confused_with_the_run_it_stops(
        start_rig: StartRig) -> None:
    """A new leader starts from the epoch its predecessor last kept; one sent but not kept
    (the store write is not waited for on the recovery path) is sent again. The agents
    stopping the old run report its exit under that same epoch: the run's name tells the
    two apart, and the recovery waits for the new run's own progress."""
    async with start_rig("fo3e", ring_lab(), mqtt=MQTT) as rig:
        await running(rig)
        daemon = rig.daemon
        state = daemon.jobs.job("ring4")
        old_run = state.run
        state.epoch -= 1  # as a new leader would have it
        result = await run_drill(rig, "ring4", random.Random(1), member="h1.nic0",
                                 timeout="recovery")
        timeline = result.timeline
        assert timeline["outcome"] == "recovered", timeline
        assert timeline["epoch"] == state.epoch and state.run != old_run
        assert job_stepping(daemon, "ring4")


@bounded(50)
async def test_policy_ask_waits_for_the_operator(start_rig: StartRig) -> None:
    async with start_rig("fo4", ring_lab(recovery="ask"), mqtt=MQTT, token="t") as rig:
        await running(rig)
        daemon = rig.daemon
        seen: list[dict[str, Any]] = []
        collector = asyncio.create_task(collect(rig, seen))
        auth = {"Authorization": "Bearer t"}
        try:
            async with httpx.AsyncClient(base_url=daemon.url, headers=auth) as api:
                r = await api.post("/v1/jobs/ring4/decision", json={"approve": True})
                assert r.status_code == 409 and "no recovery waiting" in r.text
                intended = dict(daemon.engine.intended["ocs1"])
                await rig.backdoor.fail_gpu("h0", 0, "xid48")
                asked = await wait_for(daemon.hub, lambda: next(
                    (t for t in seen if t["outcome"] == "awaiting-operator"), None), 20,
                    "the proposal")
                assert asked["plan"]["spare"] == "s0.nic0"
                job = (await api.get("/v1/jobs/ring4")).json()
                assert job["awaiting_decision"] == asked["id"]
                assert daemon.engine.intended["ocs1"] == intended  # nothing moved yet
                r = await api.post("/v1/jobs/ring4/decision", json={"approve": "perhaps"})
                assert r.status_code == 422
                r = await api.post("/v1/jobs/ring4/decision", json={"approve": True})
                assert r.status_code == 200, r.text
                done = await wait_for(daemon.hub, final(rig, "h0.nic0", seen),
                                      within(30), "recovery")
                assert done["outcome"] == "recovered" and done["id"] == asked["id"]
                # Bad requests change nothing.
                assert (await api.post("/v1/jobs/nope/start")).status_code == 404
                r = await api.post("/v1/jobs/ring4/spares", json={"endpoint": "h1.nic0"})
                assert r.status_code == 409 and "member of a job" in r.text
                r = await api.post("/v1/jobs/ring4/spares", json={"endpoint": "zz"})
                assert r.status_code == 409 and "no NIC of a [[host]]" in r.text
                assert (await api.get("/v1/failovers/999")).status_code == 404
                # The repaired member goes back to the pool.
                await rig.backdoor.heal("h0", 0)
                r = await api.post("/v1/jobs/ring4/spares", json={"endpoint": "h0.nic0"})
                assert r.json()["spares"] == ["s1.nic0", "h0.nic0"]
        finally:
            collector.cancel()


@bounded(50)
async def test_without_a_broker_agents_report_over_http(start_rig: StartRig) -> None:
    async with start_rig("fo5", ring_lab(), token="t") as rig:
        daemon = rig.daemon
        assert daemon.bus is None
        await running(rig)
        result = await run_drill(rig, "ring4", random.Random(1), member="h2.nic0",
                                 timeout="recovery")
        assert result.timeline["outcome"] == "recovered"
        assert result.timeline["plan"]["spare"] == "s1.nic0"  # h2's rack
        assert daemon.jobs.job("ring4").members[2] == "s1.nic0"
        async with httpx.AsyncClient(base_url=daemon.url) as api:
            auth = {**AUTH, "Content-Type": "application/json"}  # as agents send
            r = await api.post("/v1/agents/h0/heartbeat", content=b"{}")
            assert r.status_code == 401
            r = await api.post("/v1/agents/h0/heartbeat", content=b"{not json", headers=auth)
            assert r.status_code == 422 and "not JSON" in r.text
            r = await api.post("/v1/agents/h0/mood", content=b"{}", headers=auth)
            assert r.status_code == 404 and "status, heartbeat or events" in r.text
            r = await api.post("/v1/agents/zz/heartbeat", content=b"{}", headers=auth)
            assert r.status_code == 404 and "no host 'zz'" in r.text
            r = await api.get("/v1/agents/h0/commands", params={"wait_s": 0}, headers=auth)
            assert r.status_code == 200 and r.json() == []
        assert daemon.hosts.hosts["h0"].status == "online"  # nothing bad was taken


@bounded(120)
async def test_drills_through_the_api(start_rig: StartRig) -> None:
    """POST /v1/drills/failover: bad requests are refused with nothing started; a drill on
    a job that is not running starts it, recovers, repairs the member and returns it as a
    spare; a second drill while one runs is refused."""
    async with start_rig("fo6", ring_lab(), token="t") as rig:
        daemon = rig.daemon
        _, events = daemon.hub.subscribe()
        async with httpx.AsyncClient(base_url=daemon.url,
                                     headers={"Authorization": "Bearer t"}) as api:
            for body, status, words in (
                    ({"job": "nope"}, 404, "nope"),
                    ({"member": "s0.nic0"}, 422, "not a member of job 'ring4'"),
                    ({"member": 3}, 422, "member")):
                r = await api.post("/v1/drills/failover", json=body)
                assert r.status_code == status and words in r.text, r.text
            assert daemon.jobs.job("ring4").status == "idle"  # nothing was started
            r = await api.post("/v1/drills/failover", json={"member": "h1.nic0"})
            assert r.status_code == 202 and r.json()["job"] == "ring4"
            r = await api.post("/v1/drills/failover", json={})
            assert r.status_code == 409 and "already running" in r.text
            states = []
            while not states or states[-1] not in ("done", "failed"):
                event = await events.next()
                assert event is not None
                if event.kind == "drill":
                    states.append(event.data["state"])
                    last = event.data
        events.close()
        assert states == ["started", "recovered", "done"], last
        state = daemon.jobs.job("ring4")
        assert "h1.nic0" not in state.members and "h1.nic0" in state.spares
        (timeline,) = await daemon.store.read(
            lambda s: [r.outcome for r in s.scalars(select(FailoverTimeline))])
        assert timeline == "recovered"


@bounded(50)
async def test_the_end_of_a_run_is_no_failure(start_rig: StartRig, tmp_path: Path) -> None:
    """Leaving the rig stops its hosts, whose agents say offline as they go: the daemon,
    still up, must not take that for a failure of the running job."""
    async with start_rig("fo7", ring_lab(), mqtt=MQTT) as rig:
        await running(rig)
        hub = rig.daemon.hub
        _, sub = hub.subscribe()
    events = []
    while (event := sub.queue.get_nowait()) is not None:
        events.append(event.kind)
    assert "failover" not in events
    store = Store(tmp_path / "s.sqlite")
    await store.open()
    try:
        assert await store.read(lambda s: list(s.scalars(select(FailoverTimeline)))) == []
    finally:
        await store.close()
