"""ophyd-async Devices on the drivers, for Bluesky plans (the ``bluesky`` extra).

A switch's cross-connects are one settable signal (setting it is
:meth:`~instruments.switch.OpticalSwitch.replace`, read back from the device), each watched
port's power a readable signal; a meter's channels are readable devices; a mesh is a switch
whose MZI states can be read as well::

    from bluesky import RunEngine, plans as bp
    from ophyd_async.core import init_devices
    from instruments.adapters.ophyd import CrossConnectTable, MeterDevice, SwitchDevice

    RE = RunEngine()
    with init_devices():
        ocs = SwitchDevice(PolatisScpi("tcp://10.0.0.20:5025"), ports=[17, 18])
        pm = MeterDevice(KeysightN77xx("tcp://10.0.0.30:5025"), channels=[1, 2])
    RE(bp.list_scan([pm], ocs.cross_connects,
                    [CrossConnectTable.of({1: 17}), CrossConnectTable.of({1: 18})]))

The driver is opened when its Device connects, on the loop the RunEngine runs its plans on
(where its reconnects and watches then run too); :meth:`close` it there
(``call_in_bluesky_event_loop(ocs.close())``). With ``connect(mock=True)`` the signals are
ophyd-async's mocks and the driver is never opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Self, TypeVar

import numpy as np

try:
    from bluesky.protocols import Reading, Triggerable
    from event_model import DataKey
    from ophyd_async.core import (
        Array1D,
        AsyncStatus,
        Callback,
        Device,
        DeviceConnector,
        DeviceVector,
        NotConnectedError,
        SignalBackend,
        SignalDatatype,
        SignalR,
        SignalRW,
        SoftSignalBackend,
        StandardReadable,
        StandardReadableFormat,
        Table,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("instruments.adapters.ophyd needs ophyd-async and bluesky: "
                      "pip install 'labd[bluesky]'") from exc

from instruments.errors import InstrumentError
from instruments.events import LinkState
from instruments.instrument import Instrument
from instruments.keysight import KeysightN77xx
from instruments.mesh import MeshSwitch
from instruments.meter import PowerMeter
from instruments.switch import CrossConnects, OpticalSwitch, Pair
from instruments.thorlabs import ThorlabsPM100

T = TypeVar("T", bound=SignalDatatype)

#: dBm to a hundredth: more than any meter's accuracy, as the drivers' readings are given.
_DBM_PRECISION = 2


class CrossConnectTable(Table):
    """A switch's cross-connects, one row per circuit: ingress (on an any-to-any switch the
    lower) port and egress (the higher) port."""

    ingress: Array1D[np.int32]
    egress: Array1D[np.int32]

    @classmethod
    def of(cls, pairs: Mapping[int, int] | Iterable[Pair]) -> Self:
        """``CrossConnectTable.of({1: 17, 2: 18})`` or ``.of([(1, 17), (2, 18)])``."""
        rows = sorted(pairs.items() if isinstance(pairs, Mapping) else pairs)
        return cls(ingress=np.array([a for a, _ in rows], dtype=np.int32),
                   egress=np.array([b for _, b in rows], dtype=np.int32))

    def as_dict(self) -> CrossConnects:
        return {int(a): int(b) for a, b in zip(self.ingress, self.egress, strict=True)}

    def __eq__(self, other: object) -> bool:
        # Plans compare positions (a step to where the switch already is is skipped); the
        # model's own comparison of numpy columns has no single truth value.
        if not isinstance(other, CrossConnectTable):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable, as every pydantic model


class _DriverConnector(DeviceConnector):
    """Opens the driver before the Device's signals connect, on the loop that connects them
    (the RunEngine's): the driver's tasks must live where its coroutines are awaited."""

    def __init__(self, driver: Instrument) -> None:
        self.driver = driver

    async def connect_real(self, device: Device, timeout: float,
                           force_reconnect: bool) -> None:
        if self.driver.state in (LinkState.OFFLINE, LinkState.CLOSED):
            try:
                async with asyncio.timeout(timeout):
                    await self.driver.open()
            except (InstrumentError, TimeoutError) as exc:
                # ophyd-async reports every device that failed to connect in one message.
                raise NotConnectedError({device.name or self.driver.name: exc}) from exc
        await super().connect_real(device, timeout, force_reconnect)


class _DriverBackend(SignalBackend[T]):
    """A signal whose value is the driver's: read by ``getter``, put by ``setter``, both
    coroutines of the driver. Not a soft signal, so that ``connect(mock=True)`` gives the
    signal ophyd-async's mock in its place (a soft backend would be kept, and call the
    driver); the value, its conversion and its callbacks are kept by a soft backend
    inside."""

    def __init__(self, datatype: type[T], source: str, *, getter: Callable[[], Awaitable[T]],
                 setter: Callable[[T | None], Awaitable[None]] | None = None,
                 initial_value: T | None = None, units: str | None = None,
                 precision: int | None = None) -> None:
        self._source = source
        self._soft = SoftSignalBackend(datatype, initial_value, units, precision,
                                       getter=getter, setter=setter)
        super().__init__(datatype)

    def source(self, name: str, read: bool) -> str:
        return self._source

    async def connect(self, timeout: float) -> None:
        """Nothing to connect: the device's connector has opened the driver."""

    async def put(self, value: T | None) -> None:
        await self._soft.put(value)

    async def get_datakey(self, source: str) -> DataKey:
        return await self._soft.get_datakey(source)

    async def get_reading(self) -> Reading[T]:
        return await self._soft.get_reading()

    async def get_value(self) -> T:
        return await self._soft.get_value()

    async def get_setpoint(self) -> T:
        return await self._soft.get_setpoint()

    def set_callback(self, callback: Callback[Reading[T]] | None) -> None:
        self._soft.set_callback(callback)


def _read_only(datatype: type[T], source: str, getter: Callable[[], Awaitable[T]],
               **metadata: Any) -> SignalR[T]:
    return SignalR(backend=_DriverBackend(datatype, source, getter=getter, **metadata))


def _read_write(datatype: type[T], source: str, getter: Callable[[], Awaitable[T]],
                setter: Callable[[T | None], Awaitable[None]], **metadata: Any) -> SignalRW[T]:
    return SignalRW(backend=_DriverBackend(datatype, source, getter=getter, setter=setter,
                                           **metadata))


class _Polled(StandardReadable, Triggerable):
    """A device read by asking the instrument. Bluesky stages what it reads, and a staged
    signal is read from ophyd-async's cache, kept by monitors: an instrument is no monitor,
    so :meth:`trigger` (which plans call before every read) asks it and refreshes the cache.
    Outside a plan, reading a signal asks the instrument at once."""

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
        # One driver serialises its own exchanges; several signals may be asked at once.
        await asyncio.gather(*(signal.get_value(cached=False)
                               for signal in self._polled_signals()))


class _DriverDevice(_Polled):
    def __init__(self, driver: Instrument, name: str) -> None:
        self.driver = driver
        # No name given: init_devices() names it after its variable, as any Device.
        super().__init__(name=name, connector=_DriverConnector(driver))

    async def close(self) -> None:
        """Close the driver (on the loop it was opened on: the RunEngine's)."""
        await self.driver.close()


class SwitchPort(_Polled):
    """One port of a switch with power monitors: ``power`` in dBm."""

    def __init__(self, switch: OpticalSwitch, port: int, name: str = "") -> None:
        async def power() -> float:
            return (await switch.port_power([port]))[port]

        with self.add_children_as_readables(StandardReadableFormat.HINTED_SIGNAL):
            self.power = _read_only(float, f"{switch.name}:port_power({port})", power,
                                    units="dBm", precision=_DBM_PRECISION)
        self._polled = (self.power,)
        super().__init__(name=name)


class SwitchDevice(_DriverDevice):
    """An optical switch. ``cross_connects`` (a :class:`CrossConnectTable`) is set with
    ``bps.mv``: the switch then holds exactly those circuits (pairs that stay are not
    touched), and the signal reads them back from the device, with every reading of the
    device. ``ports`` names the ports
    whose power is read with the device (``ports[17].power``); a switch without monitors
    (a mesh, a Polatis I-OST) has none to name."""

    def __init__(self, switch: OpticalSwitch, *, ports: Iterable[int] = (),
                 name: str = "") -> None:
        self.switch = switch

        async def read() -> CrossConnectTable:
            return CrossConnectTable.of(await switch.cross_connects())

        async def write(table: CrossConnectTable | None) -> None:
            # ophyd-async puts None for "the default": a switch's default is no circuits.
            await switch.replace({} if table is None else table.as_dict())

        with self.add_children_as_readables():
            # Read with the device, so every event says which circuits its readings saw.
            self.cross_connects = _read_write(
                CrossConnectTable, f"{switch.name}:cross_connects", read, write)
            self.ports = DeviceVector({p: SwitchPort(switch, p) for p in ports})
        self._polled = (self.cross_connects,)
        super().__init__(switch, name)


class MeshDevice(SwitchDevice):
    """A programmable mesh: a switch (``cross_connects``) whose ``elements`` reads each MZI's
    state, ``bar`` or ``cross``, as the board's voltages set it."""

    def __init__(self, mesh: MeshSwitch, *, name: str = "") -> None:
        async def read() -> Sequence[str]:
            await mesh.cross_connects()  # reads the board's voltages, hence the states
            return [mesh.states[k] for k in range(mesh.elements)]

        with self.add_children_as_readables():
            # The length is known before the board is read: describe() says it from the start.
            self.elements = _read_only(
                Sequence[str],  # type: ignore[type-abstract]  # ophyd-async's list-of-str type
                f"{mesh.name}:elements", read, initial_value=["cross"] * mesh.elements)
        super().__init__(mesh, name=name)
        self._polled = (*self._polled, self.elements)


class MeterChannel(_Polled):
    """One channel of a power meter: ``power`` in dBm (each read waits one averaging time),
    ``wavelength`` in nm (configuration). A Keysight channel adds ``averaging_time`` (s), a
    Thorlabs meter ``averages`` (samples per reading)."""

    def __init__(self, meter: PowerMeter, channel: int, name: str = "") -> None:
        async def power() -> float:
            return await meter.read_power(channel)

        async def wavelength() -> float:
            return await meter.wavelength(channel)

        async def set_wavelength(nm: float | None) -> None:
            if nm is not None:
                await meter.set_wavelength(channel, nm)

        with self.add_children_as_readables(StandardReadableFormat.HINTED_SIGNAL):
            self.power = _read_only(float, f"{meter.name}:read_power({channel})", power,
                                    units="dBm", precision=_DBM_PRECISION)
        self._polled = (self.power,)
        with self.add_children_as_readables(StandardReadableFormat.CONFIG_SIGNAL):
            self.wavelength = _read_write(float, f"{meter.name}:wavelength({channel})",
                                          wavelength, set_wavelength, units="nm")
            if isinstance(meter, KeysightN77xx):
                self.averaging_time = _keysight_averaging(meter, channel)
            if isinstance(meter, ThorlabsPM100):
                self.averages = _thorlabs_averages(meter)
        super().__init__(name=name)


def _keysight_averaging(meter: KeysightN77xx, channel: int) -> SignalRW[float]:
    async def write(seconds: float | None) -> None:
        if seconds is not None:
            await meter.set_averaging_time(channel, seconds)

    async def read() -> float:
        # The driver knows it from the meter (read on every connect): no exchange.
        return meter.window_s(channel)

    return _read_write(float, f"{meter.name}:averaging_time({channel})", read, write,
                       units="s")


def _thorlabs_averages(meter: ThorlabsPM100) -> SignalRW[int]:
    async def write(count: int | None) -> None:
        if count is not None:
            await meter.set_averages(count)

    async def read() -> int:
        return meter.averages  # known to the driver since it connected

    return _read_write(int, f"{meter.name}:averages", read, write)


class MeterDevice(_DriverDevice):
    """A power meter: ``channels[n]`` for each channel named (read together with the
    device)."""

    def __init__(self, meter: PowerMeter, *, channels: Iterable[int] = (1,),
                 name: str = "") -> None:
        self.meter = meter
        with self.add_children_as_readables():
            self.channels = DeviceVector({c: MeterChannel(meter, c) for c in channels})
        super().__init__(meter, name)


__all__ = [
    "CrossConnectTable",
    "MeshDevice",
    "MeterChannel",
    "MeterDevice",
    "SwitchDevice",
    "SwitchPort",
]
