#!/usr/bin/env python3
"""Benchmark: light verification against the optical model's ground truth.

On the packaged demo lab in emulation, moves light onto and off a metered path of the
Polatis OCS (ocs1 → pm1:1, beam steering, 25 ms) and of the MZI mesh (mesh1 → pm1:6,
thermo-optic, tens of µs) ``--events`` times each, and prints the difference between when
labd detected the crossing of the lab's light threshold (Keysight logging function) and
when it truly happened (p50/p99/max). Targets: p99 within 1 ms for the OCS, within 200 µs
for the mesh.

Usage: python scripts/bench_light.py [--events 100] [--json FILE]

``--json FILE`` also writes the figures as one flat JSON object (scripts/bench_all.py reads it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from labd.client.control import Backdoor
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.emulation.verify import light_drill
from labd.fabric.drivers import make_meter, make_switch
from labd.lab.loader import load_lab
from labd.lab.wiring import dark_ingress, metered_paths
from labd.runtime import run
from labd.vocabulary import percentile

CASES = (  # switch, meter channel on its path, logging resolution, window, target µs
    ("ocs1", "pm1", 1e-4, 0.15, 1000.0),
    ("mesh1", "pm1", 1e-5, 0.02, 200.0),
)


async def main(events: int) -> dict[str, float]:
    """Prints the report; returns its figures by name (for --json)."""
    lab = load_lab("demo")
    emulated, entries = emulated_lab(lab)
    by_id = {e.id: e for e in entries}
    figures: dict[str, float] = {"events": events}
    async with emulated:
        # The drill reads the optical model's ground truth through the control endpoint.
        backdoor = Backdoor(emulated.control_url)
        meter = make_meter(by_id["pm1"], endpoint_of(emulated, by_id["pm1"]))
        await meter.open()
        print(f"Light verification vs ground truth ({events} events per switch, half arrivals "
              f"and half departures, threshold {lab.lab.light_threshold_dbm:g} dBm), µs:")
        print(f"  {'switch':<8}{'path':<14}{'resolution':>12}{'p50':>9}{'p99 |e|':>9}"
              f"{'max |e|':>9}{'target':>9}")
        for switch_id, meter_id, resolution, window, target in CASES:
            switch = make_switch(by_id[switch_id], endpoint_of(emulated, by_id[switch_id]))
            await switch.open()
            assert switch.info is not None
            path = next(p for p in metered_paths(lab, switch_id) if p.meter == meter_id)
            mesh = by_id[switch_id].driver == "qontrol-mesh"
            errors = await light_drill(
                switch, meter, path, backdoor, events,
                threshold_dbm=lab.lab.light_threshold_dbm, window_s=window,
                resolution_s=resolution,
                dark_ingress=dark_ingress(lab, switch_id, switch.info.ingress) if mesh else None)
            await switch.close()
            p99 = percentile([abs(e) for e in errors], 99)
            verdict = "ok" if p99 <= target else "MISSED"
            where = f"{path.ingress}->{path.egress} {meter_id}:{path.channel}"
            print(f"  {switch_id:<8}{where:<14}"
                  f"{resolution * 1e6:>10g}µs{percentile(errors, 50):>9.1f}"
                  f"{p99:>9.1f}{max(abs(e) for e in errors):>9.1f}"
                  f"{target:>8g} {verdict} ({len(errors)} crossings)")
            figures |= {f"{switch_id}_p50_us": percentile(errors, 50),
                        f"{switch_id}_p99_abs_us": p99,
                        f"{switch_id}_max_abs_us": max(abs(e) for e in errors),
                        f"{switch_id}_crossings": len(errors)}
        await meter.close()
        await backdoor.close()
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    args = parser.parse_args()
    figures = run(main(args.events))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
