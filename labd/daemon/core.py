"""The daemon (``labd run``): one asyncio process owning every instrument of a lab, used as
``async with Daemon(lab, ...) as daemon:``.

Start-up opens the store and every instrument at once and reports, in one place
(``daemon.report``), each that failed and why (those keep reconnecting in the background);
the drift policy (labd.fabric.drift) then compares the intended state with what the switches
report, there and whenever a switch comes back online. Under ``--ha`` the lease and the
takeover are labd.ha.leadership's. The API is served, and the background loops (host
watchdog, job recoveries, MQTT bridge, HTTP server) run in one TaskGroup until the block is
left, which stops them all in order. labd.daemon.assembly builds it from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
from collections.abc import Coroutine, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from instruments.events import InstrumentEvent
from instruments.instrument import Instrument
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from labd.daemon.access import ApiSettings
from labd.daemon.journal import Journal
from labd.daemon.metrics import DaemonMetrics, LagSampler
from labd.daemon.placement import Cpu, Placement
from labd.daemon.server import Server, listen
from labd.daemon.services import Drills, Services
from labd.errors import BusError, LeaseError
from labd.events import EventHub
from labd.fabric.drift import DriftPolicy, StartupReport, open_instruments
from labd.fabric.drivers import make_driver
from labd.fabric.engine import Engine
from labd.ha.leadership import Leadership, Takeover
from labd.ha.lease import Lease
from labd.ha.role import HaSettings, Role
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import CommandQueues, HostMonitor
from labd.lab.loader import Lab, SwitchEntry
from labd.store.writer import Store, connection_row, normalise_url
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
#: How long a takeover waits for its instruments to open. One still opening (a stalled
#: device answers nothing until its reply timeout, 5 s on TL1) is dealt with when it comes
#: online: the lab is not left leaderless for it. An open normally takes milliseconds.
TAKEOVER_OPEN_S = 1.0


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
        Journal(self.hub)  # the journal's WARNING lines, read off the event stream
        self.store.on_commit = self.metrics.store_commit_seconds.observe
        self.role: Role | None = None
        """Under ``--ha``: leader, standby or taking over (labd.ha.role); None: this daemon
        alone runs the lab."""
        self.leadership: Leadership | None = None
        if ha is not None:
            self.role = self._standby(lab, db, ha)
            self.leadership = Leadership(self.role, Takeover(
                fence=self._fence, resync=self._resync, lead=self._lead,
                publish=self.hub.publish, spawn=self._spawn))
        self.report = StartupReport()
        """What start-up found: instruments connected and failed, drift, restored."""
        self.drift = DriftPolicy(self.engine, self.hub, {
            e.id: e.on_drift for e in lab.instrument if isinstance(e, SwitchEntry)},
            restore=restore)
        self.url = ""
        self._server: Server | None = None
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
    def restore(self) -> bool:
        """False under ``--no-restore``: every switch's drift is only reported."""
        return self.drift.restore

    def on_drift(self, switch: str) -> str:
        """What is done when ``switch`` holds other circuits than intended."""
        return self.drift.on_drift(switch)

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
                "warnings": list(driver.warnings),
            })
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"instruments": self.instruments_state(),
                "hosts": [h.as_dict() for h in self.hosts.hosts.values()],
                "jobs": [j.as_dict() for j in self.jobs.jobs.values()],
                "intended": {k: [[a, b] for a, b in sorted(v.items())]
                             for k, v in self.engine.intended.items()}}

    def _on_instrument_event(self, event: InstrumentEvent) -> None:
        self.drift.heard(event)
        state = event.state.value if event.state else None
        self.store.write_nowait(connection_row(event.instrument, event.kind, state,
                                               event.detail, event.at_ns))

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
                await self._resync()
            self._server, listener, self.url = listen(self.services, self.host, self.port)
            leadership = self.leadership
            if leadership is not None and await leadership.acquire(self.url, self.store.where):
                await leadership.take_over()
            self._group = asyncio.TaskGroup()
            await self._group.__aenter__()
            self._serving = self._group.create_task(self._server.serve_on(listener),
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
            if leadership is not None:
                self._leasing = self._group.create_task(leadership.keep(), name="labd-lease")
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

    # -- what a start-up and a takeover do ------------------------------------------------------
    async def _resync(self) -> Iterable[str]:
        """Open every instrument, deal with each switch's drift, read the jobs; the
        instruments that failed to open (they keep reconnecting)."""
        # A takeover leads without the instruments still opening after a second.
        self.report = await open_instruments(
            self.drivers, TAKEOVER_OPEN_S if self.role is not None else None)
        await self.drift.reconcile(self.report)
        await self.jobs.load()
        return self.report.failed

    def _fence(self, name: str, epoch: int) -> None:
        self.store.fence = (name, epoch)

    def _lead(self) -> int:
        """Act as the leader once the takeover has resynced: the recoveries for what failed
        meanwhile, the bus, the host watchdog; how many recoveries were queued."""
        # The bus first: a recovery queued now sends its commands on the leader's
        # session, once the hosts are heard on it, not on the standby's going away.
        if self.bus is not None:
            self.bus.lead()
        queued = self.jobs.resume()
        if self._group is not None:
            self._watch(first=False)
        return queued

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        assert self._group is not None
        self._loops.append(self._group.create_task(work, name=name))

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
            await _cancelled(self.drift.take_tasks())
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
        """Under ``--ha``: the renewals end, then the lease is given up, once nothing is
        under way (labd.ha.leadership)."""
        leasing, self._leasing = self._leasing, None
        if leasing is not None:
            await _cancelled([leasing])
        if self.leadership is not None:
            await self.leadership.step_down(SERVER_EXIT_S)

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
