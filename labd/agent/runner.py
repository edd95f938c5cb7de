"""The host's part of a job: the agent starts, stops and restarts the command its own
configuration names for a job (never a command line from the network), one process per
rank placed on this host, with the rank map in its environment, and reports the job's
progress as it happens.

The daemon's command (JSON on ``labd/<lab>/hosts/<host>/job``)::

    {"action": "start", "job": "ring4", "epoch": 2, "run": "9f2c61d0",
     "ranks": [{"rank": 0, "host": "h0", "endpoint": "h0.nic0", "gpu": 0}, ...]}
    {"action": "stop", "job": "ring4"}

``start`` stops whatever runs of that job first (a restart is a start with a new epoch).
``run`` names this start alone and comes back in every report of it: a new leader may
reuse an epoch its predecessor sent but did not keep, and the old run's last words must
not pass for the new one's.
Each rank's process gets ``LABD_JOB``, ``LABD_EPOCH``, ``LABD_RANK``, ``LABD_WORLD_SIZE``,
``LABD_RANK_MAP`` (the JSON list of ranks above), ``LABD_NIC`` and ``CUDA_VISIBLE_DEVICES``.
It reports progress by printing ``LABD_PROGRESS ready`` (its collectives are set up) and
``LABD_PROGRESS step N`` on stdout; other output passes through.

Progress events (on the host's ``events`` topic): ``{"job", "epoch", "run", "rank", "progress":
"started" | "ready" | "step" | "exited", "step", "code", "at_ns"}``; a command that cannot be
carried out gives ``{"job", "error"}``. Both ends use the models of labd.hostwire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from pydantic import ValidationError

from labd.hostwire import Event, JobCommand, JobError, JobProgress, Progress, RankState, RunState

__all__ = ["JobCommand", "JobRunner", "emulated_job_command"]

Report = Callable[[Event], Awaitable[None]]
PROGRESS = "LABD_PROGRESS "
STEP_REPORT_NS = 1_000_000_000
"""After a run's first step, steps are reported at most once a second."""
STOP_GRACE_S = 5.0


def emulated_job_command(init_ms: float, step_ms: float) -> list[str]:
    """The command emulated hosts run for a job: the emulated trainer (standard library
    only, so it starts without site-packages, as fast as Python can)."""
    from labd.agent import trainer

    return [sys.executable, "-S", trainer.__file__, f"--init-ms={init_ms:g}",
            f"--step-ms={step_ms:g}"]


class JobRunner:
    def __init__(self, host: str, commands: dict[str, list[str]], report: Report) -> None:
        self.host = host
        self.commands = commands
        self.report = report
        self.running: dict[str, list[asyncio.subprocess.Process]] = {}
        self.runs: dict[str, RunState] = {}
        """Each job's latest run here and its ranks' progress, as the heartbeat carries it:
        an event the broker lost (it died between acknowledging it and delivering it) is
        learnt from the next heartbeat."""
        self.version = 0
        """Bumped by every change to :attr:`runs` (the agent's heartbeats carry them while
        that may be news)."""
        self._watchers: set[asyncio.Task[None]] = set()

    def state(self) -> list[RunState]:
        """What the heartbeat says of the jobs: each one's latest run and its ranks."""
        return list(self.runs.values())

    async def _tell(self, rank: _Rank, progress: Progress, at_ns: int, *,
                    step: int | None = None, code: int | None = None) -> None:
        run = self.runs.get(rank.job)
        if run is not None and run["run"] == rank.run and run["epoch"] == rank.epoch:
            for seen in run["ranks"]:
                if seen["rank"] == rank.rank:
                    # The first of each: what the daemon times a restart by (later steps
                    # would change every heartbeat for nothing).
                    if progress not in seen["at"]:
                        seen["at"][progress] = at_ns
                        self.version += 1
                    if code is not None:
                        seen["code"] = code
        await self.report(_progress(rank, progress, at_ns, step=step, code=code))

    async def handle(self, payload: bytes) -> None:
        """One command from the daemon; a bad one is answered with an error event."""
        try:
            command = JobCommand.model_validate_json(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            await self.report(JobError(job=None, error=f"bad job command: {where}: "
                                                       f"{first['msg']}"))
            return
        if command.action == "stop":
            if self.runs.pop(command.job, None) is not None:
                self.version += 1
            await self.stop(command.job)
            return
        argv = self.commands.get(command.job)
        if argv is None:
            await self.report(JobError(
                job=command.job, epoch=command.epoch, run=command.run,
                error=f"this agent runs no job {command.job!r}; it is configured for: "
                      f"{', '.join(self.commands) or 'none'}"))
            return
        kept = self.runs.get(command.job)
        if (command.run and kept is not None and kept["run"] == command.run
                and kept["epoch"] == command.epoch and command.job in self.running):
            # A start heard twice (QoS 1 may deliver it again; the daemon sends it again to
            # a host whose heartbeat did not show it): its ranks run already.
            return
        await self.start(command, argv)

    async def start(self, command: JobCommand, argv: list[str]) -> None:
        mine = [r for r in command.ranks if r.host == self.host]
        # Said at once (the old run's stop may take its grace): the daemon sees the start
        # heard, and sends it no more.
        self.runs[command.job] = RunState(
            job=command.job, epoch=command.epoch, run=command.run,
            ranks=[RankState(rank=r.rank, at={}, code=None) for r in mine])
        self.version += 1
        await self.stop(command.job)
        ranks = [r.model_dump() for r in sorted(command.ranks, key=lambda r: r.rank)]
        procs = []
        for spec in mine:
            env = {**os.environ, "LABD_JOB": command.job, "LABD_EPOCH": str(command.epoch),
                   "LABD_RANK": str(spec.rank), "LABD_WORLD_SIZE": str(len(ranks)),
                   "LABD_RANK_MAP": json.dumps(ranks), "LABD_NIC": spec.endpoint,
                   "CUDA_VISIBLE_DEVICES": str(spec.gpu)}
            base = _Rank(command.job, command.epoch, command.run, spec.rank)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.PIPE, env=env)
            except OSError as exc:
                await self.report(JobError(job=base.job, epoch=base.epoch, run=base.run,
                                           rank=base.rank,
                                           error=f"cannot start {argv[0]!r}: {exc}"))
                continue
            procs.append(proc)
            await self._tell(base, "started", time.monotonic_ns())
            task = asyncio.create_task(self._watch(proc, base))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
        self.running[command.job] = procs

    async def _watch(self, proc: asyncio.subprocess.Process, base: _Rank) -> None:
        assert proc.stdout is not None
        last_step_ns = 0
        async for raw in proc.stdout:
            now = time.monotonic_ns()
            line = raw.decode(errors="replace").rstrip()
            if not line.startswith(PROGRESS):
                print(line, flush=True)  # the job's own output passes through
                continue
            words = line[len(PROGRESS):].split()
            if words == ["ready"]:
                await self._tell(base, "ready", now)
            elif (len(words) == 2 and words[0] == "step" and words[1].isdigit()
                  and (not last_step_ns or now - last_step_ns >= STEP_REPORT_NS)):
                last_step_ns = now
                await self._tell(base, "step", now, step=int(words[1]))
        code = await proc.wait()
        await self._tell(base, "exited", time.monotonic_ns(), code=code)

    async def stop(self, job: str) -> None:
        """SIGTERM every process of the job; SIGKILL what is left after a grace period."""
        for proc in self.running.pop(job, []):
            if proc.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                async with asyncio.timeout(STOP_GRACE_S):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def kill_all(self) -> None:
        """The host dies: its processes die with it, unreported."""
        for task in self._watchers:
            task.cancel()
        for procs in self.running.values():
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

    async def close(self) -> None:
        for job in list(self.running):
            await self.stop(job)
        for task in list(self._watchers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Rank(NamedTuple):
    job: str
    epoch: int
    run: str
    rank: int


def _progress(rank: _Rank, progress: Progress, at_ns: int, *, step: int | None = None,
              code: int | None = None) -> JobProgress:
    return JobProgress(job=rank.job, epoch=rank.epoch, run=rank.run, rank=rank.rank,
                       progress=progress, step=step, code=code, at_ns=at_ns)
