#!/usr/bin/env python3
"""Capture a power trace around a switch event, as a lab engineer would.

On the demo lab in emulation: light from h0 goes through ocs1 port 1 to egress 17 (tapped to
pm1:1); the Keysight logging function records pm1:1 and pm1:2 at ``--atime`` while ocs1 moves
the light to egress 18 (tapped to pm1:2). Prints the trace (ms since the command left, dBm)
and the emulator's true threshold crossings for comparison.

Usage: python scripts/trace_transient.py [--atime-us 100] [--points 400] [--every 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from instruments.keysight import KeysightN77xx
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.fabric.drivers import make_meter, make_switch
from labd.lab.loader import load_lab
from labd.runtime import run


async def main(atime_us: float, points: int, every: int) -> None:
    lab = load_lab("demo")
    emulated, entries = emulated_lab(lab)
    by_id = {e.id: e for e in entries}
    async with emulated:
        emulated.set_timing("ocs1", {"jitter_ms": 0})
        switch = make_switch(by_id["ocs1"], endpoint_of(emulated, by_id["ocs1"]))
        meter = make_meter(by_id["pm1"], endpoint_of(emulated, by_id["pm1"]))
        async with switch, meter:
            assert isinstance(meter, KeysightN77xx)
            await switch.replace({1: 17})
            seen = emulated.light()
            last = seen[-1]["seq"] if seen else 0
            started = await meter.start_logging([1, 2], points, atime_us * 1e-6)
            await asyncio.sleep(0.002)  # a little light on the old path first
            sent = time.monotonic_ns()
            await switch.replace({1: 18})
            await meter.wait_logging(1)
            old, new = await meter.fetch_log(1), await meter.fetch_log(2)
        truth = [c for c in emulated.light(last) if c["node"] in ("pm1:1", "pm1:2")]
    print(f"ocs1 moves h0's light from egress 17 (pm1:1) to 18 (pm1:2); log of {points} x "
          f"{atime_us:g} µs; time in ms since the command left")
    print(f"{'t (ms)':>8}  {'pm1:1 dBm':>10}  {'pm1:2 dBm':>10}")
    for i in range(0, points, every):
        t = (started + (i + 0.5) * atime_us * 1e3 - sent) / 1e6
        print(f"{t:8.2f}  {old[i]:10.2f}  {new[i]:10.2f}")
    print("true crossings of the light threshold "
          f"({lab.lab.light_threshold_dbm:g} dBm), ms since the command left:")
    for c in truth:
        print(f"  {c['node']}: {c['direction']} at {(c['at_ns'] - sent) / 1e6:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atime-us", type=float, default=100.0)
    parser.add_argument("--points", type=int, default=400)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    run(main(args.atime_us, args.points, args.every))
