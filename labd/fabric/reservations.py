"""Per-port reservations: requests that touch the same ports (or meter channels) run one
after another; requests that do not, run at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import asynccontextmanager


class Reservations:
    def __init__(self) -> None:
        self._held: set[Hashable] = set()
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, keys: Iterable[Hashable]) -> AsyncIterator[None]:
        wanted = set(keys)
        async with self._changed:
            # All or nothing, so two requests can never each hold half of the other's ports.
            await self._changed.wait_for(lambda: not (wanted & self._held))
            self._held |= wanted
        try:
            yield
        finally:
            async with self._changed:
                self._held -= wanted
                self._changed.notify_all()

    def busy(self, keys: Iterable[Hashable]) -> bool:
        return bool(set(keys) & self._held)
