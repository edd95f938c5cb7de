"""Per-port reservations: requests that touch the same ports (or meter channels) run one
after another; requests that do not, run at once."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable
from types import TracebackType


class Reservations:
    def __init__(self) -> None:
        self._held: set[Hashable] = set()
        self._waiting: list[asyncio.Future[None]] = []

    def hold(self, keys: Iterable[Hashable]) -> Hold:
        """``async with reservations.hold(keys):`` the keys are this request's alone."""
        # A frozenset of one is the set itself: a switch's whole-map keys are not copied.
        return Hold(self, frozenset(keys))

    def busy(self, keys: Iterable[Hashable]) -> bool:
        return bool(set(keys) & self._held)

    def _release(self, keys: frozenset[Hashable]) -> None:
        self._held -= keys
        # Every waiter looks again: one may now find all its keys free.
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)


class Hold:
    """One request's hold on its keys. All or nothing, so two requests can never each hold
    half of the other's ports; taken without a turn of the loop when they are free (every
    reconfiguration passes here)."""

    __slots__ = ("keys", "owner")

    def __init__(self, owner: Reservations, keys: frozenset[Hashable]) -> None:
        self.owner, self.keys = owner, keys

    async def __aenter__(self) -> None:
        owner = self.owner
        while self.keys & owner._held:
            future = asyncio.get_running_loop().create_future()
            owner._waiting.append(future)
            try:
                await future
            finally:
                if future in owner._waiting:  # cancelled while waiting
                    owner._waiting.remove(future)
        owner._held |= self.keys

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self.owner._release(self.keys)
