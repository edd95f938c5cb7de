"""QCoDeS Instruments on the drivers, one per device family (the ``qcodes`` extra).

Each wraps a driver in the blocking facade (:mod:`instruments.adapters.blocking`): the
driver runs on an event loop in a background thread, so it reconnects and resyncs as it
does in the daemon, while QCoDeS calls it as it calls any instrument::

    from qcodes import Station
    from instruments.adapters.qcodes import OpticalSwitchInstrument, PowerMeterInstrument

    ocs = OpticalSwitchInstrument("ocs1", PolatisScpi("tcp://10.0.0.20:5025"))
    pm = PowerMeterInstrument("pm1", KeysightN77xx("tcp://10.0.0.30:5025"))
    ocs.cross_connects({1: 17})
    pm.ch1.power()                          # dBm
    Station(ocs, pm).snapshot()

- switches (Polatis, CALIENT): :class:`OpticalSwitchInstrument`, ``cross_connects``; per
  port ``port<n>.power`` (dBm) and ``port<n>.enabled``;
- the mesh: :class:`MeshInstrument`, ``cross_connects`` and ``elements``; per port
  ``port<n>.enabled``;
- meters (Keysight, Thorlabs): :class:`PowerMeterInstrument`, per channel ``ch<n>.power``
  (dBm) and ``ch<n>.wavelength`` (nm); a Keysight's ``ch<n>.averaging_time`` (s), a
  Thorlabs's ``ch1.averages``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

try:
    from qcodes.instrument import ChannelTuple, Instrument, InstrumentChannel
    from qcodes.parameters import Parameter
    from qcodes.validators import Dict, Ints, Numbers
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("instruments.adapters.qcodes needs qcodes: "
                      "pip install 'labd[qcodes]'") from exc

from instruments.adapters.blocking import BlockingMeter, BlockingSwitch, LoopThread
from instruments.keysight import KeysightN77xx
from instruments.mesh import MeshSwitch
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch, Pair, PortState
from instruments.thorlabs import ThorlabsPM100


def _identity(vendor: str, model: str, serial: str, firmware: str) -> dict[str, str | None]:
    return {"vendor": vendor, "model": model, "serial": serial or None,
            "firmware": firmware or None}


class SwitchPort(InstrumentChannel["OpticalSwitchInstrument"]):
    """One port: ``enabled`` (a shutter, where the switch has them) and, on a switch with
    power monitors, ``power`` in dBm."""

    def __init__(self, parent: OpticalSwitchInstrument, port: int, *,
                 monitored: bool) -> None:
        super().__init__(parent, f"port{port}")
        self.port = port
        switch = parent.switch
        self.enabled: Parameter = self.add_parameter(
            "enabled", label=f"port {port} enabled",
            get_cmd=lambda: switch.port_states([port])[port] is PortState.ENABLED,
            set_cmd=lambda on: switch.set_ports_enabled([port], bool(on)))
        if monitored:
            self.power: Parameter = self.add_parameter(
                "power", label=f"port {port} power", unit="dBm",
                get_cmd=lambda: switch.port_power([port])[port], set_cmd=False)


class OpticalSwitchInstrument(Instrument):
    """An optical switch. ``cross_connects`` gets the map read from the device and sets
    exactly the circuits given (``{1: 17, 2: 18}``; pairs that stay are not touched);
    :meth:`connect` and :meth:`disconnect` add and remove some. ``ports`` names the ports
    made channels (all of them by default; name fewer on a big switch, whose snapshot would
    otherwise ask every port). The driver is opened here and closed by :meth:`close`;
    ``loop`` shares a :class:`~instruments.adapters.blocking.LoopThread` with other
    instruments."""

    monitored = True
    """Whether the ports have power monitors (a Polatis I-OST answers NotSupported)."""

    def __init__(self, name: str, switch: OpticalSwitch, *, ports: Iterable[int] | None = None,
                 loop: LoopThread | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.switch = BlockingSwitch(switch, loop=loop)
        try:
            self.switch.open()
        except BaseException:
            super().close()  # QCoDeS keeps every instrument by name until it is closed
            raise
        info = self.switch.info
        assert info is not None  # an open switch has identified itself
        self.cross_connects: Parameter = self.add_parameter(
            "cross_connects", label="cross-connects", get_cmd=self.switch.cross_connects,
            set_cmd=self.switch.replace, vals=Dict(),
            docstring="ingress (or lower) port → egress (or higher) port")
        channels = [SwitchPort(self, p, monitored=self.monitored)
                    for p in (range(1, info.ports + 1) if ports is None else ports)]
        for channel in channels:
            self.add_submodule(channel.short_name, channel)
        # Not in the snapshot: each port is there once already, as port<n>.
        self.ports: ChannelTuple[SwitchPort] = self.add_submodule(
            "ports", ChannelTuple(self, "ports", SwitchPort, channels, snapshotable=False))

    def port(self, port: int) -> SwitchPort:
        """The channel of ``port`` (its number, not its place in :attr:`ports`)."""
        channel = self.submodules.get(f"port{port}")
        if not isinstance(channel, SwitchPort):
            raise KeyError(f"{self.name} has no channel for port {port}")
        return channel

    def connect(self, pairs: Iterable[Pair] | Mapping[int, int]) -> None:
        self.switch.connect(pairs)

    def disconnect(self, ports: Iterable[int]) -> None:
        self.switch.disconnect(ports)

    def get_idn(self) -> dict[str, str | None]:
        info = self.switch.info
        if info is None:
            return _identity("", "", "", "")
        return _identity(info.vendor, f"{info.model} {info.size}", info.serial, info.firmware)

    def close(self) -> None:
        self.switch.close()
        super().close()


class MeshInstrument(OpticalSwitchInstrument):
    """A programmable mesh: a switch without power monitors, whose ``elements`` reads each
    MZI's state (``bar`` or ``cross``) from the board's voltages."""

    monitored = False

    def __init__(self, name: str, mesh: MeshSwitch, *, ports: Iterable[int] | None = None,
                 loop: LoopThread | None = None, **kwargs: Any) -> None:
        super().__init__(name, mesh, ports=ports, loop=loop, **kwargs)
        self.mesh = mesh

        def elements() -> list[str]:
            self.switch.cross_connects()  # reads the voltages, hence the states
            return [mesh.states[k] for k in range(mesh.elements)]

        self.elements: Parameter = self.add_parameter(
            "elements", label="MZI states", get_cmd=elements, set_cmd=False)


class MeterChannel(InstrumentChannel["PowerMeterInstrument"]):
    """One channel: ``power`` (dBm; each reading waits one averaging time), ``wavelength``
    (nm); a Keysight's ``averaging_time`` (s), a Thorlabs's ``averages``."""

    def __init__(self, parent: PowerMeterInstrument, channel: int) -> None:
        super().__init__(parent, f"ch{channel}")
        self.channel = channel
        meter = parent.meter
        self.power: Parameter = self.add_parameter(
            "power", label=f"channel {channel} power", unit="dBm",
            get_cmd=lambda: meter.read_power(channel), set_cmd=False)
        self.wavelength: Parameter = self.add_parameter(
            "wavelength", label=f"channel {channel} wavelength", unit="nm",
            get_cmd=lambda: meter.wavelength(channel),
            set_cmd=lambda nm: meter.set_wavelength(channel, float(nm)),
            vals=Numbers(min_value=0))
        driver = meter.driver
        if isinstance(driver, KeysightN77xx):
            keysight = driver
            self.averaging_time: Parameter = self.add_parameter(
                "averaging_time", label=f"channel {channel} averaging time", unit="s",
                get_cmd=lambda: keysight.window_s(channel),
                set_cmd=lambda s: meter.call(
                    lambda _: keysight.set_averaging_time(channel, float(s))),
                vals=Numbers(min_value=0, max_value=10))
        if isinstance(driver, ThorlabsPM100):
            thorlabs = driver
            self.averages: Parameter = self.add_parameter(
                "averages", label="samples per reading",
                get_cmd=lambda: thorlabs.averages,
                set_cmd=lambda n: meter.call(lambda _: thorlabs.set_averages(int(n))),
                vals=Ints(min_value=1, max_value=1_000_000))


class PowerMeterInstrument(Instrument):
    """A power meter, a channel ``ch<n>`` for each of its channels (or those named)."""

    def __init__(self, name: str, meter: PowerMeter, *, channels: Iterable[int] | None = None,
                 loop: LoopThread | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.meter = BlockingMeter(meter, loop=loop)
        try:
            self.meter.open()
        except BaseException:
            super().close()
            raise
        info = self.meter.info
        assert info is not None
        made = [MeterChannel(self, c)
                for c in (range(1, info.channels + 1) if channels is None else channels)]
        for channel in made:
            self.add_submodule(channel.short_name, channel)
        self.channels: ChannelTuple[MeterChannel] = self.add_submodule(
            "channels", ChannelTuple(self, "channels", MeterChannel, made))

    def get_idn(self) -> dict[str, str | None]:
        info = self.meter.info
        if info is None:
            return _identity("", "", "", "")
        return _identity(info.vendor, info.model, info.serial, info.firmware)

    def close(self) -> None:
        self.meter.close()
        super().close()


__all__ = [
    "MeshInstrument",
    "MeterChannel",
    "OpticalSwitchInstrument",
    "PowerMeterInstrument",
    "SwitchPort",
]
