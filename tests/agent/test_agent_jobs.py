"""The agent's job runner with the real emulated trainer as its job: start with a rank map,
progress as it happens, restart with a new epoch, refusals."""

import asyncio
import json
from pathlib import Path
from typing import Any

from labd.agent.runner import JobRunner, emulated_job_command
from labd.hostwire import Event


class Reports:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.changed = asyncio.Condition()

    async def __call__(self, event: Event) -> None:
        async with self.changed:
            # As it goes on the wire: the daemon reads it with the same schema.
            self.items.append(json.loads(event.stamped(0)))
            self.changed.notify_all()

    async def wait(self, **match: Any) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next((e for e in self.items
                         if all(e.get(k) == v for k, v in match.items())), None)

        async with asyncio.timeout(20), self.changed:
            while (found := find()) is None:
                await self.changed.wait()
            return found


def ranks(*hosts: str) -> list[dict[str, Any]]:
    return [{"rank": i, "host": h, "endpoint": f"{h}.nic0", "gpu": 0}
            for i, h in enumerate(hosts)]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def test_start_progress_and_restart_with_a_new_rank_map() -> None:
    reports = Reports()
    runner = JobRunner("a", {"ring": emulated_job_command(20, 10)}, reports)
    try:
        await runner.handle(json.dumps({"action": "start", "job": "ring", "epoch": 1,
                                        "ranks": ranks("a", "b", "a")}).encode())
        procs = runner.running["ring"]
        assert len(procs) == 2  # ranks 0 and 2 are on this host
        for rank in (0, 2):
            await reports.wait(epoch=1, rank=rank, progress="started")
            await reports.wait(epoch=1, rank=rank, progress="ready")
            step = await reports.wait(epoch=1, rank=rank, progress="step")
            assert step["step"] == 1
        # Read once the rank has said it is ready: the spawn returns as the child's execve
        # begins, and until the new image is set up /proc shows its environment empty.
        env = environ(procs[1].pid)
        assert (env["LABD_RANK"], env["LABD_WORLD_SIZE"], env["LABD_EPOCH"],
                env["LABD_NIC"]) == ("2", "3", "1", "a.nic0")
        assert [r["host"] for r in json.loads(env["LABD_RANK_MAP"])] == ["a", "b", "a"]
        # A restart: the new epoch's map puts this host's rank elsewhere.
        await runner.handle(json.dumps({"action": "start", "job": "ring", "epoch": 2,
                                        "ranks": ranks("b", "a")}).encode())
        old = await reports.wait(epoch=1, rank=0, progress="exited")
        assert old["code"] == 0  # SIGTERM: a clean stop
        assert all(p.returncode is not None for p in procs)
        (new,) = runner.running["ring"]
        await reports.wait(epoch=2, rank=1, progress="ready")
        assert environ(new.pid)["LABD_RANK"] == "1"
        await reports.wait(epoch=2, rank=1, progress="step")
        await runner.handle(b'{"action": "stop", "job": "ring"}')
        assert new.returncode is not None and "ring" not in runner.running
    finally:
        await runner.close()


async def test_refusals_are_reported_and_run_nothing() -> None:
    reports = Reports()
    runner = JobRunner("a", {"ring": emulated_job_command(0, 10)}, reports)
    try:
        await runner.handle(json.dumps({"action": "start", "job": "rm -rf /", "epoch": 1,
                                        "ranks": ranks("a")}).encode())
        refused = await reports.wait(job="rm -rf /")
        assert "runs no job 'rm -rf /'" in refused["error"] and "ring" in refused["error"]
        await runner.handle(b"{not json")
        bad = await reports.wait(job=None)
        assert bad["error"].startswith("bad job command")
        await runner.handle(b'{"action": "launch", "job": "ring"}')
        assert "action" in reports.items[-1]["error"]
        assert runner.running == {}
    finally:
        await runner.close()


async def test_a_job_that_fails_to_start_reports_its_exit() -> None:
    reports = Reports()
    # The trainer refuses a rank map that does not fit its rank: it exits with 2.
    runner = JobRunner("a", {"ring": emulated_job_command(0, 10)}, reports)
    try:
        await runner.handle(json.dumps({"action": "start", "job": "ring", "epoch": 1,
                                        "ranks": [{"rank": 5, "host": "a",
                                                   "endpoint": "a.nic0", "gpu": 0}]}).encode())
        exited = await reports.wait(progress="exited")
        assert exited["code"] == 2 and exited["rank"] == 5
    finally:
        await runner.close()


async def test_the_heartbeat_says_each_runs_progress_and_a_repeat_start_is_ignored() -> None:
    """What the progress events announce is kept for the heartbeat (a daemon whose broker
    lost the events learns it there), and a start of the run that runs already (heard
    twice, or sent again to a host whose heartbeat did not show it yet) changes nothing."""
    reports = Reports()
    runner = JobRunner("a", {"ring": emulated_job_command(20, 10)}, reports)
    start = json.dumps({"action": "start", "job": "ring", "epoch": 4, "run": "r4",
                        "ranks": ranks("a", "b")}).encode()
    try:
        await runner.handle(start)
        step = await reports.wait(run="r4", rank=0, progress="step")
        (run,) = runner.state()
        assert (run["job"], run["epoch"], run["run"]) == ("ring", 4, "r4")
        (rank,) = run["ranks"]  # rank 1 runs on host b
        assert rank["rank"] == 0 and set(rank["at"]) == {"started", "ready", "step"}
        assert rank["at"]["step"] == step["at_ns"]
        (proc,) = runner.running["ring"]
        await runner.handle(start)
        assert runner.running["ring"] == [proc] and proc.returncode is None
        assert len([e for e in reports.items if e["progress"] == "started"]) == 1
        await runner.handle(b'{"action": "stop", "job": "ring"}')
        assert runner.state() == []
    finally:
        await runner.close()
