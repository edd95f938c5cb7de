"""Events an instrument reports: connection changes, drift found on reconnect, autonomous
device messages. Listeners are plain callables; :class:`EventQueue` adapts them for awaiting."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class LinkState(enum.StrEnum):
    OFFLINE = "offline"
    CONNECTING = "connecting"
    ONLINE = "online"
    BACKOFF = "backoff"
    CLOSED = "closed"


@dataclass(frozen=True)
class Drift:
    """Difference between the cross-connects we expected and those the device reported."""

    missing: dict[int, int] = field(default_factory=dict)
    """Expected pairs the device does not have."""
    unexpected: dict[int, int] = field(default_factory=dict)
    """Pairs the device has that we did not expect."""

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected)

    @classmethod
    def between(cls, expected: dict[int, int], found: dict[int, int]) -> Drift:
        return cls(
            missing={a: b for a, b in expected.items() if found.get(a) != b},
            unexpected={a: b for a, b in found.items() if expected.get(a) != b},
        )


@dataclass(frozen=True)
class InstrumentEvent:
    instrument: str
    kind: str
    """``state`` (link state changed), ``resync`` (reconnected and re-read; see ``drift``),
    ``drift`` (a map read differed from what was expected), ``identity-changed``,
    ``warning`` (something to know that is no failure: an optional query refused), or
    ``autonomous`` (a message the device sent on its own). A ``resync`` whose device looks
    restarted has ``data["restarted"]`` saying why."""
    state: LinkState | None = None
    detail: str = ""
    drift: Drift | None = None
    data: dict[str, Any] = field(default_factory=dict)
    at_ns: int = field(default_factory=time.monotonic_ns)


Listener = Callable[[InstrumentEvent], None]


class EventSource:
    """Mixin: keeps listeners and calls them; a failing listener never breaks the driver."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, event: InstrumentEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's bug must not stop the instrument
                log.exception("event listener failed on %s", event,
                              extra={"instrument": event.instrument})


class EventQueue:
    """Collects events from a source so a caller can ``await queue.next(kind=...)``."""

    def __init__(self, source: EventSource) -> None:
        self._queue: asyncio.Queue[InstrumentEvent] = asyncio.Queue()
        self._remove = source.add_listener(self._queue.put_nowait)

    async def next(self, kind: str | None = None, *, timeout: float = 5.0) -> InstrumentEvent:
        async with asyncio.timeout(timeout):
            while True:
                event = await self._queue.get()
                if kind is None or event.kind == kind:
                    return event

    def close(self) -> None:
        self._remove()
