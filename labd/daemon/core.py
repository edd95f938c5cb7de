"""``labd run``: one asyncio process owning every instrument of a lab.

Start-up opens every instrument at once and reports, in one place, each that failed and why
(those keep reconnecting in the background); it then reads the intended state from the store
and compares it with what the switches report: ``restore`` puts the intended circuits back,
``report`` only announces the drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

import uvicorn

from instruments.events import Drift, InstrumentEvent
from instruments.instrument import Instrument
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from labd.daemon.token import load_or_make_token
from labd.events import EventHub
from labd.fabric.drivers import make_driver
from labd.fabric.engine import Engine
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import CommandQueues, HostMonitor
from labd.lab.file import Lab
from labd.store.store import Store, connection_row

DEFAULT_PORT = 8470


class Drills(Protocol):
    """What runs failover drills for the API, where the daemon's GPU hosts are emulated
    in its process (labd.emulation.drill.DrillService)."""

    def start(self, job: str | None, member: str | None, kind: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


@dataclass
class StartupReport:
    connected: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    drift: dict[str, Drift] = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)


class Daemon:
    def __init__(self, lab: Lab, *, db: str, addresses: dict[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
                 restore: bool = True, light_window_s: float | None = None,
                 mqtt: str | None = None) -> None:
        self.lab = lab
        self.host, self.port = host, port
        self.token = load_or_make_token(token)
        self.restore = restore
        self.store = Store(db)
        self.hub = EventHub(self.snapshot)
        self.drivers: dict[str, Instrument] = {
            e.id: make_driver(e, (addresses or {}).get(e.id), source=lab.source)
            for e in lab.instrument}
        switches = {k: d for k, d in self.drivers.items() if isinstance(d, OpticalSwitch)}
        meters = {k: d for k, d in self.drivers.items() if isinstance(d, PowerMeter)}
        self.engine = Engine(lab, switches, meters, self.store, self.hub,
                             light_window_s=light_window_s)
        self.hosts = HostMonitor(self.hub, [h.id for h in lab.host])
        self.url = ""
        self.bus = None
        if mqtt:
            from labd.daemon.bus import MqttBridge

            self.bus = MqttBridge(self, mqtt)
        # Agents take job commands from the broker, or, without one, from the API.
        self.commands = CommandQueues()
        self.drills: Drills | None = None
        """Set by whoever runs the lab's GPU hosts in emulation (drills need them)."""
        self.jobs = JobManager(lab, self.engine, self.hosts, self.hub, self.store,
                               self.bus.send_to_host if self.bus is not None
                               else self.commands.send)
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None

    # -- state -----------------------------------------------------------------------------
    def instruments_state(self) -> list[dict[str, Any]]:
        out = []
        for name, driver in self.drivers.items():
            info = getattr(driver, "info", None)
            out.append({
                "id": name, "driver": type(driver).driver,
                "kind": "switch" if isinstance(driver, OpticalSwitch) else "meter",
                "state": driver.state.value, "last_error": driver.connection.last_error or None,
                "identity": None if info is None else {
                    "vendor": info.vendor, "model": info.model, "serial": info.serial,
                    "firmware": info.firmware},
            })
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"instruments": self.instruments_state(),
                "hosts": [h.as_dict() for h in self.hosts.hosts.values()],
                "jobs": [j.as_dict() for j in self.jobs.jobs.values()],
                "intended": {k: [[a, b] for a, b in sorted(v.items())]
                             for k, v in self.engine.intended.items()}}

    def _on_instrument_event(self, event: InstrumentEvent) -> None:
        data: dict[str, Any] = {"instrument": event.instrument, "kind": event.kind,
                                "state": event.state.value if event.state else None,
                                "detail": event.detail}
        if event.drift is not None:
            data["drift"] = {"missing": [[a, b] for a, b in event.drift.missing.items()],
                             "unexpected": [[a, b] for a, b in event.drift.unexpected.items()]}
        self.hub.publish(f"instrument.{event.kind}", data)
        self.store.write_nowait(connection_row(event.instrument, event.kind,
                                               data["state"], event.detail, event.at_ns))

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> StartupReport:
        await self.store.open()
        report = StartupReport()
        for driver in self.drivers.values():
            driver.add_listener(self._on_instrument_event)
        errors = await asyncio.gather(*(d.connection.open_or_retry()
                                        for d in self.drivers.values()))
        for (name, driver), error in zip(self.drivers.items(), errors, strict=True):
            if error is None:
                info = getattr(driver, "info", None)
                report.connected[name] = f"{info.vendor} {info.model}" if info else "ok"
            else:
                report.failed[name] = str(error)
        await self.engine.load_intended()
        for name, switch in self.engine.switches.items():
            if name in report.failed:
                continue
            drift = Drift.between(self.engine.intended[name], switch.expected)
            if drift:
                report.drift[name] = drift
                self.hub.publish("drift", {"switch": name, "missing": list(drift.missing.items()),
                                           "unexpected": list(drift.unexpected.items())})
                if self.restore:
                    await self.engine.reconfigure(name, replace=self.engine.intended[name],
                                                  cause="restore", verify_light=False)
                    report.restored.append(name)
        await self.jobs.load()
        await self._serve()
        self.hosts.start()
        self.jobs.start()
        if self.bus is not None:
            self.bus.start()
        return report

    async def _serve(self) -> None:
        from labd.daemon.api.app import create_app

        # proto named: asyncio's standard loop sets TCP_NODELAY on accepted connections
        # only when the listener says IPPROTO_TCP, and without it a response written in two
        # parts waits for a delayed ACK (40 ms on Linux). uvloop sets it either way.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(create_app(self), log_level="warning", lifespan="off")
        self._server = _QuietServer(config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]),
                                            name="labd-api")
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self.bus is not None:
            await self.bus.stop()
        await self.jobs.stop()
        await self.hosts.stop()
        self.hub.close()  # WebSocket clients are told, so the server can finish at once
        self.commands.close()  # and agents' command polls are answered
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._serving
        for driver in self.drivers.values():
            await driver.close()
        await self.store.close()


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handling: the daemon owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    def install_signal_handlers(self) -> None:
        pass
