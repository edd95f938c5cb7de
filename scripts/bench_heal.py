#!/usr/bin/env python3
"""Benchmark: an idle switch power-cycled, and what the liveness watch costs a command.

1. **Power cycle → circuits back.** A daemon on a Polatis SCPI emulator (in a ``labd
   emulate`` process of its own, as hardware would be) holding 8 circuits, the lab file's
   default watch (``watch_interval_s``, 2 s) and ``on_drift = "restore"``. Nobody sends a
   command. Each cycle powers the switch off through the control endpoint, waits until
   the daemon has marked it offline (the emulator closes the link as its power goes, so
   this is immediate; a device that only goes silent is found by the watch within the
   interval plus the timeout), powers it on, and waits for the ``restore``
   reconfiguration; the circuits are then checked on the device's own ground truth.
   Printed: off → marked offline, on → circuits back, and off → back, p50/p99.
2. **The watch's cost to a command.** One-pair connects through the driver with the watch
   off, at the default interval (2 s) and at an aggressive 5 ms, the three interleaved in
   one run, each command after a random idle gap of 0-10 ms (so that at 5 ms probes land
   between, and sometimes in the way of, the commands). p50/p99 of each.

Usage: python scripts/bench_heal.py [--cycles 20] [--commands 400] [--json FILE]

``--json FILE`` also writes the figures as one flat JSON object (scripts/bench_all.py reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from instruments.link import LinkSettings
from instruments.polatis_scpi import PolatisScpi
from labd.client.control import spawn_emulators
from labd.emulation.rig import emulated_rig
from labd.events import Subscription
from labd.lab.loader import load_lab
from labd.runtime import run
from labd.vocabulary import percentile

LAB = """
[lab]
name = "bench-heal"

[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
emulate = true
size = "16x16"
[instrument.emulator]
technology = "ideal"
"""

CIRCUITS = {p: 16 + p for p in range(1, 9)}
SETTINGS = LinkSettings(timeout=2.0)
#: The watch settings of the command-cost runs by their names in --json's figures.
KEYS = {"watch off": "watch_off", "watch 2 s": "watch_2s", "watch 5 ms": "watch_5ms"}


async def next_kind(sub: Subscription, kind: str, timeout: float = 30) -> dict[str, object]:
    async with asyncio.timeout(timeout):
        while True:
            event = await sub.next()
            if event is not None and event.kind == kind:
                return event.data


async def power_cycles(lab_file: Path, db: str, cycles: int) -> tuple[list[float], list[float],
                                                                      float]:
    off_to_down: list[float] = []
    on_to_back: list[float] = []
    async with emulated_rig(load_lab(lab_file), db=db, apart=True, hosts=False) as rig:
        daemon = rig.daemon
        interval = daemon.drivers["ocs1"].connection.watch_interval_s
        await daemon.engine.reconfigure("ocs1", connect=list(CIRCUITS.items()),
                                        verify_light=False)
        for i in range(cycles):
            _, sub = daemon.hub.subscribe()
            off = time.monotonic()
            await rig.backdoor.power("ocs1", on=False)
            while (await next_kind(sub, "instrument.state"))["state"] != "backoff":
                pass
            down = time.monotonic()
            await rig.backdoor.power("ocs1", on=True)
            on = time.monotonic()
            while True:
                data = await next_kind(sub, "reconfiguration")
                if data["cause"] == "restore":
                    break
            back = time.monotonic()
            sub.close()
            held = (await rig.backdoor.describe("ocs1"))["state"]["connections"]
            held = {int(a): int(b) for a, b in (held.items() if isinstance(held, dict)
                                                  else held)}
            if held != CIRCUITS:
                raise SystemExit(f"cycle {i + 1}: the switch holds {held}, not {CIRCUITS}")
            off_to_down.append((down - off) * 1e3)
            on_to_back.append((back - on) * 1e3)
    return off_to_down, on_to_back, interval


async def command_costs(address: str, commands: int) -> tuple[dict[str, list[float]],
                                                              dict[str, int]]:
    """Each watch setting's connect times (µs), and the probes each sent."""
    rng = random.Random(1)
    switches = {"watch off": PolatisScpi(address, name="off", settings=SETTINGS),
                "watch 2 s": PolatisScpi(address, name="2s", settings=SETTINGS,
                                         watch_interval_s=2.0),
                "watch 5 ms": PolatisScpi(address, name="5ms", settings=SETTINGS,
                                          watch_interval_s=0.005)}
    samples: dict[str, list[float]] = {name: [] for name in switches}
    for switch in switches.values():
        await switch.open()
    try:
        for _ in range(commands):
            for name, switch in switches.items():
                await asyncio.sleep(rng.uniform(0, 0.010))  # an idle gap, on purpose
                start = time.perf_counter_ns()
                await switch.connect([(9, 25)])
                samples[name].append((time.perf_counter_ns() - start) / 1e3)
                await switch.disconnect([9])
        probes = {name: s.connection.probes for name, s in switches.items()}
    finally:
        for switch in switches.values():
            await switch.close()
    print(f"  probes sent: {probes}")
    return samples, probes


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--commands", type=int, default=400)
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    args = parser.parse_args()
    figures: dict[str, float] = {"cycles": args.cycles, "commands": args.commands}
    with tempfile.TemporaryDirectory() as tmp:
        lab_file = Path(tmp) / "bench-heal.toml"
        lab_file.write_text(LAB)
        print(f"Idle power cycles of a 16x16 Polatis SCPI emulator holding {len(CIRCUITS)} "
              f"circuits ({args.cycles} cycles):")
        downs, backs, interval = await power_cycles(lab_file, str(Path(tmp) / "s.sqlite"),
                                                    args.cycles)
        print(f"  watch interval {interval:g} s, on_drift restore; ms:")
        print(f"  {'':<34}{'p50':>10}{'p99':>10}{'max':>10}")
        rows = (("off → marked offline", downs), ("on → circuits back (restore)", backs),
                ("off → circuits back", [d + b for d, b in zip(downs, backs, strict=True)]))
        for name, values in rows:
            print(f"  {name:<34}{percentile(values, 50):>10.1f}{percentile(values, 99):>10.1f}"
                  f"{max(values):>10.1f}")
        figures["watch_interval_s"] = interval
        for key, (_, values) in zip(("off_to_offline", "on_to_back", "off_to_back"), rows,
                                    strict=True):
            figures |= {f"{key}_p50_ms": percentile(values, 50),
                        f"{key}_p99_ms": percentile(values, 99)}
        emulators = await spawn_emulators(lab_file)
        try:
            print(f"\nOne-pair connect through the driver after a 0-10 ms idle gap "
                  f"({args.commands} each, interleaved), microseconds:")
            costs, probes = await command_costs(emulators.endpoints["ocs1"], args.commands)
        finally:
            await emulators.stop()
        print(f"  {'':<34}{'p50':>10}{'p99':>10}")
        for name, values in costs.items():
            print(f"  {name:<34}{percentile(values, 50):>10.1f}{percentile(values, 99):>10.1f}")
            key = KEYS[name]
            figures |= {f"connect_{key}_p50_us": percentile(values, 50),
                        f"connect_{key}_p99_us": percentile(values, 99),
                        f"probes_{key}": probes[name]}
    print(f"\n(cpu count {os.cpu_count()}, python {sys.version.split()[0]})")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    run(main())
