"""An engine on emulated instruments in this process, reached over the in-memory link: no
socket, no daemon, a real store (SQLite in the test's directory).

    async with memory_engine(tmp_path, switch(size="8x8")) as bench:
        await bench.engine.reconfigure("ocs1", connect=[(1, 9)])
        bench.circuits("ocs1")  # the emulator's ground truth

The emulators are built as ``labd emulate`` builds them (labd.emulation.emulators) but
never started: their protocol interfaces are served on ``memory://`` addresses, and the
drivers are made from the lab file's entries as the daemon makes them. Start-up is the
daemon's (labd.fabric.drift: every instrument opened, each switch's drift dealt with as its
``on_drift`` says), and so is the wiring of the instruments' events to the drift policy.
Daemons' lives one after another on one emulated lab and one store: :func:`memory_lab`, then
:func:`engine_on` for each. GPU hosts' agents are played by :class:`MemoryAgents`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulators.lab import EmulatedLab, switch_of
from emulators.physics.crossconnect import SwitchModel
from instruments.instrument import Instrument as Driver
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from instruments.transports.memory import Answer, FarEnd, sessions, withdraw
from instruments.transports.memory import serve as serve_memory
from labd.agent.nics import NIC_POLL_S, EmulatedNics
from labd.emulation.emulators import EMULATION, NicLight, emulated_lab
from labd.events import Event, EventHub
from labd.fabric.drift import DriftPolicy, StartupReport, open_instruments
from labd.fabric.drivers import make_driver
from labd.fabric.engine import Engine
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import HostMonitor
from labd.hostwire import GpuHealth, Heartbeat, JobCommand, JobProgress, Message, NicLink
from labd.lab.loader import Lab, SwitchEntry, load_lab
from labd.store import Store
from tests.labs import write_lab


@dataclass
class MemoryLab:
    """An emulated lab served on the in-memory link, and a store, for one or more daemon
    lives (:func:`engine_on`) one after another."""

    lab: Lab
    emulated: EmulatedLab
    """The emulators (not started: nothing listens), for their ground truth and faults."""
    addresses: dict[str, str]
    """Each instrument's ``memory://`` address."""
    store: Store
    lines: dict[str, set[FarEnd]] = field(default_factory=dict)
    """Each instrument's open connections, as the device sees them."""
    answers: dict[str, Answer] = field(default_factory=dict)

    def model(self, switch: str) -> SwitchModel:
        model = switch_of(self.emulated.device(switch))
        assert model is not None
        return model

    def circuits(self, switch: str) -> dict[int, int]:
        """What the emulated switch truly holds."""
        return dict(self.model(switch).connections)

    def power_off(self, name: str) -> None:
        """The instrument goes dark: nothing is served at its address, and its open lines
        are cut (its driver reads the end of the stream)."""
        withdraw(self.addresses[name])
        for end in list(self.lines[name]):
            end.close()

    def power_on(self, name: str) -> None:
        """Power back: the device boots (a Polatis boots dark) and is served again at the
        same address."""
        self.emulated.device(name).boot()
        serve_memory(self.answers[name], self.addresses[name].removeprefix("memory://"))


def _tracked(answer: Answer, lines: set[FarEnd]) -> Answer:
    async def play(end: FarEnd) -> None:
        lines.add(end)
        try:
            await answer(end)
        finally:
            lines.discard(end)
    return play


@contextlib.contextmanager
def served_lab(emulated: EmulatedLab, lab: Lab,
               lines: dict[str, set[FarEnd]] | None = None,
               answers: dict[str, Answer] | None = None) -> Iterator[dict[str, str]]:
    """Each emulated instrument's protocol interface (the one its driver speaks) on the
    in-memory link, for the length of the block: instrument id → address. ``lines`` and
    ``answers``, if given, are filled with each one's open connections and what serves it."""
    addresses: dict[str, str] = {}
    lines = {} if lines is None else lines
    answers = {} if answers is None else answers
    try:
        for entry in lab.instrument:
            interface = emulated.device(entry.id).interfaces()[EMULATION[entry.driver][1]]
            answer = answers[entry.id] = _tracked(sessions(interface),
                                                  lines.setdefault(entry.id, set()))
            addresses[entry.id] = serve_memory(answer)
        yield addresses
    finally:
        for address in addresses.values():
            withdraw(address)


@contextlib.asynccontextmanager
async def memory_lab(tmp_path: Path, *parts: str, tag: str = "mem"
                     ) -> AsyncIterator[MemoryLab]:
    """A lab of ``parts`` (tests.labs; every instrument emulated) served on the in-memory
    link, its store empty."""
    _, path = write_lab(tmp_path, tag, *parts)
    lab = load_lab(path)
    emulated, _ = emulated_lab(lab)
    store = Store(tmp_path / "memory.sqlite")
    await store.open()
    lines: dict[str, set[FarEnd]] = {}
    answers: dict[str, Answer] = {}
    try:
        with served_lab(emulated, lab, lines, answers) as addresses:
            yield MemoryLab(lab, emulated, addresses, store, lines, answers)
    finally:
        await store.close()


@dataclass
class MemoryBench:
    lab: Lab
    emulated: EmulatedLab
    """The emulators (not started: nothing listens), for their ground truth and faults."""
    addresses: dict[str, str]
    """Each instrument's ``memory://`` address."""
    drivers: dict[str, Driver]
    store: Store
    hub: EventHub
    engine: Engine
    drift: DriftPolicy
    report: StartupReport
    """What start-up found and did."""
    memory: MemoryLab
    events: list[Event] = field(default_factory=list)
    """Every event published on ``hub``, from before start-up."""

    def model(self, switch: str) -> SwitchModel:
        return self.memory.model(switch)

    def circuits(self, switch: str) -> dict[int, int]:
        """What the emulated switch truly holds."""
        return self.memory.circuits(switch)


def wire_events(drivers: dict[str, Driver], hub: EventHub, drift: DriftPolicy) -> None:
    """The instruments' events as the daemon takes them (labd.daemon.core): through the
    drift policy, which publishes them and deals with a switch back online."""
    for driver in drivers.values():
        driver.add_listener(drift.heard)


@contextlib.asynccontextmanager
async def engine_on(memory: MemoryLab, *, light_window_s: float | None = None,
                    restore: bool = True) -> AsyncIterator[MemoryBench]:
    """One daemon life's engine on ``memory``: drivers made from the lab file, opened and
    reconciled with the store's intended state as the daemon's start-up does (``restore``:
    False as ``labd run --no-restore``). Its heals are stopped and its drivers closed at
    the end."""
    lab = memory.lab
    hub = EventHub()
    events: list[Event] = []
    hub.observe(events.append)
    drivers = {entry.id: make_driver(entry, memory.addresses[entry.id])
               for entry in lab.instrument}
    engine = Engine(lab, {k: d for k, d in drivers.items() if isinstance(d, OpticalSwitch)},
                    {k: d for k, d in drivers.items() if isinstance(d, PowerMeter)},
                    memory.store, hub, light_window_s=light_window_s)
    drift = DriftPolicy(engine, hub, {e.id: e.on_drift for e in lab.instrument
                                      if isinstance(e, SwitchEntry)}, restore=restore)
    wire_events(drivers, hub, drift)
    try:
        report = await open_instruments(drivers)
        await drift.reconcile(report)
        yield MemoryBench(lab, memory.emulated, memory.addresses, drivers, memory.store, hub,
                          engine, drift, report, memory, events)
    finally:
        for task in drift.take_tasks():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for driver in drivers.values():
            await driver.close()


@contextlib.asynccontextmanager
async def memory_engine(tmp_path: Path, *parts: str, tag: str = "mem",
                        light_window_s: float | None = None,
                        restore: bool = True) -> AsyncIterator[MemoryBench]:
    """An engine on a lab of ``parts`` (tests.labs; every instrument emulated), its
    drivers open on the in-memory link, its store empty."""
    async with memory_lab(tmp_path, *parts, tag=tag) as memory, \
            engine_on(memory, light_window_s=light_window_s, restore=restore) as bench:
        yield bench


class MemoryAgents:
    """The GPU hosts' agents played in this process: what an agent would publish is handed
    to the daemon's :class:`HostMonitor` as the bytes it would send (the hostwire models'
    own serialisation), and the daemon's job commands (:meth:`send`, the job manager's
    ``send``) are answered as ``labd agent`` answers them (labd.agent.runner): a start stops
    the job's ranks running here (each reports ``exited`` under its own epoch and run), then
    starts the ranks placed here (``started``, ``ready``, ``step``). NIC links follow the
    light the optical model delivers to each host's endpoints (:meth:`check_links`,
    polled at the agent's own period by :meth:`watch_links`)."""

    def __init__(self, lab: Lab, monitor: HostMonitor, emulated: EmulatedLab) -> None:
        self.lab, self.monitor = lab, monitor
        self.hosts = {h.id: h for h in lab.host}
        self.commands: list[tuple[str, JobCommand]] = []
        """Every job command the daemon sent, with the host it went to."""
        self.sent: list[tuple[str, Message]] = []
        """Every report handed to the monitor, with its host."""
        self.gpus = {h.id: dict.fromkeys(range(h.gpus), "healthy") for h in lab.host}
        self.alive = {h.id: False for h in lab.host}
        self.running: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        """(host, job) → its ranks running here: (rank, epoch, run)."""
        self.links: dict[str, dict[str, bool]] = {h.id: {} for h in lab.host}
        light = NicLight(emulated.optics) if emulated.optics is not None else None
        self.light = light
        self.nics: dict[str, EmulatedNics] = {}
        if light is not None:
            for h in lab.host:
                light.nodes.extend(h.nics)
                self.nics[h.id] = EmulatedNics(h.nics, light.dbm,
                                               threshold_dbm=lab.lab.light_threshold_dbm,
                                               link_up_s=h.link_up_ms / 1000)
        self._answers: set[asyncio.Task[None]] = set()

    # -- what the agents publish ---------------------------------------------------------
    def publish(self, host: str, message: Message) -> None:
        """One message from ``host``'s agent, delivered now."""
        kind = "heartbeat" if isinstance(message, Heartbeat) else "events"
        self.sent.append((host, message))
        problem = self.monitor.handle(host, kind, message.stamped(time.monotonic_ns()))
        assert problem is None, problem

    def heartbeat(self, host: str) -> None:
        self.publish(host, Heartbeat(
            at_ns=time.monotonic_ns(), interval_s=self.hosts[host].heartbeat_s,
            gpus=[{"index": i, "health": h} for i, h in self.gpus[host].items()],  # type: ignore[typeddict-item]
            nics=dict(self.links[host]) if host in self.nics else None))

    def online(self, *hosts: str) -> None:
        """Each host's agent starts (all of them by default): its status, a heartbeat."""
        for host in hosts or tuple(self.hosts):
            self.alive[host] = True
            self.links[host] = self.nics[host].links() if host in self.nics else {}
            problem = self.monitor.handle(host, "status", b"online")
            assert problem is None, problem
            self.heartbeat(host)

    def fail_gpu(self, host: str, gpu: int, reason: str) -> int:
        """A GPU fails and its agent reports it; returns when (CLOCK_MONOTONIC ns)."""
        now = time.monotonic_ns()
        was, self.gpus[host][gpu] = self.gpus[host][gpu], "failed"
        self.publish(host, GpuHealth(gpu=gpu, health="failed", was=was,  # type: ignore[arg-type]
                                     reasons=[reason], at_ns=now, since_ns=now))
        return now

    def lose(self, host: str) -> None:
        """The host dies: its job's ranks with it, and the broker delivers its last will."""
        self.alive[host] = False
        for key in [k for k in self.running if k[0] == host]:
            del self.running[key]
        self.links[host] = {}
        problem = self.monitor.handle(host, "status", b"offline")
        assert problem is None, problem

    def revive(self, host: str) -> None:
        """The host is back (rebooted): healthy GPUs, reporting again, no job running."""
        self.gpus[host] = dict.fromkeys(self.gpus[host], "healthy")
        self.online(host)

    def check_links(self) -> None:
        """Read every live host's NICs once; report each link that changed."""
        if self.light is not None:
            self.light.refresh()
        for host, nics in self.nics.items():
            if not self.alive[host]:
                continue
            now = time.monotonic_ns()
            for nic, up in nics.links().items():
                was = self.links[host].get(nic)
                if was != up:
                    self.links[host][nic] = up
                    self.publish(host, NicLink(nic=nic, up=up, was=was, at_ns=now))

    async def watch_links(self) -> None:
        """:meth:`check_links` at the agent's own poll period, until cancelled."""
        while True:
            self.check_links()
            await asyncio.sleep(NIC_POLL_S)

    # -- what the daemon sends -----------------------------------------------------------
    async def send(self, host: str, message: dict[str, Any]) -> None:
        """The job manager's ``send``: the command reaches a live host's agent, which
        answers it in a task of its own; a dead host's is lost."""
        command = JobCommand.model_validate(message)
        self.commands.append((host, command))
        if self.alive[host]:
            task = asyncio.get_running_loop().create_task(self._answer(host, command))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)

    def progress(self, host: str, job: str, rank: int, epoch: int, run: str,
                 progress: str, **more: Any) -> None:
        self.publish(host, JobProgress(job=job, epoch=epoch, run=run, rank=rank,
                                       progress=progress,  # type: ignore[arg-type]
                                       at_ns=time.monotonic_ns(), **more))

    async def _answer(self, host: str, command: JobCommand) -> None:
        for rank, epoch, run in self.running.pop((host, command.job), []):
            self.progress(host, command.job, rank, epoch, run, "exited", code=-15)
        if command.action == "stop":
            return
        mine = [r.rank for r in command.ranks if r.host == host]
        self.running[(host, command.job)] = [(r, command.epoch, command.run) for r in mine]
        # Each step a turn of the loop of its own, as the ranks' output arrives.
        for progress in ("started", "ready", "step"):
            await asyncio.sleep(0)
            if (host, command.job) not in self.running:
                return  # the host died, or another command replaced this run
            for rank in mine:
                self.progress(host, command.job, rank, command.epoch, command.run, progress,
                              **({"step": 1} if progress == "step" else {}))

    async def close(self) -> None:
        for task in list(self._answers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass
class JobsBench:
    """A daemon's hosts' side on a :class:`MemoryBench`: the host monitor, the job manager
    (its recovery workers running), and the agents played in this process."""

    bench: MemoryBench
    hosts: HostMonitor
    jobs: JobManager
    agents: MemoryAgents


@contextlib.asynccontextmanager
async def memory_jobs(bench: MemoryBench) -> AsyncIterator[JobsBench]:
    """The job manager and host monitor wired as the daemon wires them (labd.daemon.core),
    their ``send`` the agents' of :class:`MemoryAgents`, every host online; the recovery
    workers and the agents' NIC watch run until the block ends."""
    hosts = HostMonitor(bench.hub, [h.id for h in bench.lab.host])
    agents = MemoryAgents(bench.lab, hosts, bench.emulated)
    jobs = JobManager(bench.lab, bench.engine, hosts, bench.hub, bench.store, agents.send)
    hosts.listen(jobs)
    await jobs.load()
    agents.online()
    tasks = [asyncio.create_task(jobs.run(), name="memory-recovery"),
             asyncio.create_task(agents.watch_links(), name="memory-nics")]
    try:
        yield JobsBench(bench, hosts, jobs, agents)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await agents.close()
