"""The connection state machine every driver owns.

    OFFLINE ──open──▶ CONNECTING ──ok──▶ ONLINE ──timeout/closed/garbage──▶ BACKOFF
                          │  ▲                                               │
                          └──┴────────── jittered exponential backoff ◀──────┘

One lock per instrument: whatever the number of callers, one exchange is on the wire at a
time, so replies can never be interleaved. The first timeout drops the link (a late reply
would otherwise be taken for the answer to the next command); a background task reconnects,
runs the driver's resync (flush, re-identify, re-read state, report drift) and only then
lets commands through again.

A link that nobody uses can die unseen. One the device closes is dropped as it closes (the
transport tells, read or not). One that only goes silent (power cut, cable pulled) looks
open until something is sent: where a watch interval is set, an instrument idle that long
gets one cheap query (the driver's probe), taken under the same lock as any command, so it
never interleaves with one; a probe that fails drops the link as a command's failure would,
and reconnection follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from instruments.errors import (
    InstrumentClosed,
    InstrumentError,
    InstrumentTimeout,
    ProtocolError,
)
from instruments.events import EventSource, InstrumentEvent, LinkState
from instruments.link import Link

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors after which the byte stream can no longer be trusted to be in step.
LINK_FAULTS = (InstrumentTimeout, InstrumentClosed, ProtocolError)


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays: full jitter over an exponentially growing window."""

    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        window = min(self.maximum, self.initial * self.factor ** max(0, attempt - 1))
        return random.uniform(window / 2, window)


class Connection(EventSource):
    """Owns one :class:`Link`: opens it, runs exchanges one at a time, recovers it."""

    def __init__(
        self,
        link: Link,
        *,
        on_connect: Callable[[Link], Awaitable[None]],
        backoff: Backoff | None = None,
        name: str = "",
        probe: Callable[[Link], Awaitable[object]] | None = None,
        watch_interval_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.link = link
        self.name = name or link.name
        self.backoff = backoff or Backoff()
        self._on_connect = on_connect
        self._lock = asyncio.Lock()
        self._state = LinkState.OFFLINE
        self._online = asyncio.Event()
        self._reconnector: asyncio.Task[None] | None = None
        self.last_error: str = ""
        self.attempts = 0
        self._probe = probe
        self.watch_interval_s = watch_interval_s if probe is not None else 0.0
        """Seconds idle before the link is probed; 0: never."""
        self._watcher: asyncio.Task[None] | None = None
        self._idle_since = 0
        """When the latest exchange ended (CLOCK_MONOTONIC ns)."""
        self.probes = 0
        """Probes sent since the connection was made (what the watch cost the wire)."""
        self._losing: asyncio.Task[None] | None = None
        link.on_lost(self._lost)

    @property
    def state(self) -> LinkState:
        return self._state

    def _set_state(self, state: LinkState, detail: str = "") -> None:
        if state is self._state:
            return
        self._state = state
        if state is LinkState.ONLINE:
            self._online.set()
        else:
            self._online.clear()
        self._emit(InstrumentEvent(self.name, "state", state=state, detail=detail))

    async def open(self) -> None:
        """Connect once; raise the reason if the device cannot be reached."""
        async with self._lock:
            await self._connect_locked(on_failure=LinkState.OFFLINE)

    async def open_or_retry(self) -> InstrumentError | None:
        """Connect once; if that fails, keep trying in the background (jittered backoff)
        and return the reason, so a daemon can start with an instrument still missing."""
        try:
            await self.open()
        except InstrumentError as exc:
            async with self._lock:
                self._set_state(LinkState.BACKOFF, str(exc))
                if self._reconnector is None or self._reconnector.done():
                    self._reconnector = asyncio.create_task(
                        self._reconnect(), name=f"reconnect-{self.name}")
            return exc
        return None

    async def _connect_locked(self, *, on_failure: LinkState) -> None:
        self._set_state(LinkState.CONNECTING)
        try:
            await self.link.open()
            self.link.discard_input()
            await self._on_connect(self.link)
        except BaseException as exc:
            await self.link.close()
            self.last_error = str(exc) or type(exc).__name__
            self._set_state(on_failure, self.last_error)
            raise
        self.attempts = 0
        self._idle_since = time.monotonic_ns()
        self._set_state(LinkState.ONLINE)
        if self.watch_interval_s > 0 and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.create_task(self._watch(), name=f"watch-{self.name}")

    async def run(self, exchange: Callable[[Link], Awaitable[T]]) -> T:
        """Run one exchange with the link held exclusively.

        Raises :class:`InstrumentClosed` at once while the instrument is offline; a link
        fault drops the link, starts reconnection and is re-raised to the caller.
        """
        async with self._lock:
            if self._state is not LinkState.ONLINE:
                raise InstrumentClosed(
                    f"offline ({self._state}); last error: {self.last_error or 'none'}",
                    instrument=self.name,
                )
            try:
                return await exchange(self.link)
            except LINK_FAULTS as exc:
                await self._drop(str(exc))
                raise
            finally:
                if self._watcher is not None:  # only the watch reads it: no clock otherwise
                    self._idle_since = time.monotonic_ns()

    def _lost(self, why: str) -> None:
        """The device closed the link. With a command on the wire, its read fails and drops
        the link; an idle link is dropped here, so that a device that went away is offline
        now, not at the next command or probe."""
        if self._state is LinkState.ONLINE and not self._lock.locked():
            self._losing = asyncio.get_running_loop().create_task(
                self._drop_idle(why), name=f"lost-{self.name}")

    async def _drop_idle(self, why: str) -> None:
        async with self._lock:
            if self._state is LinkState.ONLINE:
                await self._drop(why)

    async def _watch(self) -> None:
        """Probe the link whenever it has been idle for the watch interval. Only while
        online: an instrument in backoff is the reconnector's."""
        assert self._probe is not None
        interval_ns = int(self.watch_interval_s * 1e9)
        while self._state is not LinkState.CLOSED:
            if self._state is not LinkState.ONLINE:
                await self._online.wait()
                continue
            due = self._idle_since + interval_ns - time.monotonic_ns()
            if due > 0:
                await asyncio.sleep(due / 1e9)
                continue
            if self._lock.locked():
                # A command is on the wire: it is proof of life, and the probe must not
                # queue behind it and delay the command after it.
                self._idle_since = time.monotonic_ns()
                continue
            self.probes += 1
            try:
                await self.run(self._probe)
            except InstrumentError as exc:
                # run() has dropped the link on a fault, and reconnection is under way.
                log.info("%s: the idle link's probe failed: %s", self.name, exc,
                         extra={"instrument": self.name})
            except Exception:
                # A driver bug in its probe must not end the watch (nor the daemon).
                log.exception("%s: the idle link's probe failed", self.name,
                              extra={"instrument": self.name})

    async def _drop(self, reason: str) -> None:
        self.last_error = reason
        log.info("%s: dropping link: %s", self.name, reason, extra={"instrument": self.name})
        await self.link.close()
        self._set_state(LinkState.BACKOFF, reason)
        if self._reconnector is None or self._reconnector.done():
            self._reconnector = asyncio.create_task(
                self._reconnect(), name=f"reconnect-{self.name}"
            )

    async def _reconnect(self) -> None:
        while self._state is LinkState.BACKOFF:
            self.attempts += 1
            await asyncio.sleep(self.backoff.delay(self.attempts))
            async with self._lock:
                if self._state is not LinkState.BACKOFF:
                    return
                try:
                    await self._connect_locked(on_failure=LinkState.BACKOFF)
                except InstrumentError as exc:
                    log.info("%s: reconnect attempt %d failed: %s", self.name, self.attempts, exc,
                             extra={"instrument": self.name})
                except Exception:
                    # A driver bug while resynchronising must not end the reconnect loop.
                    log.exception("%s: reconnect attempt %d failed", self.name, self.attempts,
                                  extra={"instrument": self.name})

    async def wait_online(self, timeout: float) -> None:
        """Wait until the link is up again (raises TimeoutError)."""
        async with asyncio.timeout(timeout):
            await self._online.wait()

    async def close(self) -> None:
        for task in (self._reconnector, self._watcher, self._losing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reconnector = self._watcher = self._losing = None
        async with self._lock:
            await self.link.close()
            self._set_state(LinkState.CLOSED)
