"""A recovery that a leader change cuts off is carried on by the new leader under its own
record, on the in-memory link (tests/memory_rig.py): two daemon lives one after another on
one emulated lab and one store, the first stopped in the middle of a recovery as a leader
given SIGTERM is, the second taking over as a standby does (``load`` while it does not
act, then ``resume``). Whoever waits for the recovery's outcome (an operator, the soak's
drill) gets one; before, the record stayed ``in-progress`` for good."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from labd import deadlines
from labd.emulation.drill import wait_for
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import HostMonitor
from labd.hostwire import JobCommand
from labd.store.pools import open_timelines
from tests.labs import ring_lab
from tests.memory_rig import JobsBench, MemoryAgents, MemoryBench, engine_on, memory_lab

RING = ["h0.nic0", "h1.nic0", "h2.nic0", "h3.nic0"]


def within(seconds: float) -> float:
    return deadlines.current().times(seconds)


@contextlib.asynccontextmanager
async def life(bench: MemoryBench, *, takeover: bool = False,
               before: list[tuple[str, int]] | None = None) -> AsyncIterator[JobsBench]:
    """One daemon's hosts' side, wired as labd.daemon.core wires it; with ``takeover``, as
    a standby that takes the lead: the jobs read while it does not act, the hosts heard
    (each GPU in ``before`` failed), then ``resume``."""
    hosts = HostMonitor(bench.hub, [h.id for h in bench.lab.host])
    agents = MemoryAgents(bench.lab, hosts, bench.emulated)
    jobs = JobManager(bench.lab, bench.engine, hosts, bench.hub, bench.store, agents.send)
    hosts.listen(jobs)
    jobs.acting = not takeover
    await jobs.load()
    agents.online()
    for host, gpu in before or []:
        agents.fail_gpu(host, gpu, "xid 79")
    if takeover:
        jobs.resume()
    tasks = [asyncio.create_task(jobs.run(), name="memory-recovery"),
             asyncio.create_task(agents.watch_links(), name="memory-nics")]
    try:
        yield JobsBench(bench, hosts, jobs, agents)
    finally:
        for task in tasks:  # the daemon stops: its recovery is cut off where it is
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await agents.close()
        await bench.store.run_write(lambda session: None)  # what it wrote, written


def failovers(bench: MemoryBench) -> list[dict[str, Any]]:
    return [e.data for e in bench.events if e.kind == "failover"]


def ended(bench: MemoryBench, row: int) -> dict[str, Any] | None:
    return next((f for f in failovers(bench) if f["id"] == row
                 and f["outcome"] not in ("in-progress", "awaiting-operator")), None)


async def started(side: JobsBench) -> None:
    state = side.jobs.job("ring4")
    await side.jobs.start_job("ring4", verify_light=False)
    await wait_for(side.bench.hub, lambda: all(
        "step" in state.progress.get(r, {}) for r in range(len(state.members))),
        within(5), "the first step")


async def test_a_restart_cut_off_after_the_swap_is_carried_on(tmp_path: Path) -> None:
    """The leader swapped the spare in and sent the restart, whose ranks' progress it never
    heard (the broker lost it), then stopped: the new leader restarts the job on the kept
    members and records the outcome on the same record."""
    async with memory_lab(tmp_path, ring_lab(), tag="ring") as memory:
        async with engine_on(memory, light_window_s=0.1) as bench, life(bench) as side:
            await started(side)
            heard: list[tuple[str, JobCommand]] = []

            async def unanswered(host: str, message: dict[str, Any]) -> None:
                heard.append((host, JobCommand.model_validate(message)))
            side.jobs.commands.send = unanswered
            side.agents.fail_gpu("h1", 0, "xid 79")
            await wait_for(bench.hub, lambda: len(heard) >= 4, within(5), "the restart sent")
            state = side.jobs.job("ring4")
            assert state.status == "recovering" and "s0.nic0" in state.members
        rows = await memory.store.read(open_timelines)
        assert [(r.job, r.outcome) for r in rows] == [("ring4", "in-progress")]
        async with engine_on(memory, light_window_s=0.1) as bench, \
                life(bench, takeover=True) as side:
            found = await wait_for(bench.hub, lambda: ended(bench, rows[0].id), within(5),
                                   "the cut-off recovery's outcome")
            assert found["outcome"] == "recovered", found
            assert found["member"] == "h1.nic0" and "taken up at a takeover" in found["reasons"]
            state = side.jobs.job("ring4")
            assert state.status == "running" and state.members == [
                "h0.nic0", "s0.nic0", "h2.nic0", "h3.nic0"]
            starts = [c for _, c in side.agents.commands if c.action == "start"]
            assert {c.run for c in starts} == {state.run} and len(starts) == 4
        assert await memory.store.read(open_timelines) == []


async def test_a_recovery_cut_off_before_the_swap_goes_on_under_its_record(
        tmp_path: Path) -> None:
    """The leader stopped while the operator had not answered (policy ``ask``); the member
    is still failed: the new leader asks again under the same record, and the swap is
    made once approved."""
    async with memory_lab(tmp_path, ring_lab("ask"), tag="ring") as memory:
        async with engine_on(memory, light_window_s=0.1) as bench, life(bench) as side:
            await started(side)
            side.agents.fail_gpu("h1", 0, "xid 79")
            await wait_for(bench.hub, lambda: side.jobs.job("ring4").pending is not None,
                           within(5), "the proposed swap")
        rows = await memory.store.read(open_timelines)
        assert len(rows) == 1 and rows[0].detail["plan"]["spare"] == "s0.nic0"
        async with engine_on(memory, light_window_s=0.1) as bench, \
                life(bench, takeover=True, before=[("h1", 0)]) as side:
            state = side.jobs.job("ring4")
            await wait_for(bench.hub, lambda: state.pending is not None, within(5),
                           "the swap proposed again")
            assert state.pending is not None and state.pending.id == rows[0].id
            side.jobs.decide("ring4", True)
            found = await wait_for(bench.hub, lambda: ended(bench, rows[0].id), within(5),
                                   "the cut-off recovery's outcome")
            assert found["outcome"] == "recovered", found
            assert "h1.nic0" not in state.members and state.status == "running"
            # One record: the member was not also reported anew at the takeover.
            assert {f["id"] for f in failovers(bench)} == {rows[0].id}


async def test_a_plain_start_closes_what_its_last_life_left_open(tmp_path: Path) -> None:
    """Without a standby there is no one to carry it on: a daemon that starts closes the
    record its last life left open (a member still failed is reported again by its host)."""
    async with memory_lab(tmp_path, ring_lab("ask"), tag="ring") as memory:
        async with engine_on(memory, light_window_s=0.1) as bench, life(bench) as side:
            await started(side)
            side.agents.fail_gpu("h1", 0, "xid 79")
            await wait_for(bench.hub, lambda: side.jobs.job("ring4").pending is not None,
                           within(5), "the proposed swap")
        async with engine_on(memory, light_window_s=0.1) as bench, life(bench):
            closed = failovers(bench)
            assert [(f["outcome"], f["member"]) for f in closed] == [("failed", "h1.nic0")]
            assert "cut off" in closed[0]["detail"]
        assert await memory.store.read(open_timelines) == []
