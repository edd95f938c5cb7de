"""ophyd-async Devices on a running daemon, for Bluesky plans (the ``bluesky`` extra).

Every change a plan makes is a request to the daemon's API, recorded and timed like any
other; a reading asks the daemon, which asks the instrument::

    from bluesky import RunEngine, plans as bp
    from ophyd_async.core import init_devices
    from labd.adapters.ophyd import DaemonMeter, DaemonSwitch

    RE = RunEngine()
    with init_devices():
        ocs = DaemonSwitch("ocs1", ports=[1], url="http://rack:8470", token=KEY)
        pm = DaemonMeter("pm1", channels=[1, 2], url="http://rack:8470", token=KEY)
    RE(bp.list_scan([pm, ocs], ocs.ports[1].output, [17, 18]))

Values are what JSON and event-model take as they are: a port's ``output`` an integer (0:
in no circuit), its ``power`` and a channel's a float in dBm (NaN: no meter on the port's
output, or over range), the whole map ``[[ingress, egress], ...]`` (an array of pairs, as
the API writes it; it is set from a dict ``{1: 17}`` or pairs alike). The client is made
when the Device connects, on the RunEngine's loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

try:
    from bluesky.protocols import Reading, Triggerable
    from event_model import DataKey
    from ophyd_async.core import (
        AsyncStatus,
        Callback,
        Device,
        DeviceConnector,
        DeviceVector,
        NotConnectedError,
        SignalBackend,
        SignalR,
        SignalRW,
        SoftSignalBackend,
        StandardReadable,
        StandardReadableFormat,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("labd.adapters.ophyd needs ophyd-async and bluesky: "
                      "pip install 'labd[bluesky]'") from exc

from labd.adapters.daemon import (
    HOLD_TTL_S,
    DaemonTarget,
    HeldPorts,
    MapLike,
    MeterOnDaemon,
    Pairs,
    SwitchOnDaemon,
    pairs_of,
    target_of,
)
from labd.client.api import DaemonClient
from labd.errors import DaemonError

#: dBm to a hundredth: more than any meter's accuracy.
_DBM_PRECISION = 2


class _Session:
    """The daemon's client of one Device, made on the loop the Device connects on."""

    def __init__(self, target: DaemonTarget) -> None:
        self.target = target
        self._client: DaemonClient | None = None

    @property
    def client(self) -> DaemonClient:
        if self._client is None:
            raise DaemonError(f"not connected to the daemon at {self.target.url}: connect "
                              "the Device first (init_devices)")
        return self._client

    @property
    def connected(self) -> bool:
        """Whether a client was made (not in ``init_devices(mock=True)``)."""
        return self._client is not None

    def open(self) -> DaemonClient:
        if self._client is None:
            self._client = self.target.client()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class _DaemonConnector(DeviceConnector):
    """Makes the client and checks that the daemon has the instrument before the signals
    connect, on the loop that connects them (the RunEngine's)."""

    def __init__(self, session: _Session, check: Callable[[DaemonClient], Awaitable[None]]
                 ) -> None:
        self.session, self.check = session, check

    async def connect_real(self, device: Device, timeout: float,
                           force_reconnect: bool) -> None:
        client = self.session.open()
        try:
            async with asyncio.timeout(timeout):
                await self.check(client)
        except (DaemonError, TimeoutError) as exc:
            # ophyd-async reports every device that failed to connect in one message.
            raise NotConnectedError({device.name or "daemon": exc}) from exc
        await super().connect_real(device, timeout, force_reconnect)


class _ApiBackend(SignalBackend[Any]):
    """A scalar whose value is the daemon's: read by ``getter``, put by ``setter``. Not a
    soft signal, so that ``init_devices(mock=True)`` puts ophyd-async's mock in its place
    (a soft backend would be kept, and call the daemon); the value, its conversion and its
    callbacks are kept by a soft backend inside."""

    def __init__(self, datatype: type[Any], getter: Callable[[], Awaitable[Any]],
                 setter: Callable[[Any], Awaitable[None]] | None = None,
                 **metadata: Any) -> None:
        self._soft = SoftSignalBackend(datatype, getter=getter, setter=setter, **metadata)
        super().__init__(datatype)

    def source(self, name: str, read: bool) -> str:
        return f"labd://{name}"

    async def connect(self, timeout: float) -> None:
        """Nothing to connect: the Device's connector has made the client."""

    async def put(self, value: Any) -> None:
        await self._soft.put(value)

    async def get_datakey(self, source: str) -> DataKey:
        return await self._soft.get_datakey(source)

    async def get_reading(self) -> Reading[Any]:
        return await self._soft.get_reading()

    async def get_value(self) -> Any:
        return await self._soft.get_value()

    async def get_setpoint(self) -> Any:
        return await self._soft.get_setpoint()

    def set_callback(self, callback: Callback[Reading[Any]] | None) -> None:
        self._soft.set_callback(callback)


def _signal_r(datatype: type[Any], getter: Callable[[], Awaitable[Any]], **metadata: Any
              ) -> SignalR[Any]:
    return SignalR(backend=_ApiBackend(datatype, getter, **metadata))


class _MapBackend(SignalBackend[Any]):
    """A switch's map as ``[[ingress, egress], ...]``: an array of pairs in documents (a
    JSON list; event-model has no dtype for a mapping), set from pairs or a dict."""

    def __init__(self, switch: Callable[[], SwitchOnDaemon], source: str) -> None:
        super().__init__(None)
        self._switch, self._source = switch, source
        self._reading: Reading[Any] = Reading(value=[], timestamp=time.time(),
                                              alarm_severity=0)
        self._setpoint: Pairs = []
        self._callback: Callback[Reading[Any]] | None = None

    def source(self, name: str, read: bool) -> str:
        return self._source

    async def connect(self, timeout: float) -> None:
        """Nothing to connect: the Device's connector has made the client."""

    def _update(self, pairs: Pairs) -> None:
        self._reading = Reading(value=sorted(pairs), timestamp=time.time(), alarm_severity=0)
        if self._callback is not None:
            self._callback(self._reading)

    async def _read(self) -> None:
        observed = await self._switch().cross_connects()
        self._update([[a, b] for a, b in observed.items()])

    async def put(self, value: MapLike | None) -> None:
        # ophyd-async puts None for "the default": a switch's default is no circuits.
        self._setpoint = pairs_of(value)
        await self._switch().replace(self._setpoint)
        await self._read()

    async def get_datakey(self, source: str) -> DataKey:
        return DataKey(source=source, dtype="array", shape=[None, 2], dtype_numpy="<i8")

    async def get_reading(self) -> Reading[Any]:
        await self._read()
        return self._reading

    async def get_value(self) -> Any:
        await self._read()
        return self._reading["value"]

    async def get_setpoint(self) -> Any:
        return self._setpoint

    def set_callback(self, callback: Callback[Reading[Any]] | None) -> None:
        self._callback = callback
        if callback is not None:
            callback(self._reading)


class MapSignal(SignalRW[Any]):
    """A switch's whole map: read with the device, never a plot's axis (its hints name no
    field, so BestEffortCallback plots a scan over it against time, and tables the ports'
    scalar signals)."""

    @property
    def hints(self) -> dict[str, list[str]]:
        return {"fields": []}


class _Polled(StandardReadable, Triggerable):
    """A device read by asking the daemon. Bluesky stages what it reads, and a staged
    signal is read from ophyd-async's cache: :meth:`trigger` (which plans call before every
    read) asks, and refreshes the cache. Outside a plan, reading a signal asks at once."""

    _polled: tuple[SignalR[Any], ...] = ()

    def _polled_signals(self) -> Iterator[SignalR[Any]]:
        yield from self._polled
        for _, child in self.children():
            if isinstance(child, _Polled):
                yield from child._polled_signals()
            elif isinstance(child, DeviceVector):
                for item in child.values():
                    if isinstance(item, _Polled):
                        yield from item._polled_signals()

    @AsyncStatus.wrap
    async def trigger(self) -> None:
        # In order: a port's power follows the output just read.
        for signal in self._polled_signals():
            await signal.get_value(cached=False)


class DaemonPort(_Polled):
    """One port of a switch on the daemon: ``output``, the port it is in circuit with (0:
    none; set it to move the port, ``bps.mv(ocs.ports[1].output, 18)``), and ``power``, dBm
    at the meter channel that output feeds (NaN where none does)."""

    def __init__(self, switch: Callable[[], SwitchOnDaemon], port: int, name: str = ""
                 ) -> None:
        self.port = port
        last = {"output": 0}

        async def output() -> int:
            last["output"] = await switch().output(port)
            return last["output"]

        async def set_output(value: int | None) -> None:
            await switch().set_output(port, 0 if value is None else value)

        async def power() -> float:
            # The output read just before in the same trigger (DaemonSwitch reads it first).
            return await switch().power(port, last["output"])

        with self.add_children_as_readables(StandardReadableFormat.HINTED_SIGNAL):
            self.output = SignalRW(backend=_ApiBackend(int, output, set_output))
            self.power = _signal_r(float, power, units="dBm", precision=_DBM_PRECISION)
        self._polled = (self.output, self.power)
        super().__init__(name=name)


class DaemonSwitch(_Polled):
    """A switch on the daemon. ``cross_connects`` is its whole map (set it to hold exactly
    those circuits: one reconfiguration, pairs that stay untouched); ``ports[n]`` each port
    named (:class:`DaemonPort`). Give ``url`` (and ``token``), ``lab`` (the lab file the
    daemon runs) or ``target``."""

    def __init__(self, switch: str, *, ports: Iterable[int] = (),
                 hold: Iterable[int] | None = None, holder: str = "a Bluesky plan",
                 hold_ttl_s: float = HOLD_TTL_S,
                 url: str | None = None, token: str | None = None,
                 lab: str | os.PathLike[str] | None = None,
                 target: DaemonTarget | None = None, name: str = "") -> None:
        self.target = target_of(target or url, token=token, lab=lab)
        self._session = _Session(self.target)
        self.switch_id = switch
        ports = list(ports)
        self.hold_ports = list(ports if hold is None else hold)
        self.holder, self.hold_ttl_s = holder, hold_ttl_s
        self._holds: dict[str, str] = {}
        self._held: HeldPorts | None = None
        source = f"{self.target.url}/v1/switches/{switch}"
        with self.add_children_as_readables():
            self.cross_connects = MapSignal(backend=_MapBackend(self._on_daemon, source))
            self.ports = DeviceVector({p: DaemonPort(self._on_daemon, p)
                                       for p in ports})
        self._polled = (self.cross_connects,)

        async def check(client: DaemonClient) -> None:
            await SwitchOnDaemon(client, switch).check()

        super().__init__(name=name, connector=_DaemonConnector(self._session, check))

    def _on_daemon(self) -> SwitchOnDaemon:
        return SwitchOnDaemon(self._session.client, self.switch_id, self._holds)

    @AsyncStatus.wrap
    async def stage(self) -> None:
        """Staged by a plan that moves or reads it (the RunEngine stages a signal's root
        Device): hold ``hold`` (by default the ports named) for the plan, renewed until it
        unstages. A mock Device holds nothing."""
        await super().stage()
        if self.hold_ports and self._held is None and self._session.connected:
            self._held = await HeldPorts(self._session.client, self.switch_id,
                                         self.hold_ports, self.holder,
                                         ttl_s=self.hold_ttl_s, holds=self._holds).take()

    @AsyncStatus.wrap
    async def unstage(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            await held.release()
        await super().unstage()

    async def close(self) -> None:
        """Close the client (on the loop it was made on: the RunEngine's)."""
        if self._held is not None:
            await self._held.release()
            self._held = None
        await self._session.close()


class DaemonMeterChannel(_Polled):
    """One channel of a meter on the daemon: ``power`` in dBm (each read waits one
    averaging time; NaN over range)."""

    def __init__(self, meter: Callable[[], MeterOnDaemon], channel: int, name: str = ""
                 ) -> None:
        async def power() -> float:
            return await meter().read_power(channel)

        with self.add_children_as_readables(StandardReadableFormat.HINTED_SIGNAL):
            self.power = _signal_r(float, power, units="dBm", precision=_DBM_PRECISION)
        self._polled = (self.power,)
        super().__init__(name=name)


class DaemonMeter(_Polled):
    """A power meter on the daemon, ``channels[n]`` for each channel named (default 1).
    :meth:`read_series` takes N readings at once (a logging meter: ``interval_s`` apart)."""

    def __init__(self, meter: str, *, channels: Iterable[int] = (1,),
                 url: str | None = None, token: str | None = None,
                 lab: str | os.PathLike[str] | None = None,
                 target: DaemonTarget | None = None, name: str = "") -> None:
        self.target = target_of(target or url, token=token, lab=lab)
        self._session = _Session(self.target)
        self.meter_id = meter
        with self.add_children_as_readables():
            self.channels = DeviceVector({c: DaemonMeterChannel(self._on_daemon, c)
                                          for c in channels})

        async def check(client: DaemonClient) -> None:
            await MeterOnDaemon(client, meter).describe()

        super().__init__(name=name, connector=_DaemonConnector(self._session, check))

    def _on_daemon(self) -> MeterOnDaemon:
        return MeterOnDaemon(self._session.client, self.meter_id)

    async def read_series(self, channels: Iterable[int] | None = None, *, points: int,
                          interval_s: float | None = None) -> dict[int, list[float]]:
        """``points`` readings per channel (all of this Device's by default)."""
        chosen = list(self.channels) if channels is None else list(channels)
        return await self._on_daemon().read(chosen, points=points, interval_s=interval_s)

    async def close(self) -> None:
        await self._session.close()


__all__ = ["DaemonMeter", "DaemonMeterChannel", "DaemonPort", "DaemonSwitch", "MapSignal"]
