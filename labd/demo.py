"""``labd demo``: the packaged demo lab in emulation, driven through labd's drivers.

Each switch (the OCSs and the MZI mesh) gets a series of reconfigurations (batches of 1, 2,
4 and 8 pairs, made and broken); every one is timed and set beside the emulator's ground
truth, so the report shows what the device took and what labd added. Light verification
then moves light onto and off a metered path of each switch and compares when the meters
saw it with when the optical model says it happened. A fault drill cuts a link
mid-command and shows the driver reconnect, resynchronise and report the drift.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from emulators.lab import EmulatedLab
from instruments.errors import InstrumentError
from instruments.events import EventQueue
from instruments.meter import MeterInfo, PowerMeter
from instruments.switch import OpticalSwitch, SwitchInfo
from labd.drivers import make_driver
from labd.emulate import emulated_lab, endpoint_of
from labd.labfile import Lab
from labd.stats import percentile
from labd.verify import light_drill
from labd.wiring import dark_ingress, metered_paths

BATCHES = (1, 2, 4, 8)


@dataclass
class SwitchRun:
    switch: str
    driver: str
    ack_ms: list[float] = field(default_factory=list)
    device_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)


def _pairs(switch: OpticalSwitch, k: int, rng: random.Random) -> list[tuple[int, int]]:
    info = switch.info
    assert info is not None
    if info.egress:
        ins = rng.sample(range(1, info.ingress + 1), k)
        outs = rng.sample(range(info.ingress + 1, info.ports + 1), k)
        return list(zip(ins, outs, strict=True))
    ports = rng.sample(range(1, info.ports + 1), 2 * k)
    return [(ports[2 * i], ports[2 * i + 1]) for i in range(k)]


async def _exercise(switch: OpticalSwitch, emulated: EmulatedLab, rounds: int,
                    rng: random.Random, progress: Progress, task: TaskID) -> SwitchRun:
    run = SwitchRun(switch.name, type(switch).driver)
    sent: list[tuple[int, int]] = []
    await switch.replace({})
    for i in range(rounds):
        pairs = _pairs(switch, BATCHES[i % len(BATCHES)], rng)
        for op in ("connect", "disconnect"):
            start = time.monotonic_ns()
            if op == "connect":
                await switch.connect(pairs)
            else:
                await switch.disconnect([a for a, _ in pairs])
            sent.append((start, time.monotonic_ns()))
            progress.advance(task)
    changes = emulated.truth(switch.name, light=False)["changes"]
    for start, end in sent:
        # The physical changes this operation caused: those that arrived while it ran (a
        # mesh makes one per driver-board command; retiring a mesh circuit makes none).
        mine = [c for c in changes if start <= c["arrived_ns"] <= end]
        if not mine:
            continue
        device = (max(c["settled_ns"] for c in mine) - min(c["arrived_ns"] for c in mine)) / 1e6
        run.ack_ms.append((end - start) / 1e6)
        run.device_ms.append(device)
        run.overhead_ms.append((end - start) / 1e6 - device)
    return run


async def run_demo(lab: Lab, *, rounds: int, console: Console, serve: bool,
                   seed: int | None = None, light_events: int = 20) -> int:
    emulated, entries = emulated_lab(lab)
    rng = random.Random(seed)
    async with emulated:
        console.print(f"[bold]labd demo[/]: lab [cyan]{lab.lab.name}[/] in emulation, "
                      f"control endpoint {emulated.control_url}")
        drivers = [make_driver(e, endpoint_of(emulated, e), source=lab.source)
                   for e in entries]
        switches = [d for d in drivers if isinstance(d, OpticalSwitch)]
        meters = {d.name: d for d in drivers if isinstance(d, PowerMeter)}
        found = Table(box=None, show_header=False, pad_edge=False)
        try:
            for driver in drivers:
                await driver.open()
                info: SwitchInfo | MeterInfo | None = getattr(driver, "info", None)
                assert info is not None
                size = info.size if isinstance(info, SwitchInfo) else f"{info.channels} ch"
                found.add_row(driver.name, type(driver).driver, f"{info.vendor} {info.model}",
                              size, str(driver.connection.link.address))
            console.print(found)
            with Progress(console=console, transient=True) as progress:
                tasks = [progress.add_task(f"reconfiguring {sw.name}", total=2 * rounds)
                         for sw in switches]
                runs = await asyncio.gather(*(
                    _exercise(sw, emulated, rounds, random.Random(rng.random()), progress, task)
                    for sw, task in zip(switches, tasks, strict=True)))
            console.print(_report(runs))
            if light_events and meters:
                await _light(lab, switches, meters, emulated, light_events, console)
            await _fault_drill(switches[0], emulated, console)
            if serve:
                console.print("\nServing the demo lab; endpoints:")
                for e in entries:
                    console.print(f"  {e.id}: {endpoint_of(emulated, e)}")
                console.print(f"  control: {emulated.control_url}")
                console.print("Press Ctrl-C to stop.")
                await asyncio.Event().wait()
        finally:
            for driver in drivers:
                await driver.close()
    return 0


async def _light(lab: Lab, switches: list[OpticalSwitch], meters: dict[str, PowerMeter],
                 emulated: EmulatedLab, events: int, console: Console) -> None:
    """Verify light on one metered path per switch; compare with the optical model."""
    table = Table(title=f"Light verification: detected - true threshold crossing "
                        f"({lab.lab.light_threshold_dbm:g} dBm), µs")
    for column in ("switch", "path", "meter", "how", "events", "p50", "p99", "max |err|"):
        table.add_column(column, justify="right" if column in ("events", "p50", "p99",
                                                               "max |err|") else "left")
    with Progress(console=console, transient=True) as progress:
        for switch in switches:
            paths = [p for p in metered_paths(lab, switch.name) if p.meter in meters]
            if not paths or switch.info is None:
                continue
            path, meter = paths[0], meters[paths[0].meter]
            mesh = type(switch).driver == "qontrol-mesh"
            # A mesh settles in tens of µs: log finer and over a shorter window.
            resolution = 1e-5 if mesh else 1e-4
            task = progress.add_task(f"light on {switch.name}", total=events)

            def tick(task: TaskID = task) -> None:
                progress.advance(task)

            errors = await light_drill(
                switch, meter, path, emulated, events,
                threshold_dbm=lab.lab.light_threshold_dbm,
                window_s=0.02 if mesh else 0.15, resolution_s=resolution,
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
    table = Table(title="Reconfiguration latency, ms (ack: labd saw the device complete; "
                        "device: emulator's true settling; labd: the difference)")
    for column in ("switch", "n", "ack p50", "ack p99", "device p50", "device p99",
                   "labd p50", "labd p99"):
        table.add_column(column, justify="left" if column == "switch" else "right")
    for run in runs:
        table.add_row(run.switch, str(len(run.ack_ms)),
                      *(f"{percentile(v, q):.2f}" for v in (run.ack_ms, run.device_ms,
                                                            run.overhead_ms) for q in (50, 99)))
    return table


async def _fault_drill(switch: OpticalSwitch, emulated: EmulatedLab, console: Console) -> None:
    """Cut the link while a connect is on the wire; show the reconnect and the drift."""
    console.print(f"\n[bold]Fault drill[/] on {switch.name}: the link is cut mid-command "
                  "(the switch carries the command out, the reply never comes)")
    events = EventQueue(switch)
    emulated.inject(switch.name, {"kind": "drop", "apply": True})
    pair = _pairs(switch, 1, random.Random(7))
    start = time.monotonic_ns()
    try:
        await switch.connect(pair)
        console.print("  the command unexpectedly succeeded")
    except InstrumentError as exc:
        console.print(f"  command failed as expected: {exc}")
    try:
        resync = await events.next("resync", timeout=10)
    finally:
        events.close()
    took = (resync.at_ns - start) / 1e6
    console.print(f"  reconnected and resynchronised in {took:.1f} ms; drift: {resync.detail}"
                  + (f" (unexpected {resync.drift.unexpected})" if resync.drift else ""))
