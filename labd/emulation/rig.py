"""The one emulated rig: a lab file's emulators, then the daemon on them, then its emulated
GPU hosts, started together and stopped the other way round.

The emulators run in this process or in a ``labd emulate`` process of their own; the daemon
is built by labd.daemon.assembly, as on real instruments, given the emulators' addresses.
``labd run`` (for ``emulate = true`` entries), ``labd demo``, ``labd measure --lab``, the
drills, the benchmarks and the tests all start their emulated labs here.

    async with emulated_rig(load_lab("demo"), db="labd.sqlite") as rig:
        rig.daemon.url, rig.backdoor, rig.report
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import aiomqtt

from emulators.lab import EmulatedLab
from labd.client.control import Backdoor, spawn_emulators
from labd.daemon.access import ApiSettings
from labd.daemon.assembly import Assembly, assemble
from labd.daemon.core import Daemon, StartupReport
from labd.daemon.placement import Cpu
from labd.emulation.drill import DrillService
from labd.emulation.emulators import (
    EmulatedHost,
    emulated_hosts,
    emulated_lab,
    endpoint_of,
    run_together,
)
from labd.ha.role import HaSettings
from labd.lab.loader import Lab
from labd.mqtt.client import session
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import lab_root, new_instance


@dataclass
class Rig:
    """An emulated lab with the daemon on it."""

    daemon: Daemon
    backdoor: Backdoor
    """The emulators' control endpoint: faults, timing, ground truth."""
    hosts: list[EmulatedHost] = field(default_factory=list)
    """The GPU hosts emulated in this process (none when the emulators run apart)."""
    emulated: EmulatedLab | None = None
    """The emulators, where they run in this process."""
    addresses: dict[str, str] = field(default_factory=dict)
    """Where each emulated instrument listens."""
    bus: BusSettings | None = None
    """The daemon's broker, its lab instance and keys (``RIG_CLIENT`` seals commands)."""

    @property
    def report(self) -> StartupReport:
        return self.daemon.report

    @property
    def control_url(self) -> str:
        return self.backdoor.url


#: The client that may seal switch commands on a rig's bus (its key: ``Rig.bus``).
RIG_CLIENT = "rig"


def rig_bus(lab: Lab, mqtt: str | BusSettings) -> BusSettings:
    """The bus a rig's daemon uses: a plain URL gets an instance of its own (two rigs of one
    lab on a broker never hear each other); every emulated host gets a key (where the
    settings give none) and so does the rig's own client, :data:`RIG_CLIENT`."""
    settings = BusSettings(mqtt, new_instance()) if isinstance(mqtt, str) else mqtt
    return settings.with_keys(hosts={h.id: new_key() for h in lab.host if h.emulate},
                              clients={RIG_CLIENT: new_key()})


@contextlib.asynccontextmanager
async def emulated_rig(lab: Lab, *, db: str, mqtt: str | BusSettings | None = None,
                       host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                       api: ApiSettings | None = None, restore: bool = True,
                       light_window_s: float | None = None, apart: bool = False,
                       hosts: bool = True, tidy: bool = True, ha: HaSettings | None = None,
                       cpu: Cpu | None = None) -> AsyncIterator[Rig]:
    """Start the lab's emulators, a daemon on them, then its emulated GPU hosts; on leaving,
    stop them all (and clear the retained MQTT status the hosts and the daemon leave).
    ``mqtt`` as a URL: the rig's own lab instance and keys (:func:`rig_bus`); as settings:
    their instance, plus keys for the emulated hosts that have none.

    Hosts (unless ``hosts`` is false) report to ``mqtt``, or without one to the daemon over
    HTTP. With ``apart`` the instruments' emulators run in a ``labd emulate`` process of
    their own, as hardware would: the daemon's timings are then not shared with the devices'
    work on one event loop (no hosts are played then). Failover drills through the API
    (``POST /v1/drills/failover``) are offered wherever hosts are played.
    ``token`` is the daemon's admin key, ``api`` its keys and roles, body limit and TLS
    (labd.daemon.access); the emulated hosts use the daemon's own key.
    Entries that are not emulated keep their lab-file addresses. ``tidy`` clears the
    retained MQTT topics the run leaves (a throwaway lab); ``labd run`` keeps them, as the
    daemon's last word (``offline``) is for the lab's subscribers. ``cpu``: the one CPU the
    daemon's event loop is held on (labd.daemon.placement). What these do not name comes
    from the lab's ``[daemon]`` table and ``LABD_*``, as for ``labd run``
    (labd.daemon.assembly.assemble).
    """
    built = assemble(lab, db=db, host=host, port=port, token=token, api=api, mqtt=mqtt,
                     restore=restore, light_window_s=light_window_s, ha=ha, cpu=cpu)
    async with rig_on(built, apart=apart, hosts=hosts, tidy=tidy) as rig:
        yield rig


@contextlib.asynccontextmanager
async def rig_on(built: Assembly, *, apart: bool = False, hosts: bool = True,
                 tidy: bool = True) -> AsyncIterator[Rig]:
    """The rig of :func:`emulated_rig` around a daemon already assembled (``labd run`` on a
    lab with ``emulate = true`` entries): its emulators first, the daemon on their
    addresses, then the emulated hosts."""
    lab = built.lab
    bus = rig_bus(lab, built.bus) if built.bus is not None else None
    async with contextlib.AsyncExitStack() as stack:
        emulated: EmulatedLab | None = None
        if apart:
            process = await spawn_emulators(lab.source)
            stack.push_async_callback(process.stop)
            addresses, control = dict(process.endpoints), process.control
        else:
            emulated, entries = emulated_lab(lab)
            await stack.enter_async_context(emulated)
            addresses = {e.id: endpoint_of(emulated, e) for e in entries}
            control = emulated.control_url
        backdoor = Backdoor(control)
        stack.push_async_callback(backdoor.close)
        started = False

        async def tidy_up() -> None:
            # Only once this rig's daemon served (another may serve a lab of that name).
            if started and bus is not None:
                await clear_retained(bus, lab.lab.name, [h.id for h in lab.host])

        if bus is not None and tidy:  # after the hosts and the daemon said their last word
            stack.push_async_callback(tidy_up)
        daemon = await stack.enter_async_context(built.replace(bus=bus).daemon(addresses))
        started = True
        rig = Rig(daemon, backdoor, addresses=addresses, emulated=emulated, bus=bus)
        if emulated is not None and hosts:
            # Agents with emulated GPUs, once the daemon listens (without a broker they
            # report to its API).
            rig.hosts = emulated_hosts(lab, bus, emulated, daemon=(daemon.url, daemon.token))
            fleet = run_together(rig.hosts)
            stack.push_async_callback(fleet.stop)
            # Before they go: the rig's end is no failure to recover from.
            stack.callback(daemon.hosts.unlisten, daemon.jobs)
            if rig.hosts and daemon.bus is not None:
                # Their first messages should find the daemon listening; a broker that
                # is not there yet is the bridge's to retry.
                with contextlib.suppress(TimeoutError):
                    await daemon.bus.wait_sessions(1, timeout=10)
            fleet.start()
        if rig.hosts:
            drills = DrillService(rig)
            daemon.drills = drills
            stack.push_async_callback(drills.close)
        yield rig


async def clear_retained(bus: str | BusSettings, lab: str, hosts: Iterable[str]) -> None:
    """Clear the retained status topics a run leaves on the broker (hosts' and daemon's)."""
    settings = BusSettings.of(bus)
    root = lab_root(lab, settings.instance)
    with contextlib.suppress(aiomqtt.MqttError):
        async with session(**settings.login()) as cleaner:
            for host in hosts:
                await cleaner.publish(f"{root}/hosts/{host}/status", b"", retain=True)
            await cleaner.publish(f"{root}/daemon", b"", retain=True)
