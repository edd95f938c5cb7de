"""The drivers without an event loop in sight: for scripts, notebooks and QCoDeS.

Every call is the driver's own coroutine, run on an event loop in a background thread
(:class:`LoopThread`) while the caller waits for its result::

    from instruments.adapters.blocking import open_switch

    with open_switch("polatis-scpi", "tcp://10.0.0.20:5025") as ocs:
        ocs.connect([(1, 17), (2, 18)])
        print(ocs.cross_connects())         # {1: 17, 2: 18}

The driver keeps doing what it does on its loop while the caller is away: it reconnects
after a fault, watches an idle link, reports drift. Errors are the drivers' own
(``instruments.errors``), raised in the caller's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import numpy as np

from instruments.errors import InvalidRequest
from instruments.events import LinkState
from instruments.exchange import Exchange
from instruments.instrument import Instrument
from instruments.keysight import KeysightN77xx
from instruments.meter import MeterInfo, PowerMeter
from instruments.registry import switch_driver
from instruments.switch import CrossConnects, OpticalSwitch, Pair, PortState, SwitchInfo
from instruments.thorlabs import ThorlabsPM100

T = TypeVar("T")
D = TypeVar("D", bound=Instrument)
S = TypeVar("S", bound=OpticalSwitch)
M = TypeVar("M", bound=PowerMeter)

#: Meter driver names, as a lab file writes them (the switches' are SWITCH_DRIVERS).
METER_DRIVERS: dict[str, type[PowerMeter]] = {
    cls.driver: cls for cls in (KeysightN77xx, ThorlabsPM100)
}


class LoopThread:
    """An event loop running in a daemon thread of its own, for as long as the block::

        with LoopThread() as loop:
            reply = loop.run(driver.cross_connects())

    Several instruments may share one (their drivers then run side by side on it, as in
    the daemon); a driver must stay on the loop it was opened on.
    """

    def __init__(self, *, name: str = "instruments-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(f"{self.name} is not running: start it (or use `with`) first")
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or its exception)."""
        loop = self.loop
        if self._thread is threading.current_thread():
            coroutine.close()
            # Waiting here for work queued behind us would never end.
            raise RuntimeError(f"LoopThread.run called from {self.name} itself; await the "
                               "coroutine there instead")
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C in a notebook: the call is given up on the loop too, not left running.
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop once what runs on it has been cancelled, and join the thread."""
        if self._loop is None or self._thread is None:
            return
        loop, thread = self._loop, self._thread
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(_cancel_others(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
        thread.join()
        self._loop = self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


async def _cancel_others() -> None:
    """Cancel every task on this loop but the caller, and let them finish: a driver left
    open would otherwise be cut off mid-exchange when the loop stops."""
    me = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not me]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class BlockingInstrument(Generic[D]):
    """A driver whose coroutines are called as plain methods. Open it with ``with`` (or
    :meth:`open` and :meth:`close`); ``loop`` shares a :class:`LoopThread` with other
    instruments, else the instrument runs one of its own."""

    def __init__(self, driver: D, *, loop: LoopThread | None = None) -> None:
        self.driver = driver
        self._own_loop = loop is None
        self.loop = loop or LoopThread(name=f"loop-{driver.name}")
        self._open = False

    @property
    def name(self) -> str:
        return self.driver.name

    @property
    def state(self) -> LinkState:
        return self.driver.state

    def open(self) -> None:
        if self._open:
            return
        self.loop.start()
        try:
            self.loop.run(self.driver.open())
        except BaseException:
            if self._own_loop:
                self.loop.close()
            raise
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.loop.run(self.driver.close())
            finally:
                if self._own_loop:
                    self.loop.close()

    def call(self, method: Callable[[D], Awaitable[T]]) -> T:
        """Any of the driver's coroutines, e.g. a family's own:
        ``pm.call(lambda meter: meter.set_averaging_time(1, 0.01))``."""

        async def run() -> T:
            return await method(self.driver)

        return self.loop.run(run())

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class BlockingSwitch(BlockingInstrument[S]):
    """:class:`~instruments.switch.OpticalSwitch`'s capability, each call blocking until
    the device has answered."""

    @property
    def info(self) -> SwitchInfo | None:
        return self.driver.info

    @property
    def expected(self) -> CrossConnects:
        """The map the driver believes the device holds (no exchange)."""
        return dict(self.driver.expected)

    def connect(self, pairs: Iterable[Pair] | Mapping[int, int]) -> Exchange:
        return self.loop.run(self.driver.connect(pairs))

    def disconnect(self, ports: Iterable[int]) -> Exchange:
        return self.loop.run(self.driver.disconnect(ports))

    def replace(self, pairs: Iterable[Pair] | Mapping[int, int]) -> Exchange:
        return self.loop.run(self.driver.replace(pairs))

    def cross_connects(self) -> CrossConnects:
        return self.loop.run(self.driver.cross_connects())

    def port_states(self, ports: Iterable[int] | None = None) -> dict[int, PortState]:
        return self.loop.run(self.driver.port_states(ports))

    def set_ports_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        self.loop.run(self.driver.set_ports_enabled(ports, enabled))

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        return self.loop.run(self.driver.port_power(ports))

    def paths(self) -> dict[int, list[tuple[int, str]]] | None:
        return self.driver.paths()


class BlockingMeter(BlockingInstrument[M]):
    """:class:`~instruments.meter.PowerMeter`'s capability, each call blocking until the
    meter has answered (a reading waits its averaging time)."""

    @property
    def info(self) -> MeterInfo | None:
        return self.driver.info

    def read_power(self, channel: int = 1) -> float:
        return self.loop.run(self.driver.read_power(channel))

    def set_wavelength(self, channel: int, nm: float) -> None:
        self.loop.run(self.driver.set_wavelength(channel, nm))

    def wavelength(self, channel: int = 1) -> float:
        return self.loop.run(self.driver.wavelength(channel))

    def set_unit(self, channel: int, unit: str) -> None:
        self.loop.run(self.driver.set_unit(channel, unit))

    def window_s(self, channel: int) -> float:
        return self.driver.window_s(channel)

    def start_logging(self, channels: list[int], points: int, atime_s: float) -> int:
        return self.loop.run(self.driver.start_logging(channels, points, atime_s))

    def logging_complete(self, channel: int) -> bool:
        return self.loop.run(self.driver.logging_complete(channel))

    def wait_logging(self, channel: int, *, poll_s: float = 0.005,
                     timeout_s: float = 5.0) -> None:
        self.loop.run(self.driver.wait_logging(channel, poll_s=poll_s, timeout_s=timeout_s))

    def fetch_log(self, channel: int) -> np.ndarray:
        return self.loop.run(self.driver.fetch_log(channel))


def meter_driver(name: str) -> type[PowerMeter]:
    try:
        return METER_DRIVERS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown meter driver {name!r}; known: {', '.join(sorted(METER_DRIVERS))}"
        ) from None


def open_switch(driver: str, address: str, *, loop: LoopThread | None = None,
                **options: Any) -> BlockingSwitch[OpticalSwitch]:
    """The switch, open: ``with open_switch("polatis-scpi", "tcp://host:5025") as ocs:``,
    or keep it (a notebook) and :meth:`~BlockingInstrument.close` it when done."""
    switch = BlockingSwitch(switch_driver(driver)(address, **options), loop=loop)
    switch.open()
    return switch


def open_meter(driver: str, address: str, *, loop: LoopThread | None = None,
               **options: Any) -> BlockingMeter[PowerMeter]:
    """The meter, open: ``with open_meter("keysight-n77xx", "tcp://host:5025") as pm:``."""
    meter = BlockingMeter(meter_driver(driver)(address, **options), loop=loop)
    meter.open()
    return meter


__all__ = [
    "METER_DRIVERS",
    "BlockingInstrument",
    "BlockingMeter",
    "BlockingSwitch",
    "LoopThread",
    "meter_driver",
    "open_meter",
    "open_switch",
]
