"""An emulated lab: a set of device emulators, their endpoints, and one control endpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

from emulators.calient import CalientOptions, CalientSwitch
from emulators.crossconnect import SwitchModel
from emulators.faults import Faults, parse_fault
from emulators.polatis import PolatisOptions, PolatisSwitch
from emulators.server import Endpoint, Interface
from emulators.timing import TimingModel


class Device(Protocol):
    name: str
    kind: str
    model: SwitchModel
    faults: Faults

    def interfaces(self) -> dict[str, Interface]: ...
    def reset(self) -> None: ...
    def boot(self) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...


#: kind → (device class, options class, default technology)
KINDS: dict[str, tuple[Any, Any, str]] = {
    "polatis": (PolatisSwitch, PolatisOptions, "beam-steering"),
    "calient": (CalientSwitch, CalientOptions, "mems-3d"),
}


@dataclass
class ServeSpec:
    port: int = 0
    serve: str = "tcp"  # or "pty"


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
    """The timing model a spec asks for: its technology's defaults, then its overrides."""
    values = dict(spec.timing)
    technology = values.pop("technology", KINDS[spec.kind][2])
    return TimingModel.for_technology(technology, **values)


class EmulatedLab:
    """Start with ``async with EmulatedLab(specs) as lab:``; ``lab.endpoints[id][iface]`` is
    each interface's address and ``lab.control_url`` the control endpoint (if started)."""

    def __init__(self, specs: list[EmulatorSpec], *, control: bool = True,
                 control_host: str = "127.0.0.1", control_port: int = 0) -> None:
        ids = [s.id for s in specs]
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise ValueError(f"emulator ids must be unique; repeated: {sorted(dupes)}")
        self.specs = specs
        self.devices: dict[str, Device] = {s.id: build_device(s) for s in specs}
        self.endpoints: dict[str, dict[str, str]] = {}
        self._servers: dict[str, list[Endpoint]] = {}
        self._control = control
        self._control_host, self._control_port = control_host, control_port
        self.control_url = ""
        self._control_server: Any = None
        self.powered: dict[str, bool] = {}

    async def start(self) -> None:
        try:
            for spec in self.specs:
                device = self.devices[spec.id]
                servers = []
                for iface_name, iface in device.interfaces().items():
                    where = spec.serve.get(iface_name, ServeSpec())
                    endpoint = Endpoint(iface, device.faults, host=spec.host, port=where.port,
                                        serve=where.serve)
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
        return {
            "id": emulator_id,
            "kind": device.kind,
            "endpoints": self.endpoints.get(emulator_id, {}),
            "timing": device.model.timing.as_dict(),
            "faults": [f.as_dict() for f in device.faults.active],
            "powered": self.powered.get(emulator_id, True),
            "state": device.snapshot(),
        }

    def truth(self, emulator_id: str, since: int = 0) -> dict[str, Any]:
        device = self.device(emulator_id)
        return {"state": device.snapshot(),
                "changes": [c.as_dict() for c in device.model.truth.since(since)]}

    def inject(self, emulator_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a fault (see emulators.faults); raises ValueError with a clear message."""
        device = self.device(emulator_id)
        fault = parse_fault(body)
        if fault.kind in ("fail_port", "restore_port"):
            port = body.get("port")
            if not isinstance(port, int):
                raise ValueError(f"{fault.kind} needs an integer 'port'")
            device.model.set_port_state(port, "F" if fault.kind == "fail_port" else "E")
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

    def clear_faults(self, emulator_id: str) -> None:
        self.device(emulator_id).faults.clear()

    def set_timing(self, emulator_id: str, values: dict[str, Any]) -> dict[str, Any]:
        device = self.device(emulator_id)
        device.model.timing.update(**values)
        return device.model.timing.as_dict()

    def reset(self, emulator_id: str | None = None) -> None:
        for key in [emulator_id] if emulator_id else list(self.devices):
            device = self.device(key)
            device.reset()
            device.model.timing = timing_for(next(s for s in self.specs if s.id == key))
