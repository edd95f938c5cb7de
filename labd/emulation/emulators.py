"""Lab-file entries made into emulators (an ``EmulatedLab``) and emulated GPU hosts (the real
agent on emulated GPUs): what ``labd emulate`` serves, and what the rig (labd.emulation.rig)
starts in-process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from emulators.lab import EmulatedLab, EmulatorSpec, OpticsSpec, ServeSpec, build_device
from emulators.physics.optics import EndpointSpec, FiberSpec, OpticalModel
from emulators.physics.timing import link_up_draw
from instruments.switch import parse_size
from labd.agent.backends import EmulatedBackend
from labd.agent.nics import NIC_POLL_S, EmulatedNics
from labd.agent.reporter import Agent
from labd.agent.runner import emulated_job_command
from labd.errors import LabFileError
from labd.lab.loader import (
    CalientTl1Entry,
    HostEntry,
    Instrument,
    KeysightEntry,
    Lab,
    MeshEntry,
    SwitchEntry,
    Tl1Credentials,
)
from labd.mqtt.credentials import BusSettings

#: driver → (emulator kind, the emulator interface that driver talks to)
EMULATION: dict[str, tuple[str, str]] = {
    "polatis-scpi": ("polatis", "scpi"),
    "polatis-tl1": ("polatis", "tl1"),
    "calient-tl1": ("calient", "tl1"),
    "qontrol-mesh": ("mesh", "serial"),
    "keysight-n77xx": ("keysight", "scpi"),
    "thorlabs-pm100": ("thorlabs", "scpi"),
}


def spec_for(entry: Instrument) -> EmulatorSpec:
    kind, interface = EMULATION[entry.driver]
    options: dict[str, Any] = {}
    if isinstance(entry, Tl1Credentials):
        options["users"] = {entry.user: entry.resolved_password()}
    if isinstance(entry, CalientTl1Entry):
        options["ports_per_slot"] = entry.ports_per_slot
        if entry.size:
            options["ports"] = int(entry.size)
    elif isinstance(entry, MeshEntry):
        options["ports"] = parse_size(entry.size)[0]
        options["v_pi"] = entry.v_pi
    elif isinstance(entry, KeysightEntry):
        if entry.channels:
            options["model"] = "N7745A" if entry.channels == 8 else "N7744A"
    elif isinstance(entry, SwitchEntry) and entry.size:
        options["size"] = entry.size
    options.update(entry.emulator.options)
    port = 0
    if entry.address and entry.address.startswith("tcp://"):
        port = urlsplit(entry.address).port or 0
    if entry.emulator.serve in ("hislip", "vxi11") and interface != "scpi":
        raise ValueError(f"field 'emulator': serve = \"{entry.emulator.serve}\" is for SCPI "
                         f"instruments; {entry.driver} speaks {interface}: use tcp or pty")
    default = "pty" if kind == "mesh" else "tcp"
    serve = {interface: ServeSpec(port=port, serve=entry.emulator.serve or default)}
    return EmulatorSpec(entry.id, kind, options, entry.emulator.timing(), serve)


def emulated_lab(lab: Lab, *, control_port: int = 0) -> tuple[EmulatedLab, list[Instrument]]:
    """The emulated lab for a lab file (not started) and the entries it plays."""
    entries = [e for e in lab.instrument if e.emulate]
    specs = []
    problems = []
    for index, entry in enumerate(lab.instrument):
        if not entry.emulate:
            continue
        try:
            spec = spec_for(entry)
            build_device(spec)  # validates the emulator options before anything listens
            specs.append(spec)
        except (ValueError, TypeError) as exc:
            where = str(exc) if str(exc).startswith("field ") else f"field 'emulator': {exc}"
            problems.append(f"{lab.source}: [[instrument]] #{index + 1} (id {entry.id!r}), "
                            f"{where}")
    if problems:
        raise LabFileError(lab.source, problems)
    return EmulatedLab(specs, control_port=control_port, optics=optics_of(lab)), entries


def optics_of(lab: Lab) -> OpticsSpec | None:
    """The lab's wiring for the optical model; None when it declares no fibres."""
    if not lab.fiber:
        return None
    return OpticsSpec(
        [EndpointSpec(e.id, e.launch_dbm, e.wavelength_nm) for e in lab.endpoint],
        [FiberSpec(f.src, f.dst, f.loss_db, f.tap, f.tap_ratio) for f in lab.fiber],
        threshold_dbm=lab.lab.light_threshold_dbm)


def endpoint_of(lab: EmulatedLab, entry: Instrument) -> str:
    return lab.endpoints[entry.id][EMULATION[entry.driver][1]]


def write_resolved(lab: Lab, emulated: EmulatedLab, entries: list[Instrument],
                   target: Path, hosts: Iterable[str] = ()) -> None:
    """A copy of the lab file whose emulated entries point at the running emulators, and
    whose ``hosts`` (played here) are no longer emulated: a daemon on the copy must not play
    them a second time (two agents of one host take its broker session from each other)."""
    import tomllib

    data = tomllib.loads(Path(lab.source).read_text(encoding="utf-8"))
    by_id = {e.id: e for e in entries}
    for item in data.get("instrument", []):
        entry = by_id.get(item.get("id"))
        if entry is not None:
            item["address"] = endpoint_of(emulated, entry)
            item["emulate"] = False
    played = set(hosts)
    for item in data.get("host", []):
        if item.get("id") in played:
            item["emulate"] = False
    target.write_text(lab_toml(data), encoding="utf-8")


def lab_toml(data: dict[str, Any]) -> str:
    """A lab file's data as TOML a person can copy entries from: every array of tables as
    ``[[instrument]]``-style tables and every table under its own header (a serializer's
    inline ``endpoint = [{...}, ...]`` cannot be pasted after a ``[lab]`` table: it would
    land inside it)."""
    import tomli_w

    def is_tables(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(
            isinstance(v, dict) for v in value)

    def key_of(key: str) -> str:
        # As the serializer writes a key (bare, or quoted and escaped as TOML wants).
        return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else \
            tomli_w.dumps({key: 0}).rsplit(" = ", 1)[0]

    def section(header: str, path: str, table: dict[str, Any]) -> list[str]:
        plain = {k: v for k, v in table.items()
                 if not isinstance(v, dict) and not is_tables(v)}
        out = [header + "\n" + tomli_w.dumps(plain)]
        for key, value in table.items():
            name = f"{path}.{key_of(key)}"
            if isinstance(value, dict):
                out += section(f"[{name}]", name, value)
            elif is_tables(value):
                for item in value:
                    out += section(f"[[{name}]]", name, item)
        return out

    top = {k: v for k, v in data.items() if not isinstance(v, dict) and not is_tables(v)}
    parts = [tomli_w.dumps(top)] if top else []
    for key in sorted(data, key=lambda k: (k != "lab", k != "daemon")):  # [lab] first
        value, name = data[key], key_of(key)
        if isinstance(value, dict):
            parts += section(f"[{name}]", name, value)
        elif is_tables(value):
            for item in value:
                parts += section(f"[[{name}]]", name, item)
    return "\n".join(parts)


class NicLight:
    """The light at the emulated hosts' NICs, all of them read in one pass of the optical
    model (:meth:`refresh`, once per poll of :class:`EmulatedHosts`): a pass per NIC would
    cost the whole lab's light times the number of NICs."""

    def __init__(self, optics: OpticalModel) -> None:
        self.optics = optics
        self.nodes: list[str] = []
        self.changes = 0
        """Counts what changes the NICs' links without moving light: a host dies or comes
        back, a NIC is forced down."""
        self._dbm: dict[str, float] = {}

    def refresh(self) -> None:
        self._dbm = self.optics.dbm_now_many(self.nodes)

    def dbm(self, node: str) -> float:
        if node not in self._dbm:
            self.refresh()
        value = self._dbm.get(node)
        return value if value is not None else self.optics.dbm_now(node)


def link_up(host: HostEntry) -> float | Callable[[], float]:
    """A host's NIC link-up time: fixed, or drawn from a published profile (seeded by the
    host's name, so a replay draws the same times)."""
    if isinstance(host.link_up_ms, str):
        return link_up_draw(host.link_up_ms, random.Random(host.id))
    return host.link_up_ms / 1000


class EmulatedHost:
    """A GPU host in emulation: ``labd agent`` with emulated GPUs, run in this process."""

    def __init__(self, lab: Lab, host: HostEntry, mqtt: BusSettings | None,
                 light: NicLight | None,
                 daemon: tuple[str, str] | None = None) -> None:
        self.id = host.id
        self.backend = EmulatedBackend(count=host.gpus)
        self.light = light
        if light is not None:
            light.nodes.extend(host.nics)
        # NIC links follow the light the optical model delivers to the host's endpoints.
        self.nics = EmulatedNics(host.nics, light.dbm,
                                 threshold_dbm=lab.lab.light_threshold_dbm,
                                 link_up_s=link_up(host)) if light else None
        # Every job of the lab runs the emulated trainer here.
        jobs = {job.id: emulated_job_command(job.emulator.init_ms, job.emulator.step_ms)
                for job in lab.job}
        self.agent = Agent(lab=lab.lab.name, host=host.id, backend=self.backend,
                           mqtt=mqtt.for_host(host.id) if mqtt else None,
                           daemon=daemon[0] if daemon else None,
                           token=daemon[1] if daemon else None,
                           interval=host.heartbeat_s, expected_gpus=host.gpus, nics=self.nics,
                           watch_links=False, jobs=jobs)
        self.killed_at: int | None = None
        self.task: asyncio.Task[None] | None = None
        self.alive = False

    def start(self) -> None:
        self.task = asyncio.create_task(self.agent.run(), name=f"host-{self.id}")
        self.alive = True

    def fail(self, gpu: int, signal: str) -> int:
        """Inject a GPU failure; returns when (CLOCK_MONOTONIC ns)."""
        return self.backend.fail(gpu, signal)  # ValueError names what is wrong

    def heal(self, gpu: int | None) -> None:
        self.backend.heal(gpu)

    async def kill(self) -> int:
        """The host dies mid-stride: its reports just stop, its job's processes die.
        Returns when (CLOCK_MONOTONIC ns)."""
        self.backend.freeze(True)
        if self.nics is not None:
            self.nics.dead = True
            self._touched()
        self.agent.jobs.kill_all()
        self.alive = False
        self.killed_at = time.monotonic_ns()
        return self.killed_at

    def revive(self) -> None:
        """The host is back (rebooted): healthy GPUs, reporting again, no job running."""
        self.backend.heal()
        self.backend.freeze(False)
        if self.nics is not None:
            self.nics.dead = False
            self._touched()
        self.alive = True
        self.killed_at = None

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.agent.jobs.close()

    def nic_down(self, nic: str, down: bool) -> None:
        if self.nics is None or nic not in self.nics.endpoints:
            raise ValueError(f"host {self.id} has no emulated NIC {nic!r}")
        if down:
            self.nics.down.add(nic)
        else:
            self.nics.down.discard(nic)
        self._touched()

    def _touched(self) -> None:
        if self.light is not None:
            self.light.changes += 1

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "alive": self.alive, "gpus": self.backend.count,
                "failures": {str(k): v for k, v in self.backend.failures.items()},
                "heartbeats": self.agent.beats, "links": dict(self.agent.links),
                "killed_at_ns": self.killed_at,
                "failed_at_ns": {str(k): v for k, v in self.backend.failed_at.items()}}


class EmulatedHosts:
    """The emulated hosts of one process, run together. Their NICs are read by one watch
    for all of them, not a timer per host (a pod's thousand hosts, each polling every
    ``period_s``, would keep the event loop busy with nothing but timers), and only when
    something could have changed: a device of the optical model moved or still settles,
    a host died, came back or had a NIC forced down, or a link waits out its link-up
    delay. They stop together."""

    def __init__(self, hosts: list[EmulatedHost], light: NicLight | None = None,
                 period_s: float = NIC_POLL_S) -> None:
        self.hosts = hosts
        self.light = light
        self.period_s = period_s
        self.ticks = 0
        """Polls of the watch so far."""
        self.reads = 0
        """Polls that read the NICs (the rest found nothing that could have changed)."""
        self._ticked = asyncio.Condition()
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        for host in self.hosts:
            host.start()
        if any(host.nics is not None for host in self.hosts):
            self._watch = asyncio.create_task(self.watch(), name="emulated-nics")

    async def wait_ticks(self, count: int) -> None:
        """Until the watch has polled ``count`` times in all."""
        async with self._ticked:
            await self._ticked.wait_for(lambda: self.ticks >= count)

    def _state(self) -> Hashable | None:
        """What the NICs' links follow, or None while a device of the optical model moves
        (then every poll reads them)."""
        steady = self.light.optics.steady() if self.light is not None else None
        if steady is None or self.light is None:
            return None
        return steady, self.light.changes

    async def watch(self) -> None:
        """Poll every host's NICs each ``period_s`` (:meth:`start` runs it)."""
        last: Hashable | None = None
        waiting = False
        while True:
            state = self._state()
            if state is None or state != last or waiting:
                waiting = False
                if self.light is not None:
                    self.light.refresh()
                for host in self.hosts:
                    if host.nics is not None:
                        host.agent.check_links()
                        waiting = waiting or host.nics.pending()
                last = state
                self.reads += 1
            self.ticks += 1
            async with self._ticked:
                self._ticked.notify_all()
            await asyncio.sleep(self.period_s)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        # Together: each says its goodbye to the broker, and a pod's worth one after
        # another would take seconds.
        await asyncio.gather(*(host.stop() for host in self.hosts))


def emulated_hosts(lab: Lab, mqtt: BusSettings | None, emulated: EmulatedLab | None = None, *,
                   daemon: tuple[str, str] | None = None) -> list[EmulatedHost]:
    """The lab's ``emulate = true`` hosts. They report to a broker, or, where the lab has
    none, to the daemon over HTTP (``daemon``: its URL and token)."""
    wanted = [h for h in lab.host if h.emulate]
    if wanted and not mqtt and not daemon:
        raise LabFileError(lab.source, [
            f"{lab.source}: [[host]] {', '.join(repr(h.id) for h in wanted)} "
            "emulate = true: their agents need a broker; give --mqtt URL"])
    optics = emulated.optics if emulated is not None else None
    light = NicLight(optics) if optics is not None else None
    hosts = [EmulatedHost(lab, h, mqtt, light, None if mqtt else daemon) for h in wanted]
    if emulated is not None:  # the control endpoint fails, kills and revives them
        emulated.hosts.update((host.id, host) for host in hosts)
    return hosts


def run_together(hosts: list[EmulatedHost]) -> EmulatedHosts:
    """:func:`emulated_hosts`' hosts as one :class:`EmulatedHosts`."""
    light = next((host.light for host in hosts if host.light is not None), None)
    return EmulatedHosts(hosts, light)
