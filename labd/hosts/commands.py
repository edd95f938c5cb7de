"""Job commands for agents that reach the daemon over HTTP, queued per host until its
agent's long poll takes them."""

from __future__ import annotations

import asyncio
from typing import Any


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
