"""The daemon's job commands to the hosts' agents: starting and stopping a job's ranks, the
wait for what the hosts report back (labd.hosts.jobs wakes it), and the queues that agents
without a broker long-poll."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal, Protocol

from labd.errors import JobError
from labd.hosts.jobstate import JobState, SendToHost
from labd.hostwire import JobCommand, RankSpec
from labd.lab.loader import Lab


class Hearing(Protocol):
    """Whether the daemon hears its hosts (labd.hosts.watchdog.Watchdog)."""

    reconnect_s: float

    async def hearing(self, timeout: float) -> bool: ...


class JobCommands:
    def __init__(self, lab: Lab, hosts: Hearing, send: SendToHost | None) -> None:
        self.lab, self.hosts, self.send = lab, hosts, send
        self._changed = asyncio.Event()
        """Set (and replaced) whenever a host reports something a recovery may wait for."""

    def ranks(self, members: list[str]) -> list[RankSpec]:
        """The rank map of ``members``; JobError if one is on no host."""
        ranks = []
        for rank, endpoint in enumerate(members):
            where = self.lab.placement(endpoint)
            if where is None:
                raise JobError(f"member {endpoint!r} is no NIC of a [[host]]: labd cannot run "
                               "a rank there")
            ranks.append(RankSpec(rank=rank, host=where[0].id, endpoint=endpoint,
                                  gpu=where[1]))
        return ranks

    def sender(self) -> SendToHost:
        if self.send is None:
            raise JobError("jobs run through the hosts' agents: start the daemon with --mqtt")
        return self.send

    def hosts_of(self, members: list[str]) -> set[str]:
        return {w[0].id for m in members if (w := self.lab.placement(m)) is not None}

    async def command(self, state: JobState, hosts: set[str],
                      action: Literal["start", "stop"]) -> None:
        """Start the job's current run on ``hosts`` (its members' rank map), or stop it."""
        send = self.sender()
        # Not into a broker the agents are still coming back to: one not yet back would
        # never hear it (their time to reconnect bounds the wait).
        await self.hosts.hearing(self.hosts.reconnect_s + 1.0)
        if action == "start":
            command = JobCommand(action="start", job=state.entry.id, epoch=state.epoch,
                                 run=state.run, ranks=self.ranks(state.members))
        else:
            command = JobCommand(action="stop", job=state.entry.id)
        message = command.wire()
        # All at once: each send waits for the broker's acknowledgement, and a restart
        # waits for the last host to hear of it.
        await asyncio.gather(*(send(host, message) for host in sorted(hosts)))

    def wake(self) -> None:
        """A host reported something a recovery may wait for."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, check: Callable[[], int | None], timeout: float) -> int:
        """Wait until ``check()`` gives a time; TimeoutError after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            while (found := check()) is None:
                await self._changed.wait()
            return found


class CommandQueues:
    """Job commands for agents that reach the daemon over HTTP: each host's agent
    long-polls ``GET /v1/agents/{host}/commands`` and gets them in order."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}

    def _queue(self, host: str) -> asyncio.Queue[dict[str, Any] | None]:
        return self._queues.setdefault(host, asyncio.Queue())

    async def send(self, host: str, message: dict[str, Any]) -> None:
        self._queue(host).put_nowait(message)

    def close(self) -> None:
        """The daemon is stopping: answer every waiting poll now (with nothing)."""
        for queue in self._queues.values():
            queue.put_nowait(None)

    async def take(self, host: str, wait_s: float) -> list[dict[str, Any]]:
        """What is waiting for ``host``, waiting up to ``wait_s`` for the first."""
        queue = self._queue(host)
        try:
            async with asyncio.timeout(wait_s):
                first = await queue.get()
        except TimeoutError:
            return []
        out = [first]
        while not queue.empty():
            out.append(queue.get_nowait())
        return [m for m in out if m is not None]
