"""An emulated lab: a set of device emulators, their endpoints, and one control endpoint."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

from emulators.control import HostControl
from emulators.devices.calient import CalientOptions, CalientSwitch
from emulators.devices.keysight import KeysightMeter, KeysightOptions
from emulators.devices.polatis import PolatisOptions, PolatisSwitch
from emulators.devices.qontrol import MeshDevice, QontrolOptions
from emulators.devices.thorlabs import ThorlabsMeter, ThorlabsOptions
from emulators.physics.crossconnect import SwitchModel
from emulators.physics.meters import MeterModel
from emulators.physics.optics import EndpointSpec, FiberSpec, OpticalModel
from emulators.physics.timing import TimingModel
from emulators.wire.faults import METER_FAULT_KINDS, Faults, parse_fault
from emulators.wire.hislip import HislipEndpoint
from emulators.wire.server import Endpoint, Interface
from emulators.wire.vxi11 import Vxi11Endpoint


class Device(Protocol):
    """An emulated instrument. Switches also have ``model`` (a SwitchModel), meters
    ``meter`` (a MeterModel)."""

    name: str
    kind: str
    faults: Faults

    def interfaces(self) -> dict[str, Interface]: ...
    def reset(self) -> None: ...
    def boot(self) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...


def switch_of(device: Device) -> SwitchModel | None:
    model = getattr(device, "model", None)
    return model if isinstance(model, SwitchModel) else None


def meter_of(device: Device) -> MeterModel | None:
    meter = getattr(device, "meter", None)
    return meter if isinstance(meter, MeterModel) else None


#: kind → (device class, options class, default technology)
KINDS: dict[str, tuple[Any, Any, str]] = {
    "polatis": (PolatisSwitch, PolatisOptions, "beam-steering"),
    "calient": (CalientSwitch, CalientOptions, "mems-3d"),
    "keysight": (KeysightMeter, KeysightOptions, "ideal"),
    "thorlabs": (ThorlabsMeter, ThorlabsOptions, "ideal"),
    "mesh": (MeshDevice, QontrolOptions, "thermo-optic"),
}


@dataclass
class OpticsSpec:
    """How the lab is wired: endpoints that launch light, fibres, and the threshold whose
    crossings are ground truth."""

    endpoints: list[EndpointSpec] = field(default_factory=list)
    fibers: list[FiberSpec] = field(default_factory=list)
    threshold_dbm: float = -30.0


@dataclass
class ServeSpec:
    port: int = 0
    serve: str = "tcp"  # or "pty", or "hislip"/"vxi11" (SCPI as VISA's TCPIP INSTR)


@dataclass
class EmulatorSpec:
    """What to start: ``kind`` (polatis, calient), device options, timing, and where each of
    its interfaces listens (interfaces not named are served on a free TCP port)."""

    id: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    serve: dict[str, ServeSpec] = field(default_factory=dict)
    host: str = "127.0.0.1"


def build_device(spec: EmulatorSpec) -> Device:
    if spec.kind not in KINDS:
        raise ValueError(f"emulator {spec.id!r}: unknown kind {spec.kind!r}; "
                         f"known: {', '.join(KINDS)}")
    device_cls, options_cls, _ = KINDS[spec.kind]
    known = {f.name for f in dataclasses.fields(options_cls)}
    unknown = set(spec.options) - known
    if unknown:
        raise ValueError(f"emulator {spec.id!r}: unknown option(s) {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    return device_cls(spec.id, options_cls(**spec.options), timing_for(spec))  # type: ignore[no-any-return]


def timing_for(spec: EmulatorSpec) -> TimingModel:
    """The timing model a spec asks for: its profile's or its technology's defaults, then
    its overrides."""
    values = dict(spec.timing)
    technology = values.pop("technology", KINDS[spec.kind][2])
    if (profile := values.pop("profile", None)) is not None:
        return TimingModel.for_profile(profile, **values)
    return TimingModel.for_technology(technology, **values)


class EmulatedLab:
    """Start with ``async with EmulatedLab(specs) as lab:``; ``lab.endpoints[id][iface]`` is
    each interface's address and ``lab.control_url`` the control endpoint (if started)."""

    def __init__(self, specs: list[EmulatorSpec], *, control: bool = True,
                 control_host: str = "127.0.0.1", control_port: int = 0,
                 optics: OpticsSpec | None = None) -> None:
        ids = [s.id for s in specs]
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise ValueError(f"emulator ids must be unique; repeated: {sorted(dupes)}")
        self.specs = specs
        self.devices: dict[str, Device] = {s.id: build_device(s) for s in specs}
        self.optics = self._wire(optics) if optics is not None else None
        self.endpoints: dict[str, dict[str, str]] = {}
        self._servers: dict[str, list[Endpoint | HislipEndpoint | Vxi11Endpoint]] = {}
        self._control = control
        self._control_host, self._control_port = control_host, control_port
        self.control_url = ""
        self._control_server: Any = None
        self.powered: dict[str, bool] = {}
        self.hosts: dict[str, HostControl] = {}
        """Emulated GPU hosts, registered by whoever plays them."""

    def _wire(self, spec: OpticsSpec) -> OpticalModel:
        optics = OpticalModel(spec.endpoints, spec.fibers, threshold_dbm=spec.threshold_dbm)
        # Light reaching an endpoint is ground truth too (a NIC's link follows it).
        optics.watched.update(e.id for e in spec.endpoints)
        for name, device in self.devices.items():
            switch = switch_of(device)
            if switch is not None:
                optics.attach(switch)
                switch.listeners.append(optics.on_change)
                switch.power_probe = (lambda port, n=name: optics.dbm_now(f"{n}:{port}"))
            if isinstance(device, MeshDevice):
                optics.attach(device.mesh)
                device.mesh.listeners.append(optics.on_change)
            meter = meter_of(device)
            if meter is not None:
                meter.optics = optics
                optics.add_meter(name, meter.channels)
        return optics

    async def start(self) -> None:
        try:
            for spec in self.specs:
                device = self.devices[spec.id]
                servers = []
                for iface_name, iface in device.interfaces().items():
                    where = spec.serve.get(iface_name, ServeSpec())
                    endpoint: Endpoint | HislipEndpoint | Vxi11Endpoint
                    if where.serve == "hislip":
                        endpoint = HislipEndpoint(iface, device.faults, host=spec.host,
                                                  port=where.port)
                    elif where.serve == "vxi11":
                        # The portmapper needs port 111: a loopback address of its own.
                        endpoint = Vxi11Endpoint(iface, device.faults, host="127.0.0.2"
                                                 if spec.host == "127.0.0.1" else spec.host,
                                                 port=where.port)
                    else:
                        endpoint = Endpoint(iface, device.faults, host=spec.host,
                                            port=where.port, serve=where.serve)
                    await endpoint.start()
                    servers.append(endpoint)
                self._servers[spec.id] = servers
                self.endpoints[spec.id] = {e.interface.name: e.address for e in servers}
            if self._control:
                from emulators.control import ControlServer

                self._control_server = ControlServer(self, self._control_host,
                                                     self._control_port)
                self.control_url = await self._control_server.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._control_server is not None:
            await self._control_server.stop()
            self._control_server = None
        for servers in self._servers.values():
            for endpoint in servers:
                await endpoint.stop()
        self._servers.clear()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # -- the backdoor, also used in-process by tests --------------------------------------
    def device(self, emulator_id: str) -> Device:
        try:
            return self.devices[emulator_id]
        except KeyError:
            raise KeyError(f"no emulator {emulator_id!r}; known: "
                           f"{', '.join(sorted(self.devices))}") from None

    def describe(self, emulator_id: str) -> dict[str, Any]:
        device = self.device(emulator_id)
        switch = switch_of(device)
        return {
            "id": emulator_id,
            "kind": device.kind,
            "endpoints": self.endpoints.get(emulator_id, {}),
            "timing": switch.timing.as_dict() if switch is not None else None,
            "faults": [f.as_dict() for f in device.faults.active],
            "powered": self.powered.get(emulator_id, True),
            "state": device.snapshot(),
        }

    def truth(self, emulator_id: str, since: int = 0, light_since: int = 0, *,
              light: bool = True) -> dict[str, Any]:
        """The true state, every physical change after ``since``, and (``light``) the light
        threshold crossings after ``light_since`` this device caused or saw. Working out
        crossings takes a while after many changes: leave ``light`` off when not needed."""
        device = self.device(emulator_id)
        switch = switch_of(device)
        log = switch.truth if switch else (
            device.mesh.truth if isinstance(device, MeshDevice) else None)
        changes = [c.as_dict() for c in log.since(since)] if log is not None else []
        crossings = [c for c in self.light(light_since)
                     if c["device"] == emulator_id or c["node"].startswith(emulator_id + ":")
                     ] if light else []
        return {"state": device.snapshot(), "changes": changes, "crossings": crossings}

    def light(self, since: int = 0) -> list[dict[str, Any]]:
        """Every threshold crossing at a watched node (meter channels) after ``since``."""
        return self.optics.crossings_since(since) if self.optics is not None else []

    def power_now(self, node: str) -> float:
        """True power (dBm) at a node of the optical model now."""
        if self.optics is None:
            raise ValueError("this lab has no optical model (no endpoints or fibres)")
        return self.optics.dbm_now(node)

    def inject(self, emulator_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a fault (see emulators.wire.faults); raises ValueError with a clear message."""
        device = self.device(emulator_id)
        fault = parse_fault(body)
        if fault.kind in ("fail_port", "restore_port"):
            port = body.get("port")
            switch = switch_of(device)
            if switch is None:
                raise ValueError(f"{emulator_id} is not a switch; {fault.kind} needs one")
            if not isinstance(port, int):
                raise ValueError(f"{fault.kind} needs an integer 'port'")
            switch.set_port_state(port, "F" if fault.kind == "fail_port" else "E")
        elif fault.kind in ("dead_heater", "revive_heater"):
            if not isinstance(device, MeshDevice):
                raise ValueError(f"{emulator_id} is not a mesh; {fault.kind} needs one")
            channel = body.get("channel")
            if not isinstance(channel, int) or not 0 <= channel < device.mesh.elements:
                raise ValueError(f"{fault.kind} needs 'channel', a heater 0.."
                                 f"{device.mesh.elements - 1}")
            if fault.kind == "dead_heater":
                device.mesh.kill_heater(channel, time.monotonic_ns())
            else:
                device.mesh.revive_heater(channel, time.monotonic_ns())
        elif fault.kind in METER_FAULT_KINDS:
            meter = meter_of(device)
            if meter is None:
                raise ValueError(f"{emulator_id} is not a power meter; {fault.kind} needs one")
            channel = body.get("channel")
            if channel is not None and not isinstance(channel, int):
                raise ValueError("'channel' must be a channel number")
            meter.set_fault(channel, fault.kind)
        elif fault.kind == "drop" and body.get("now"):
            for endpoint in self._servers.get(emulator_id, []):
                endpoint.drop_all()
        else:
            device.faults.add(fault)
        return self.describe(emulator_id)

    async def power(self, emulator_id: str, on: bool) -> dict[str, Any]:
        """Power the device off (every endpoint stops listening, connections are cut) or
        on again (same addresses; state as the device's boot behaviour says)."""
        device = self.device(emulator_id)
        servers = self._servers.get(emulator_id, [])
        if on and not self.powered.get(emulator_id, True):
            device.boot()
            for endpoint in servers:
                await endpoint.start()
        elif not on and self.powered.get(emulator_id, True):
            for endpoint in servers:
                await endpoint.stop()
        self.powered[emulator_id] = on
        return self.describe(emulator_id)

    def host(self, host_id: str) -> HostControl:
        try:
            return self.hosts[host_id]
        except KeyError:
            raise KeyError(f"no emulated host {host_id!r}; hosts: "
                           f"{', '.join(sorted(self.hosts)) or 'none'}") from None

    def clear_faults(self, emulator_id: str) -> None:
        device = self.device(emulator_id)
        device.faults.clear()
        meter = meter_of(device)
        if meter is not None:
            meter.set_fault(None, None)
        if isinstance(device, MeshDevice):
            for heater in sorted(device.mesh.dead):
                device.mesh.revive_heater(heater, time.monotonic_ns())

    def set_timing(self, emulator_id: str, values: dict[str, Any]) -> dict[str, Any]:
        switch = switch_of(self.device(emulator_id))
        if switch is None:
            raise ValueError(f"{emulator_id} has no switching time to set")
        switch.timing.update(**values)
        return switch.timing.as_dict()

    def reset(self, emulator_id: str | None = None) -> None:
        for key in [emulator_id] if emulator_id else list(self.devices):
            device = self.device(key)
            device.reset()
            switch = switch_of(device)
            if switch is not None:
                switch.timing = timing_for(next(s for s in self.specs if s.id == key))
