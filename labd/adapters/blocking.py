"""A running daemon's switches and meters as plain blocking methods, for scripts, notebooks
and QCoDeS::

    from labd.adapters.blocking import DaemonLab

    with DaemonLab("http://rack:8470", token=KEY) as lab:   # or DaemonLab(lab="lab.toml")
        ocs, pm = lab.switch("ocs1"), lab.meter("pm1")
        ocs.set_output(1, 17)              # one reconfiguration, recorded by the daemon
        print(ocs.cross_connects())        # {1: 17}
        print(pm.read_power(1))            # dBm, read now
        print(pm.read([1, 2], points=1000, interval_s=1e-3))  # a logged series

The client runs on an event loop in a background thread (several labs may share one
``LoopThread``); errors are labd's: a refusal of the daemon is a ``DaemonError`` with its
status and message, a value that is no port a ``RequestError``.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from instruments.adapters.blocking import LoopThread
from labd.adapters.daemon import (
    HOLD_TTL_S,
    DaemonTarget,
    HeldPorts,
    MapLike,
    MeterOnDaemon,
    SwitchOnDaemon,
    target_of,
)
from labd.client.api import DaemonClient

T = TypeVar("T")


class DaemonLab:
    """A daemon's API, blocking: :meth:`switch` and :meth:`meter` give its instruments,
    :meth:`get` any read of the API. Give the daemon's ``url`` (and ``token``), ``lab``
    (the lab file it runs: its address from the file's ``[daemon]`` table) or ``target``.
    Open with ``with`` (or :meth:`open` and :meth:`close`)."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 lab: str | os.PathLike[str] | None = None,
                 target: DaemonTarget | None = None, loop: LoopThread | None = None
                 ) -> None:
        self.target = target_of(target or url, token=token, lab=lab)
        self._own_loop = loop is None
        self.loop = loop or LoopThread(name="labd-client")
        self._client: DaemonClient | None = None
        self.holds: dict[str, str] = {}
        """The holds this lab's switches name with their changes: switch → hold id."""

    @property
    def url(self) -> str:
        return self.target.url

    def open(self) -> Self:
        if self._client is None:
            self.loop.start()

            async def make() -> DaemonClient:
                return self.target.client()  # on the loop it will be used on

            self._client = self.loop.run(make())
        return self

    def close(self) -> None:
        if self._client is not None:
            self.loop.run(self._client.close())
            self._client = None
        if self._own_loop:
            self.loop.close()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def client(self) -> DaemonClient:
        if self._client is None:
            self.open()
        assert self._client is not None
        return self._client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the client on its loop and wait for its result."""
        return self.loop.run(coroutine)

    def get(self, path: str, **params: Any) -> Any:
        """Any read of the API: ``lab.get("/v1/reconfigurations", switch="ocs1")``."""
        return self.run(self.client.get(path, **params))

    def switch(self, switch: str) -> LabSwitch:
        """The switch ``switch`` (DaemonError if the daemon has none by that id)."""
        made = LabSwitch(self, switch)
        self.run(made.on_daemon.check())
        return made

    def hold(self, switch: str, ports: Iterable[int], *, holder: str,
             ttl_s: float = HOLD_TTL_S) -> LabHold:
        """Hold ``ports`` of ``switch`` for the block (``with lab.hold(...):``): others'
        changes to them are refused, naming ``holder``; this lab's switches make theirs.
        Renewed in the background every third of ``ttl_s``; it ends ``ttl_s`` after this
        process stops renewing it, whatever the cause."""
        return LabHold(self, HeldPorts(self.client, switch, ports, holder, ttl_s=ttl_s,
                                       holds=self.holds))

    def meter(self, meter: str) -> LabMeter:
        made = LabMeter(self, meter)
        made.info = self.run(made.on_daemon.describe())
        return made


class LabHold:
    """A hold taken on entering the block and released on leaving it (or by
    :meth:`release`); ``id`` and ``lost`` (why renewing failed) are the hold's."""

    def __init__(self, lab: DaemonLab, held: HeldPorts) -> None:
        self.lab, self.held = lab, held

    @property
    def id(self) -> str | None:
        return self.held.id

    @property
    def lost(self) -> Exception | None:
        return self.held.lost

    def take(self) -> Self:
        self.lab.run(self.held.take())
        return self

    def release(self) -> None:
        self.lab.run(self.held.release())

    def __enter__(self) -> Self:
        return self.take()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class LabSwitch:
    """One switch of the daemon, each change a request to its API."""

    def __init__(self, lab: DaemonLab, switch: str) -> None:
        self.lab, self.id = lab, switch
        self.on_daemon = SwitchOnDaemon(lab.client, switch, lab.holds)

    def state(self) -> dict[str, Any]:
        return self.lab.run(self.on_daemon.state())

    def cross_connects(self) -> dict[int, int]:
        """The circuits, as the daemon last read them from the device."""
        return self.lab.run(self.on_daemon.cross_connects())

    def replace(self, value: MapLike | None) -> dict[str, Any]:
        """Hold exactly these circuits (``{1: 17}`` or pairs); the reconfiguration's
        record as the API answers it."""
        return self.lab.run(self.on_daemon.replace(value))

    def connect(self, value: MapLike) -> dict[str, Any]:
        return self.lab.run(self.on_daemon.connect(value))

    def disconnect(self, ports: Iterable[int]) -> dict[str, Any]:
        return self.lab.run(self.on_daemon.disconnect(ports))

    def output(self, port: int) -> int:
        """The port ``port`` is in circuit with (0: none)."""
        return self.lab.run(self.on_daemon.output(port))

    def set_output(self, port: int, output: int) -> dict[str, Any] | None:
        """Put ``port`` in circuit with ``output`` (0: none), the rest left as it is."""
        return self.lab.run(self.on_daemon.set_output(port, output))

    def power(self, port: int) -> float:
        """dBm at the meter channel ``port``'s output feeds (NaN where none does)."""
        return self.lab.run(self.on_daemon.power(port))


class LabMeter:
    """One power meter of the daemon, read on demand."""

    info: dict[str, Any]
    """What ``GET /v1/meters/{id}`` said when it was made: channels, logging, wiring."""

    def __init__(self, lab: DaemonLab, meter: str) -> None:
        self.lab, self.id = lab, meter
        self.on_daemon = MeterOnDaemon(lab.client, meter)
        self.info = {}

    def read_power(self, channel: int = 1) -> float:
        """dBm now (NaN over range)."""
        return self.lab.run(self.on_daemon.read_power(channel))

    def read(self, channels: Sequence[int] | None = None, *, points: int = 1,
             interval_s: float | None = None) -> dict[int, list[float]]:
        """Per channel (every one by default), ``points`` readings: a series
        ``interval_s`` apart on a meter that logs, else one after another."""
        return self.lab.run(self.on_daemon.read(channels, points=points,
                                                interval_s=interval_s))


__all__ = ["DaemonLab", "LabHold", "LabMeter", "LabSwitch", "LoopThread"]
