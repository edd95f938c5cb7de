"""``labd demo``: the packaged demo lab in emulation, driven through labd's drivers.

Each switch gets a series of reconfigurations (batches of 1, 2, 4 and 8 pairs, made and
broken); every one is timed and set beside the emulator's ground truth, so the report shows
what the device took and what labd added. A fault drill then cuts a link mid-command and
shows the driver reconnect, resynchronise and report the drift.
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
from instruments.switch import OpticalSwitch
from labd.drivers import make_switch
from labd.emulate import emulated_lab, endpoint_of
from labd.labfile import Lab
from labd.stats import percentile

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
    changes = emulated.truth(switch.name)["changes"]
    for (start, end), change in zip(sent, changes[-len(sent):], strict=True):
        device = (change["settled_ns"] - change["arrived_ns"]) / 1e6
        run.ack_ms.append((end - start) / 1e6)
        run.device_ms.append(device)
        run.overhead_ms.append((end - start) / 1e6 - device)
    return run


async def run_demo(lab: Lab, *, rounds: int, console: Console, serve: bool,
                   seed: int | None = None) -> int:
    emulated, entries = emulated_lab(lab)
    rng = random.Random(seed)
    async with emulated:
        console.print(f"[bold]labd demo[/]: lab [cyan]{lab.lab.name}[/] in emulation, "
                      f"control endpoint {emulated.control_url}")
        switches = [make_switch(e, endpoint_of(emulated, e), source=lab.source)
                    for e in entries]
        found = Table(box=None, show_header=False, pad_edge=False)
        for sw in switches:
            await sw.open()
            assert sw.info is not None
            found.add_row(sw.name, type(sw).driver, f"{sw.info.vendor} {sw.info.model}",
                          sw.info.size, str(sw.connection.link.address))
        console.print(found)
        try:
            with Progress(console=console, transient=True) as progress:
                tasks = [progress.add_task(f"reconfiguring {sw.name}", total=2 * rounds)
                         for sw in switches]
                runs = await asyncio.gather(*(
                    _exercise(sw, emulated, rounds, random.Random(rng.random()), progress, task)
                    for sw, task in zip(switches, tasks, strict=True)))
            console.print(_report(runs))
            await _fault_drill(switches[0], emulated, console)
            if serve:
                console.print("\nServing the demo lab; endpoints:")
                for e in entries:
                    console.print(f"  {e.id}: {endpoint_of(emulated, e)}")
                console.print("Press Ctrl-C to stop.")
                await asyncio.Event().wait()
        finally:
            for sw in switches:
                await sw.close()
    return 0


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
