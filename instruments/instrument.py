"""What every driver is: an owner of one connection, with a name, its options, a lifecycle
and events. Device families (switches, meters, DAC boards) build their capability on it."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from instruments.connection import Backoff, Connection
from instruments.events import EventSource, InstrumentEvent, LinkState
from instruments.exchange import Exchange
from instruments.link import Link, LinkSettings

T = TypeVar("T")


class Instrument(EventSource, abc.ABC):
    """Use as ``async with Driver(address, ...) as device:``. Every public coroutine of a
    driver holds the instrument for its whole exchange (one command on the wire at a time);
    after a link fault the connection reconnects by itself and calls :meth:`_on_connect`."""

    driver: ClassVar[str]
    default_settings: ClassVar[LinkSettings] = LinkSettings()

    def __init__(self, address: str, *, name: str = "", settings: LinkSettings | None = None,
                 backoff: Backoff | None = None, watch_interval_s: float = 0.0,
                 **options: Any) -> None:
        super().__init__()
        self.name = name or f"{self.driver}@{address}"
        self.options = options
        link = Link(address, settings or self.default_settings, name=self.name)
        self.warnings: list[str] = []
        """What the latest connect warned of (an optional query the device refused), kept
        for whoever asks after the event went by (a start-up report, a snapshot)."""
        self.connection = Connection(link, on_connect=self._connecting, backoff=backoff,
                                     name=self.name, probe=self._idle,
                                     watch_interval_s=watch_interval_s)
        self.connection.add_listener(self._emit)

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def state(self) -> LinkState:
        return self.connection.state

    async def _run(self, exchange: Callable[[Link], Awaitable[T]]) -> T:
        return (await self._timed(exchange))[0]

    async def _timed(self, exchange: Callable[[Link], Awaitable[T]]) -> tuple[T, Exchange]:
        """Run one operation holding the link; its result, and its wire times, read before
        the link is let go (the next operation's would overwrite them)."""
        async def timed(link: Link) -> tuple[T, Exchange]:
            link.mark()
            result = await exchange(link)
            return result, Exchange(link.sent_ns, link.answered_ns, link.activated_ns,
                                    link.acknowledged_ns)

        return await self.connection.run(timed)

    @abc.abstractmethod
    async def _on_connect(self, link: Link) -> None:
        """After every (re)connect: log in, identify, re-read state, report drift."""

    @abc.abstractmethod
    async def _probe(self, link: Link) -> None:
        """One cheap exchange that proves the device is there and the same device (the
        liveness watch's, on an idle link): a link fault if it is gone,
        :class:`~instruments.errors.DeviceRestarted` if it answers as one that restarted."""

    async def _connecting(self, link: Link) -> None:
        self.warnings = []
        await self._on_connect(link)

    async def _idle(self, link: Link) -> None:
        """What the liveness watch sends on an idle link: the probe (a switch may read its
        map instead, its audit)."""
        await self._probe(link)

    def _warn(self, detail: str) -> None:
        """Something the daemon should hear of that is no failure (an optional query the
        device refused, say)."""
        if len(self.warnings) < 16:
            self.warnings.append(detail)
        self._emit(InstrumentEvent(self.name, "warning", detail=detail))
