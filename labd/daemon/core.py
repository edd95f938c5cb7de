"""The daemon (``labd run``): one asyncio process owning every instrument of a lab, used as
``async with Daemon(lab, ...) as daemon:``.

Start-up opens the store and every instrument at once and reports, in one place
(``daemon.report``), each that failed and why (those keep reconnecting in the background);
it then reads the intended state from the store and compares it with what the switches
report. Each switch's ``on_drift`` (lab file) says what then happens, there and whenever a
switch comes back online (a reconnect, a restart found by the liveness watch):
``restore`` puts the intended circuits back, ``report`` only announces the drift, ``adopt``
takes the switch's map as the intended one. ``restore=False`` (``--no-restore``) makes
every switch ``report``.
The API is served, and the background loops (host watchdog, job recoveries, MQTT bridge,
HTTP server) run in one TaskGroup until the block is left, which stops them all in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import socket
import time
from collections.abc import Coroutine, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import uvicorn

from instruments.events import Drift, InstrumentEvent, LinkState
from instruments.instrument import Instrument
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from labd.daemon.access import ApiSettings
from labd.daemon.metrics import DaemonMetrics, LagSampler
from labd.daemon.placement import Cpu, Placement
from labd.daemon.server import OneWriteProtocol
from labd.daemon.services import Drills, Services
from labd.errors import BusError, LabdError, LeaseError
from labd.events import EventHub
from labd.fabric.drivers import make_driver
from labd.fabric.engine import Engine
from labd.ha.lease import Lease
from labd.ha.role import TAKING_OVER, HaSettings, Role
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import CommandQueues, HostMonitor
from labd.lab.file import Lab, SwitchEntry
from labd.store.store import Store, connection_row, normalise_url
from labd.token import load_or_make_token

if TYPE_CHECKING:
    from labd.daemon.bus import MqttBridge
    from labd.mqtt.credentials import BusSettings

__all__ = ["DEFAULT_PORT", "Daemon", "Drills", "StartupReport"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8470
#: How long stopping may take, all of it (systemd's SIGTERM is answered within 2 s, the
#: interpreter's own exit included). A reconfiguration under way has all of it to finish
#: and be recorded; a client that will not read its end, or never finishes sending its
#: request, is cut off when it runs out.
STOP_S = 1.2
#: How long the event stream's readers may take to read its end when the daemon stops.
READERS_EXIT_S = 0.25
#: At the least, how long the HTTP server is given to write the answers it owes.
SERVER_EXIT_S = 0.2


@dataclass
class StartupReport:
    connected: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    drift: dict[str, Drift] = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)


class Daemon:
    def __init__(self, lab: Lab, *, db: str, addresses: dict[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
                 restore: bool = True, light_window_s: float | None = None,
                 mqtt: str | BusSettings | None = None, api: ApiSettings | None = None,
                 ha: HaSettings | None = None, cpu: Cpu | None = None) -> None:
        self.lab = lab
        self.cpu = cpu
        """The CPU the event loop is held on while the daemon runs, and the store's writer
        with it (labd.daemon.placement); None: wherever the kernel puts it."""
        self._placement: Placement | None = None
        self.host, self.port = host, port
        self._token = token
        self.restore = restore
        self.store = Store(db)
        self.hub = EventHub(self.snapshot)
        self.drivers: dict[str, Instrument] = {
            e.id: make_driver(e, (addresses or {}).get(e.id), source=lab.source)
            for e in lab.instrument}
        for driver in self.drivers.values():
            driver.add_listener(self._on_instrument_event)
        switches = {k: d for k, d in self.drivers.items() if isinstance(d, OpticalSwitch)}
        meters = {k: d for k, d in self.drivers.items() if isinstance(d, PowerMeter)}
        self.engine = Engine(lab, switches, meters, self.store, self.hub,
                             light_window_s=light_window_s)
        self.hosts = HostMonitor(self.hub, [h.id for h in lab.host])
        # Agents take job commands from the broker, or, without one, from the API.
        self.commands = CommandQueues()
        self.jobs = JobManager(lab, self.engine, self.hosts, self.hub, self.store,
                               self._to_bus if mqtt else self.commands.send)
        # Failures reach recovery by a direct call from the monitor, not through the
        # observers' bounded event stream: a stream that overflows loses no failure.
        self.hosts.listen(self.jobs)
        self.services = Services(
            lab=lab, engine=self.engine, hosts=self.hosts, jobs=self.jobs, hub=self.hub,
            store=self.store, token=token or "", commands=self.commands,
            snapshot=self.snapshot, instruments_state=self.instruments_state,
            api=api or ApiSettings())
        self.bus: MqttBridge | None = None
        if mqtt:
            from labd.daemon.bus import MqttBridge  # aiomqtt only for a lab with a broker

            self.bus = MqttBridge(self.services, mqtt)
        self.metrics = self.services.metrics = DaemonMetrics(self.services, self.bus)
        self.store.on_commit = self.metrics.store_commit_seconds.observe
        self.role: Role | None = None
        """Under ``--ha``: leader, standby or taking over (labd.ha.role); None: this daemon
        alone runs the lab."""
        if ha is not None:
            self.role = self._standby(lab, db, ha)
        self.report = StartupReport()
        """What start-up found: instruments connected and failed, drift, restored."""
        self._on_drift = {e.id: e.on_drift for e in lab.instrument if isinstance(e, SwitchEntry)}
        self._healing: dict[str, asyncio.Task[None]] = {}
        self._heal_again: set[str] = set()
        self._restarted: dict[str, str] = {}
        """Per switch, why its latest reconnect looked like a restart (for the drift event)."""
        self._reconciled = False
        self.url = ""
        self._server: _Server | None = None
        self._group: asyncio.TaskGroup | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._serving: asyncio.Task[None] | None = None
        self._leasing: asyncio.Task[None] | None = None
        self._running = False

    def _standby(self, lab: Lab, db: str, ha: HaSettings) -> Role:
        """Start as a standby: nothing is changed, no instrument is opened, no host event is
        acted on and nothing is said on the lab's topics until the lease is won."""
        url = normalise_url(ha.url)
        if normalise_url(db) != url:
            raise LeaseError("with --ha the store is the lease's PostgreSQL (every write is "
                             "checked against the lease in its own transaction): leave --db "
                             "out, or give it the same URL as --ha")
        instance = self.bus.settings.instance if self.bus is not None else None
        name = lab.lab.name + (f"@{instance}" if instance else "")
        role = self.services.role = Role(Lease(url, name, renew_s=ha.renew_s,
                                               ttl_s=ha.ttl_s))
        self.engine.leadership = role
        self.jobs.acting = False
        if self.bus is not None:
            self.bus.leading = lambda: role.lease.holds() and role.ready
        return role

    @property
    def token(self) -> str:
        """The daemon's own key, admin: ``token``, else found (or made) at start-up
        (labd.token); with an access file and no ``token``, one made for this run only,
        for the daemon's in-process clients."""
        return self.services.token

    @property
    def drills(self) -> Drills | None:
        """Set by whoever runs the lab's GPU hosts in emulation (drills need them)."""
        return self.services.drills

    @drills.setter
    def drills(self, drills: Drills | None) -> None:
        self.services.drills = drills

    async def _to_bus(self, host: str, message: dict[str, Any]) -> None:
        # The bridge is given the services, the job manager among them, so the job manager
        # is given this, which finds the bridge when a command goes out.
        if self.bus is None:
            raise BusError(f"cannot reach host {host}: the daemon has no MQTT broker")
        await self.bus.send_to_host(host, message)

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
            data["drift"] = _drift_data(event.drift)
        if event.data.get("restarted"):
            data["restarted"] = self._restarted[event.instrument] = event.data["restarted"]
        self.hub.publish(f"instrument.{event.kind}", data)
        self.store.write_nowait(connection_row(event.instrument, event.kind,
                                               data["state"], event.detail, event.at_ns))
        if (event.kind == "state" and event.state is LinkState.ONLINE and self._reconciled
                and event.instrument in self.engine.switches):
            self._heal_soon(event.instrument)

    # -- drift -----------------------------------------------------------------------------
    def on_drift(self, switch: str) -> str:
        """What is done when ``switch`` holds other circuits than intended: the lab file's
        ``on_drift``, or ``report`` for every switch under ``--no-restore``."""
        return self._on_drift.get(switch, "restore") if self.restore else "report"

    def _heal_soon(self, switch: str) -> None:
        """Compare a switch that came back online with the intended state, in a task of its
        own (the event came from inside its connection). One at a time per switch: a
        reconnect during a heal is looked at again when it ends."""
        running = self._healing.get(switch)
        if running is not None and not running.done():
            self._heal_again.add(switch)
            return
        self._healing[switch] = asyncio.get_running_loop().create_task(
            self._heal(switch), name=f"labd-heal-{switch}")

    async def _heal(self, switch: str) -> None:
        while True:
            self._heal_again.discard(switch)
            try:
                await self._settle(switch)
            except LabdError as exc:
                # Offline again, the store refusing: the next reconnect tries again.
                self.hub.publish("warning", {"detail": f"{switch}: the drift found on "
                                                       f"reconnecting was not dealt with: {exc}"})
            except Exception:
                log.exception("%s: dealing with drift failed", switch,
                              extra={"instrument": switch})
            if switch not in self._heal_again:
                return

    async def _settle(self, switch: str, report: StartupReport | None = None) -> None:
        """The switch's map against the intended state, dealt with as ``on_drift`` says."""
        drift = Drift.between(self.engine.intended[switch],
                              self.engine.switches[switch].expected)
        restarted = self._restarted.pop(switch, None)
        if not drift:
            return
        policy = self.on_drift(switch)
        self.hub.publish("drift", {"switch": switch, **_drift_data(drift), "policy": policy,
                                   "restarted": restarted,
                                   "when": "start-up" if report is not None else "reconnect"})
        if report is not None:
            report.drift[switch] = drift
        if policy == "restore":
            await self.engine.restore(switch)
            if report is not None:
                report.restored.append(switch)
        elif policy == "adopt":
            await self.engine.adopt(switch)
            if report is not None:
                report.adopted.append(switch)

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Daemon:
        await self._start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: Any) -> None:
        await self._stop(error)

    async def stop(self) -> None:
        """Stop before the block is left (as a daemon that goes away would: a test of its
        clients, a signal); leaving the block then does nothing more."""
        await self._stop(None)

    async def _start(self) -> None:
        if self._running:
            raise RuntimeError("the daemon is already running")
        self._running = True
        self.services.stopping = False
        try:
            self.services.token = (
                secrets.token_urlsafe(32) if self._token is None and
                self.services.api.access is not None else load_or_make_token(self._token))
            await self.store.open()
            if self.cpu is not None:
                self._placement = Placement.pin(self.cpu)
            if self.role is None:
                self.report = await self._open_instruments()
                await self._reconcile(self.report)
                await self.jobs.load()
            self._server, listener = self._listen()
            if self.role is not None and await self._acquire(self.role.lease):
                await self._take_over()
            self._group = asyncio.TaskGroup()
            await self._group.__aenter__()
            self._serving = self._group.create_task(_serve(self._server, listener),
                                                    name="labd-api")
            await self._server.listening.wait()  # the group cancels this if serving fails
            self._loops = [self._group.create_task(self.jobs.run(), name="labd-recovery"),
                           self._group.create_task(
                               LagSampler(self.metrics.loop_lag_seconds).run(),
                               name="labd-loop-lag")]
            if self.role is None or self.role.ready:
                self._watch(first=self.role is None)
            if self.bus is not None:
                self._loops.append(self._group.create_task(self.bus.run(), name="labd-mqtt"))
            if self.role is not None:
                self._leasing = self._group.create_task(self._keep_lease(self.role),
                                                        name="labd-lease")
                self._loops.append(self._leasing)
        except BaseException as exc:
            await self._stop(exc)
            raise
        # What start-up made, and every library loaded for it, lives as long as the daemon:
        # kept out of the collector's full passes, which otherwise walked all of it (~90 ms
        # with the loop stopped, every few seconds under load: a reconfiguration's p99).
        # Undone at the stop, so a process that runs daemons one after another (the tests)
        # frees what each left.
        gc.freeze()

    # -- leading (--ha) ----------------------------------------------------------------------
    async def _acquire(self, lease: Lease) -> bool:
        """Try for the lease once, telling the others where this daemon's API answers."""
        lease.api_url = self.url
        try:
            return await lease.acquire() is not None
        except Exception as exc:  # the database's errors, whatever its driver calls them
            raise LeaseError(f"cannot reach the lease's database {self.store.where!r}: "
                             f"{str(exc).splitlines()[0]}") from None

    async def _keep_lease(self, role: Role) -> None:
        """Renew the lease (leading) or wait for it (standing by) until stopped. Losing it
        ends the daemon: a leader that can no longer prove it leads must not go on, and
        its supervisor starts it again as a standby."""
        async def changed(leading: bool) -> None:
            if leading:
                assert self._group is not None
                self._loops.append(self._group.create_task(self._take_over(),
                                                           name="labd-takeover"))
                return
            role.ready = False
            self.hub.publish("warning", {"detail": f"this daemon lost the lead of lab "
                                                   f"{role.lease.name}; it stops"})
            raise LeaseError(f"lost the lead of lab {role.lease.name!r}: the lease was not "
                             f"renewed within {role.lease.ttl_s:g} s (the database out of "
                             "reach, or this process paused), and another daemon may lead "
                             "now; stopping, so that no two daemons command its switches "
                             "(a supervisor starts it again as a standby)")
        await role.lease.run(changed)

    async def _take_over(self) -> None:
        """This daemon won the lease: fence the store's writes with its epoch, open and
        resync every instrument, put back the intended state (each switch's ``on_drift``),
        take the jobs as the store has them and act on what failed meanwhile; only then
        take changes. The watchdog gives hosts one heartbeat interval first."""
        role = self.role
        assert role is not None and role.lease.epoch is not None
        began = time.monotonic()
        self.store.fence = (role.lease.name, role.lease.epoch)
        marker = TAKING_OVER.set(True)
        try:
            self.report = await self._open_instruments()
            await self._reconcile(self.report)
            await self.jobs.load()
        finally:
            TAKING_OVER.reset(marker)
        role.ready = True
        role.took_over_ms = (time.monotonic() - began) * 1000
        queued = self.jobs.resume()
        if self.bus is not None:
            self.bus.lead()
        if self._group is not None:
            self._watch(first=False)
        log.warning("lab %s: this daemon leads (epoch %d), taken over in %.1f ms; %d "
                    "recoveries queued for what failed meanwhile", role.lease.name,
                    role.lease.epoch, role.took_over_ms, queued)
        self.hub.publish("ha.leading", {"lab": role.lease.name, "epoch": role.lease.epoch,
                                        "url": self.url, "took_over_ms": role.took_over_ms,
                                        "recoveries": queued,
                                        "failed": sorted(self.report.failed)})

    def _watch(self, *, first: bool) -> None:
        """Start the host watchdog; after a takeover, only once the hosts have had one
        heartbeat interval to be heard by this daemon as the leader."""
        assert self._group is not None
        grace = 0.0 if first else max(
            [s.interval_s for s in self.hosts.hosts.values() if s.interval_s] or [1.0])

        async def watch() -> None:
            await asyncio.sleep(grace)
            await self.hosts.run()
        self._loops.append(self._group.create_task(watch(), name="labd-host-watchdog"))

    async def _open_instruments(self) -> StartupReport:
        """Every instrument at once; each that failed keeps reconnecting by itself."""
        report = StartupReport()
        errors = await asyncio.gather(*(d.connection.open_or_retry()
                                        for d in self.drivers.values()))
        for (name, driver), error in zip(self.drivers.items(), errors, strict=True):
            if error is None:
                info = getattr(driver, "info", None)
                report.connected[name] = f"{info.vendor} {info.model}" if info else "ok"
            else:
                report.failed[name] = str(error)
        return report

    async def _reconcile(self, report: StartupReport) -> None:
        """The switches' circuits against the intended state, each dealt with as its
        ``on_drift`` says; from here on, so is every switch that comes back online (one
        that failed at start-up included)."""
        await self.engine.load_intended()
        self._reconciled = True
        for name, switch in self.engine.switches.items():
            if switch.state is not LinkState.ONLINE:
                continue  # dealt with when it comes online
            try:
                await self._settle(name, report)
            except LabdError as exc:
                self.hub.publish("warning", {"detail": f"{name}: the drift found at start-up "
                                                       f"was not dealt with: {exc}"})

    def _listen(self) -> tuple[_Server, socket.socket]:
        """The API's server and its listening socket (bound here: a port in use is an
        OSError from start-up itself)."""
        from labd.daemon.api.app import create_app

        # proto named: asyncio's standard loop sets TCP_NODELAY on accepted connections
        # only when the listener says IPPROTO_TCP, and without it a response written in two
        # parts waits for a delayed ACK (40 ms on Linux). uvloop sets it either way.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        api = self.services.api
        self.url = f"{'https' if api.tls else 'http'}://{host}:{port}"
        # log_config None: uvicorn's lines go through labd's handlers (labd.logs), not
        # handlers of its own that would bypass their format and their redaction.
        config = uvicorn.Config(create_app(self.services), http=OneWriteProtocol,
                                log_level="warning", log_config=None, lifespan="off",
                                ssl_certfile=api.tls_cert, ssl_keyfile=api.tls_key)
        return _Server(config), sock

    async def _stop(self, error: BaseException | None) -> None:
        """Everything start-up made, undone in order: the bus says offline, the loops end,
        WebSocket clients and agents' polls are answered, the server exits, the drivers
        and the store close. ``error``: what ended an ``async with`` block, if anything."""
        if not self._running:
            return
        self._running = False
        self.services.stopping = True
        gc.unfreeze()
        # What the stop holds until it ends: every port, so no reconfiguration starts.
        self._quiesced = contextlib.AsyncExitStack()
        group, self._group = self._group, None
        try:
            if group is not None:
                # Stopped in full even when the group cancels this task meanwhile (a loop
                # failed): the streams must be closed and the server must exit either way.
                if await _to_the_end(self._stop_loops()) and not isinstance(
                        error, asyncio.CancelledError):
                    error = asyncio.CancelledError()
                # A cancellation is the group's to account for (it may have asked for it,
                # because a loop failed); any other error is the block's own to raise.
                try:
                    await group.__aexit__(*((type(error), error, error.__traceback__)
                                            if isinstance(error, asyncio.CancelledError)
                                            else (None, None, None)))
                except BaseExceptionGroup as failed:
                    # One loop failed: its own error, so that the command running the
                    # daemon reports it as it reports any other (a message, not a group).
                    if len(failed.exceptions) == 1:
                        raise failed.exceptions[0] from None
                    raise
        finally:
            healing, self._healing = list(self._healing.values()), {}
            await _cancelled(healing)
            for driver in self.drivers.values():
                await driver.close()
            await self.store.close()
            if self._placement is not None:
                self._placement.release()
                self._placement = None
            await self._quiesced.aclose()

    async def _stop_loops(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_S
        # First, the reconfigurations under way (from the API, the bus or a recovery) end
        # and are recorded: all the lab's ports are taken, which waits for each to let
        # go of its own, and none starts after. Before the loops are cancelled, so that a
        # recovery is not cut off on the wire.
        drained = await self._quiesce(deadline - SERVER_EXIT_S - loop.time())
        if not drained:
            log.warning("stopping with a reconfiguration still under way after %.1f s: "
                        "it is cut off (the switch is read back at the next start)", STOP_S)
        await self._step_down()
        if self.bus is not None:
            await self.bus.say_offline()  # a clean disconnect sends no last will
        loops, self._loops = self._loops, []
        await _cancelled(loops)
        self.hub.close()  # WebSocket clients are told, so the server can finish at once
        # and have been, before it closes them (one that does not read is not waited for)
        await self.hub.wait_ended(max(0.0, min(READERS_EXIT_S, deadline - loop.time())))
        self.commands.close()  # and agents' command polls are answered
        serving, self._serving = self._serving, None
        server = self._server
        if server is not None and serving is not None:
            server.should_exit = True
            await asyncio.wait([serving], timeout=max(SERVER_EXIT_S, deadline - loop.time()))
            if not serving.done():
                # What is left waits on its client (a body never finished, an answer never
                # read): no reconfiguration, as those ended above.
                server.force_exit = True
                stuck = list(server.server_state.tasks)
                for task in stuck:
                    task.cancel()
                serving.cancel()
                await asyncio.wait([serving, *stuck], timeout=SERVER_EXIT_S)

    async def _step_down(self) -> None:
        """Under ``--ha``: give the lease up (a standby takes over at once, not after the
        lease's time to live), once nothing is under way; a lease already lost is not
        touched."""
        leasing, self._leasing = self._leasing, None
        if leasing is not None:
            await _cancelled([leasing])
        if self.role is None:
            return
        try:
            if self.role.lease.holds():
                await asyncio.wait_for(self.role.lease.release(), SERVER_EXIT_S)
        except Exception as exc:  # the lease then runs out by itself
            log.warning("lab %s: the lease was not given up (%s); a standby takes over once "
                        "it runs out", self.role.lease.name, str(exc).splitlines()[0])
        self.role.lease.close()

    async def _quiesce(self, timeout: float) -> bool:
        """Hold every port of every switch and every metered channel until the daemon has
        stopped (released in ``_stop``), once each reconfiguration under way has let go
        of its own; whether that came within ``timeout`` seconds."""
        engine = self.engine
        every: set[Hashable] = {(name, port) for name, switch in engine.switches.items()
                                if switch.info is not None
                                for port in range(1, switch.info.ports + 1)}
        # The keys the engine holds for light verification (labd/fabric/engine.py).
        every |= {(f"meter:{path.meter}", path.channel)
                  for name in engine.switches for path in engine.metered(name)}
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await self._quiesced.enter_async_context(engine.reservations.hold(every))
        except TimeoutError:
            return False
        return True


def _drift_data(drift: Drift) -> dict[str, list[list[int]]]:
    return {"missing": [[a, b] for a, b in sorted(drift.missing.items())],
            "unexpected": [[a, b] for a, b in sorted(drift.unexpected.items())]}


async def _to_the_end(work: Coroutine[Any, Any, None]) -> bool:
    """Await ``work`` to its end even if this task is cancelled meanwhile; whether it was
    (the caller still owes that cancellation to whoever asked for it)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    return cancelled


#: How long a task the stop cancelled has to end (its own tidying up included) before it is
#: taken to have gone on, and cancelled again.
RECANCEL_S = 1.0


async def _cancelled(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` (the stop's: its loops, the lease's renewal, the drivers' healing)
    and wait for them to end, cancelling again, every :data:`RECANCEL_S`, any that went
    on: a library's ``asyncio.wait_for`` on Python 3.11 can swallow a cancellation that
    lands as its wait ends (aiomqtt's, as a subscription is confirmed), and a stop that
    waited for such a task once would wait for ever."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        for task in pending:
            log.warning("the daemon's task %s went on after it was cancelled; cancelling "
                        "it again", task.get_name())


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    with sock:
        await server.serve(sockets=[sock])


class _Server(uvicorn.Server):
    """uvicorn without its signal handling (the daemon owns signals), telling when it
    listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    def install_signal_handlers(self) -> None:
        pass
