"""``labd demo``: the packaged demo lab in emulation, with the daemon on it.

The emulators run in their own process (``labd emulate``), as in hardware-in-the-loop CI,
and the daemon in this one (its store in a temporary file unless ``--db`` says where). Each
switch (the OCSs and the MZI mesh) gets a series of reconfigurations through the daemon's
engine (batches of 1, 2, 4 and 8 pairs, made and broken); every phase is timed and the
device's part set beside the emulator's ground truth, so the report shows what the device
took and what labd added. Light verification then moves light onto and off a metered path
of each switch and compares when the meters saw it with when the optical model says it
happened. A fault drill cuts a link mid-command and shows the driver reconnect,
resynchronise and report the drift.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from instruments.errors import InstrumentError
from instruments.events import EventQueue
from instruments.meter import MeterInfo, PowerMeter
from instruments.switch import OpticalSwitch, SwitchInfo
from labd import deadlines
from labd.client.control import Backdoor
from labd.daemon.core import Daemon, StartupReport
from labd.emulation.campaign import measure_failover
from labd.emulation.drill import timeline_table
from labd.emulation.readout import Load, PlainProgress, progress_for
from labd.emulation.rig import emulated_rig
from labd.emulation.verify import light_drill
from labd.errors import DrillError
from labd.fabric.engine import Result, log_resolution
from labd.lab.loader import Lab, load_lab
from labd.lab.wiring import MeteredPath, dark_ingress, metered_paths
from labd.mqtt.client import broker_reachable, local_broker
from labd.vocabulary import percentile

BATCHES = (1, 2, 4, 8)


@dataclass
class SwitchRun:
    switch: str
    driver: str
    device_ms: list[float] = field(default_factory=list)
    """acknowledged - dispatched, as labd measured it"""
    true_ms: list[float] = field(default_factory=list)
    """the emulator's own settling time for the same changes"""
    overhead_ms: list[float] = field(default_factory=list)
    light_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)


def _pairs(switch: OpticalSwitch, k: int, rng: random.Random) -> list[tuple[int, int]]:
    info = switch.info
    assert info is not None
    if info.egress:
        ins = rng.sample(range(1, info.ingress + 1), k)
        outs = rng.sample(range(info.ingress + 1, info.ports + 1), k)
        return list(zip(ins, outs, strict=True))
    ports = rng.sample(range(1, info.ports + 1), 2 * k)
    return [(ports[2 * i], ports[2 * i + 1]) for i in range(k)]


async def _exercise(daemon: Daemon, name: str, backdoor: Backdoor, rounds: int,
                    rng: random.Random, progress: Progress | PlainProgress,
                    task: TaskID) -> SwitchRun:
    """Make and break batches through the daemon's engine, as any client's request would.
    Each single pair goes over a metered path where the switch has one, so that the light
    column has figures for every metered switch (random pairs seldom meet a meter)."""
    engine = daemon.engine
    switch = engine.switches[name]
    run = SwitchRun(name, type(switch).driver)
    # Not on a mesh: its random pairs meet its meters already, and a lit path left on
    # it would light the dark ingresses its light drill relies on.
    metered: list[MeteredPath] = [p for p in metered_paths(daemon.lab, name)
                                  if p.meter in engine.meters] if run.driver != \
        "qontrol-mesh" else []
    await engine.reconfigure(name, replace={}, cause="measurement", verify_light=False)
    results: list[Result] = []
    for i in range(rounds):
        batch = BATCHES[i % len(BATCHES)]
        pairs = ([(metered[0].ingress, metered[0].egress)] if batch == 1 and metered
                 else _pairs(switch, batch, rng))
        results.append(await engine.reconfigure(name, connect=pairs, cause="measurement"))
        progress.advance(task)
        results.append(await engine.reconfigure(name, disconnect=[a for a, _ in pairs],
                                                cause="measurement"))
        progress.advance(task)
    changes = (await backdoor.truth(name))["changes"]
    for result in results:
        p = result.phases
        requested, dispatched, acked, done = (p["requested"], p["dispatched"],
                                              p["acknowledged"], p["done"])
        if requested is None or dispatched is None or acked is None or done is None:
            continue
        run.total_ms.append((done - requested) / 1e6)
        if p["light"] is not None:
            run.light_ms.append((p["light"] - dispatched) / 1e6)
        # The physical changes of this request: those that arrived while it was on the wire
        # (a mesh makes one per driver-board command; retiring a mesh circuit makes none).
        mine = [c for c in changes if dispatched <= c["arrived_ns"] <= acked]
        if not mine:
            continue
        true = (max(c["settled_ns"] for c in mine) - min(c["arrived_ns"] for c in mine)) / 1e6
        run.device_ms.append((acked - dispatched) / 1e6)
        run.true_ms.append(true)
        # Against the emulator's clock, which starts at the command that moves the light.
        run.overhead_ms.append((acked - (p["activated"] or dispatched)) / 1e6 - true)
    return run


async def run_demo(lab: Lab, *, rounds: int, console: Console, serve: bool,
                   seed: int | None = None, light_events: int = 20, db: str | None = None,
                   mqtt: str | None = None, port: int = 0, failover_db: str | None = None
                   ) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as scratch:
        store = db or str(Path(scratch) / "demo.sqlite")
        # The emulators apart, as the hardware would be; the demo lab's hosts are not
        # played (the failover lab below has them).
        async with emulated_rig(lab, db=store, port=port if serve else 0, mqtt=mqtt,
                                apart=True, hosts=False, tidy=False) as rig:
            console.print(f"[bold]labd demo[/]: lab [cyan]{lab.lab.name}[/] in emulation "
                          f"(control endpoint {rig.control_url})")
            daemon = rig.daemon
            await _main_job(daemon, rig.report, rig.backdoor, rounds, rng, light_events,
                            console, store)
            if serve:
                console.print(f"\nServing: API {daemon.url}/v1 (labd tui {daemon.url}); "
                              f"emulators' control endpoint {rig.control_url}.")
                await _serve_failover_lab(console, mqtt, port + 1 if port else 0,
                                          daemon.token,
                                          failover_db or str(Path(scratch) / "failover.sqlite"))
    return 0


async def _serve_failover_lab(console: Console, mqtt: str | None, port: int, token: str,
                              db: str) -> None:
    """Beside the demo lab, the packaged failover lab with its emulated GPU hosts, so that
    drills can be run from the UI (``d``) and watched. Serves until cancelled."""
    mqtt = _hosts_broker(console, mqtt)
    async with emulated_rig(load_lab("failover"), db=db, mqtt=mqtt, port=port,
                            token=token) as rig:
        console.print(f"Serving the failover lab (4 GPU hosts, 2 spares; press d in the UI "
                      f"for a drill): API {rig.daemon.url}/v1 (labd tui {rig.daemon.url}), "
                      f"store {db}.")
        console.print("Press Ctrl-C to stop.")
        await asyncio.Event().wait()


async def _main_job(daemon: Daemon, report: StartupReport, backdoor: Backdoor,
                    rounds: int, rng: random.Random, light_events: int, console: Console,
                    store: str) -> None:
    found = Table(box=None, show_header=False, pad_edge=False)
    for name, driver in daemon.drivers.items():
        info: SwitchInfo | MeterInfo | None = getattr(driver, "info", None)
        if info is None:
            found.add_row(name, type(driver).driver, f"[red]{report.failed.get(name)}[/]")
            continue
        size = info.size if isinstance(info, SwitchInfo) else f"{info.channels} ch"
        found.add_row(name, type(driver).driver, f"{info.vendor} {info.model}", size,
                      str(driver.connection.link.address))
    console.print(found)
    console.print(f"daemon: API {daemon.url}/v1, store {store}")
    switches = sorted(daemon.engine.switches)
    load = Load.start()
    with progress_for(console) as progress:
        tasks = [progress.add_task(f"reconfiguring {name}", total=2 * rounds)
                 for name in switches]
        runs = await asyncio.gather(*(
            _exercise(daemon, name, backdoor, rounds, random.Random(rng.random()), progress,
                      task)
            for name, task in zip(switches, tasks, strict=True)))
    console.print(_report(runs))
    console.print(load.stop().note(), style="yellow" if load.loaded else None,
                  highlight=False)
    meters = daemon.engine.meters
    switch_drivers = [daemon.engine.switches[name] for name in switches]
    if light_events and meters:
        await _light(daemon.lab, switch_drivers, meters, backdoor, light_events, console)
    # The drill cuts a network link: take a switch on TCP (a mesh's board is on a serial line).
    on_tcp = [s for s in switch_drivers if s.connection.link.address.scheme == "tcp"]
    if on_tcp:
        await _fault_drill(on_tcp[0], backdoor, console)


async def _light(lab: Lab, switches: list[OpticalSwitch], meters: dict[str, PowerMeter],
                 backdoor: Backdoor, events: int, console: Console) -> None:
    """Verify light on one metered path per switch; compare with the optical model."""
    table = Table(title=f"Light verification: detected - true threshold crossing "
                        f"({lab.lab.light_threshold_dbm:g} dBm), µs")
    for column in ("switch", "path", "meter", "how", "events", "p50", "p99", "max |err|"):
        table.add_column(column, justify="right" if column in ("events", "p50", "p99",
                                                               "max |err|") else "left")
    with progress_for(console) as progress:
        for switch in switches:
            paths = [p for p in metered_paths(lab, switch.name) if p.meter in meters]
            if not paths or switch.info is None:
                continue
            path, meter = paths[0], meters[paths[0].meter]
            mesh = type(switch).driver == "qontrol-mesh"
            # A mesh settles in tens of µs: log finer and over a shorter window (20 ms for
            # the command to get there, longer where the deadlines are scaled up).
            window = (deadlines.current().times(0.02) if mesh
                      else max(0.15, lab.light_window_ms(switch.name) / 1000))
            resolution = log_resolution(window, 1e-5 if mesh else 1e-4)
            task = progress.add_task(f"light on {switch.name}", total=events)

            def tick(task: TaskID = task) -> None:
                progress.advance(task)

            errors = await light_drill(
                switch, meter, path, backdoor, events,
                threshold_dbm=lab.lab.light_threshold_dbm,
                window_s=window, resolution_s=resolution,
                dark_ingress=dark_ingress(lab, switch.name, switch.info.ingress) if mesh
                else None, progress=tick)
            how = (f"logging {resolution * 1e6:g} µs" if meter.supports_logging
                   else "polling")
            table.add_row(switch.name, f"{path.ingress}→{path.egress}",
                          f"{path.meter}:{path.channel}", how, str(len(errors)),
                          f"{percentile(errors, 50):.0f}", f"{percentile(errors, 99):.0f}",
                          f"{max(abs(e) for e in errors):.0f}" if errors else "-")
    console.print(table)


def _report(runs: list[SwitchRun]) -> Table:
    table = Table(title="Reconfigurations through the daemon, ms",
                  caption="device: switch's answer · true: emulator's own · labd: added "
                          "by labd · light: until seen · total: whole request")
    for column in ("switch", "n", "device p50", "device p99", "true p50", "labd p50",
                   "labd p99", "light p50 (n)", "total p50", "total p99"):
        table.add_column(column, justify="left" if column == "switch" else "right")
    for run in runs:
        light = (f"{percentile(run.light_ms, 50):.2f} ({len(run.light_ms)})" if run.light_ms
                 else "no meter")
        table.add_row(run.switch, str(len(run.total_ms)),
                      f"{percentile(run.device_ms, 50):.2f}",
                      f"{percentile(run.device_ms, 99):.2f}",
                      f"{percentile(run.true_ms, 50):.2f}",
                      f"{percentile(run.overhead_ms, 50):.2f}",
                      f"{percentile(run.overhead_ms, 99):.2f}", light,
                      f"{percentile(run.total_ms, 50):.2f}",
                      f"{percentile(run.total_ms, 99):.2f}")
    return table


def _hosts_broker(console: Console, mqtt: str | None) -> str | None:
    """The broker emulated hosts report to: the one asked for if it answers, else this
    machine's if any; None: they report to the daemon over HTTP."""
    if mqtt is not None and broker_reachable(mqtt) is not None:
        console.print(f"\n[yellow]No MQTT broker answers at {mqtt}[/]: the failover lab's "
                      "hosts report to the daemon over HTTP instead.")
        mqtt = None
    return mqtt or local_broker()


async def failover_drill(console: Console, mqtt: str | None, seed: int | None,
                         db: str | None = None) -> None:
    """One GPU failure on the packaged failover lab: a ring of four emulated GPU hosts with
    two spares; the daemon swaps a spare in and restarts the job. The hosts report over
    MQTT where a broker answers, else to the daemon over HTTP. Its hosts start job
    processes: run it on the standard loop (labd.runtime). ``db``: the failover lab's
    store, kept (a temporary one otherwise)."""
    mqtt = _hosts_broker(console, mqtt)
    console.print("\n[bold]Failover drill[/] on the packaged lab [cyan]failover[/]: a GPU of a "
                  "4-rank ring job fails (Xid 79); the daemon picks a spare, rewires the OCS, "
                  "waits for light and links, and restarts the job with the new rank map "
                  f"(hosts report {'over MQTT' if mqtt else 'over HTTP'})")
    (result,) = await measure_failover(load_lab("failover"), drills=1, lost=0, mqtt=mqtt,
                                       console=console, seed=seed, db=db)
    console.print(timeline_table(result))
    if db is not None:
        console.print(f"The failover lab's records (this timeline among them) are kept in {db}.")


async def _fault_drill(switch: OpticalSwitch, backdoor: Backdoor, console: Console) -> None:
    """Cut the link while a connect is on the wire; show the reconnect and the drift."""
    console.print(f"\n[bold]Fault drill[/] on {switch.name}: the link is cut mid-command "
                  "(the switch carries the command out, the reply never comes)")
    events = EventQueue(switch)
    wait = deadlines.current().of("resync")
    await backdoor.inject(switch.name, {"kind": "drop", "apply": True})
    pair = _pairs(switch, 1, random.Random(7))
    start = time.monotonic_ns()
    try:
        await switch.connect(pair)
        console.print("  the command unexpectedly succeeded")
    except InstrumentError as exc:
        console.print(f"  command failed as expected: {exc}")
    try:
        resync = await events.next("resync", timeout=wait)
    except TimeoutError:
        raise DrillError(deadlines.timed_out(wait, f"{switch.name} to reconnect and "
                                                   "resynchronise")) from None
    finally:
        events.close()
    took = (resync.at_ns - start) / 1e6
    console.print(f"  reconnected and resynchronised in {took:.1f} ms; drift: {resync.detail}"
                  + (f" (unexpected {resync.drift.unexpected})" if resync.drift else ""))
