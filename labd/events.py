"""The daemon's event stream: every event gets the next sequence number and goes to every
subscriber (the WebSocket clients, the MQTT bridge). A subscriber that falls behind by more
than its queue holds is told so and dropped, never allowed to slow the daemon down; it
resyncs from a fresh snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    data: dict[str, Any]
    at_ns: int = field(default_factory=time.monotonic_ns)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "at_ns": self.at_ns, "data": self.data}


class Subscription:
    def __init__(self, hub: EventHub, size: int, who: str = "other") -> None:
        self._hub = hub
        self.who = who
        """What reads it (``websocket``, ``mqtt``), for the daemon's metrics."""
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=size)
        self.overflowed = False

    async def next(self) -> Event | None:
        """The next event; None once the subscription was dropped for falling behind."""
        return await self.queue.get()

    def close(self) -> None:
        self._hub._subscribers.discard(self)
        self._hub._ending.discard(self)
        if not self._hub._ending:
            self._hub._ended.set()


class EventHub:
    def __init__(self, snapshot: Callable[[], dict[str, Any]] | None = None) -> None:
        self._seq = itertools.count(1)
        self.last_seq = 0
        self._subscribers: set[Subscription] = set()
        self._ending: set[Subscription] = set()
        """Subscribers told of the end (``close``) that have not closed yet."""
        self._ended = asyncio.Event()
        self.snapshot = snapshot or (lambda: {})
        self._observers: list[Callable[[Event], None]] = []

    def observe(self, observer: Callable[[Event], None]) -> None:
        """Call ``observer`` with every event as it is published, in the publisher's task.
        For counting (the daemon's metrics): it must be quick and never await; unlike a
        subscription it cannot fall behind, so it misses nothing."""
        self._observers.append(observer)

    def readers(self) -> Counter[str]:
        """Open subscriptions by what reads them (``Subscription.who``)."""
        return Counter(sub.who for sub in self._subscribers)

    def publish(self, kind: str, data: dict[str, Any]) -> Event:
        event = Event(next(self._seq), kind, data)
        self.last_seq = event.seq
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # a counting bug must not cost the event its readers
                log.exception("an observer of the event stream failed on %s", kind)
        for sub in list(self._subscribers):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                # Too slow: drop what it has not read and leave only the end marker.
                sub.overflowed = True
                sub.close()
                while not sub.queue.empty():
                    sub.queue.get_nowait()
                sub.queue.put_nowait(None)
        return event

    def close(self) -> None:
        """End every subscription (the daemon is stopping): each gets the end marker."""
        subscribers = list(self._subscribers)
        self._ending.update(subscribers)
        for sub in subscribers:
            self._subscribers.discard(sub)
            with contextlib.suppress(asyncio.QueueFull):
                sub.queue.put_nowait(None)
        if self._ending:
            self._ended.clear()
        else:
            self._ended.set()

    async def wait_ended(self, timeout: float) -> None:
        """After ``close``: until every subscriber has read the end and closed its
        subscription (a WebSocket client has been told why), or ``timeout`` s."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ended.wait()

    def subscribe(self, size: int = 10_000, who: str = "other"
                  ) -> tuple[dict[str, Any], Subscription]:
        """A snapshot and the subscription that continues from it (no event lost between);
        ``who`` says what reads it, for the metrics."""
        sub = Subscription(self, size, who)
        self._subscribers.add(sub)
        return {"seq": self.last_seq, **self.snapshot()}, sub
