#!/usr/bin/env python3
"""Benchmark: mesh routing quality and speed.

For ``--perm8`` random permutations on an 8x8 Beneš MZI mesh and ``--perm16`` on a 16x16,
the driver routes each (looping algorithm), turns it into heater voltages over the Qontrol
protocol on a pty, and the emulator computes the chip's transfer from those voltages
(imperfect couplers, so crosstalk exists). Prints, per mesh, how many permutations delivered
every input to its output, the distribution of crosstalk at the outputs (power from all
other inputs relative to the wanted one) and the time per full reconfiguration.
Target: worst-case crosstalk below -20 dB. Beside the time per reconfiguration: the bytes it
put on the serial line both ways, what they take on a real line at the configured line rate
(``--baud``, the board's 115200 by default; the bits a byte from the address's framing, 8N1:
10; a pty costs no wire time), the driver's settle wait, and the rest above the wire and the
settling: labd's own time and the emulator's, which here shares labd's process (the
emulator's chip model, timed apart, is shown beside it). Target: that rest at most 1 ms at
p50 on the 8x8 mesh.

Usage: python scripts/bench_mesh.py [--perm8 200] [--perm16 50] [--baud 115200] [--json FILE]

``--json FILE`` also writes the figures as one flat JSON object (scripts/bench_all.py reads it).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from emulators.lab import EmulatedLab, EmulatorSpec, ServeSpec
from instruments.address import Address
from instruments.mesh import MeshSwitch
from labd.runtime import run
from labd.vocabulary import percentile

#: The Qontrol board's line rate (docs/protocols.md §5.1).
BAUD = 115_200


def bits_per_byte(address: Address) -> float:
    """Start bit, data bits, parity bit and stop bits of one byte on the serial line the
    address configures (pyserial's defaults where it says nothing)."""
    options = address.options
    parity = 0 if options.get("parity", "N").upper() == "N" else 1
    return 1 + int(options.get("bytesize", "8")) + parity + float(options.get("stopbits", "1"))


def timed(calls: list[float], func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, adding each call's time (ms) to the last entry of ``calls``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            calls[-1] += (time.perf_counter() - start) * 1e3
    return wrapper


async def bench(ports: int, count: int, seed: int, baud: int = BAUD) -> dict[str, float]:
    """Prints the mesh's figures; returns them by name (prefixed ``mesh8_``, ``mesh16_``)."""
    rng = random.Random(seed)
    spec = EmulatorSpec("mesh", "mesh", {"ports": ports}, {},
                        serve={"serial": ServeSpec(serve="pty")})
    async with EmulatedLab([spec], control=False) as lab:
        chip = lab.device("mesh").mesh  # type: ignore[attr-defined]
        chip_ms: list[float] = [0.0]
        chip.apply_voltages = timed(chip_ms, chip.apply_voltages)
        async with MeshSwitch(lab.endpoints["mesh"]["serial"] + f"?baud={baud}", name="mesh",
                              size=f"{ports}x{ports}") as mesh:
            crosstalk: list[float] = []
            worst_per_perm: list[float] = []
            delivered = 0
            took: list[float] = []
            wire_bytes: list[int] = []
            link = mesh.connection.link
            byte_ms = bits_per_byte(link.address) / baud * 1e3
            chip_ms.clear()
            for _ in range(count):
                outputs = list(range(ports + 1, 2 * ports + 1))
                rng.shuffle(outputs)
                target = dict(zip(range(1, ports + 1), outputs, strict=True))
                before = link.bytes_out + link.bytes_in
                chip_ms.append(0.0)
                start = time.perf_counter()
                await mesh.replace(target)
                took.append((time.perf_counter() - start) * 1e3)
                wire_bytes.append(link.bytes_out + link.bytes_in - before)
                transfer = chip.transfer_now()
                ok = True
                worst = -np.inf
                for i in range(ports):
                    j = target[i + 1] - ports - 1
                    ok &= int(np.argmax(transfer[i])) == j
                    leak = transfer[:, j].sum() - transfer[i, j]
                    xt = 10 * np.log10(leak / transfer[i, j])
                    crosstalk.append(xt)
                    worst = max(worst, xt)
                delivered += ok
                worst_per_perm.append(worst)
    q = percentile
    print(f"{ports}x{ports} mesh ({chip.elements} MZIs), {count} random permutations: "
          f"{delivered}/{count} delivered every input to its output")
    print(f"  crosstalk per output, dB:      p50 {q(crosstalk, 50):6.1f}  "
          f"p90 {q(crosstalk, 90):6.1f}  p99 {q(crosstalk, 99):6.1f}  "
          f"worst {max(crosstalk):6.1f}   (target < -20)")
    print(f"  worst output per permutation:  p50 {q(worst_per_perm, 50):6.1f}  "
          f"p90 {q(worst_per_perm, 90):6.1f}  max {max(worst_per_perm):6.1f}")
    print(f"  full reconfiguration (route + voltages over the serial protocol + settle), ms: "
          f"p50 {q(took, 50):.2f}  p99 {q(took, 99):.2f}")
    settle_ms = mesh.settle_s * 1e3
    # A pty carries the bytes at once: no wire time is spent here, the rest is all software.
    own = [t - settle_ms for t in took]
    print(f"  on the line: p50 {q(wire_bytes, 50):.0f} bytes both ways, "
          f"{q(wire_bytes, 50) * byte_ms:.2f} ms at {baud} baud (none on this pty); settle "
          f"{settle_ms:.3f} ms; the rest (labd and the emulator, one process): p50 "
          f"{q(own, 50):.2f} ms, p99 {q(own, 99):.2f} ms"
          f"{' (target p50 <= 1 ms)' if ports == 8 else ''}, of which the emulated chip p50 "
          f"{q(chip_ms, 50):.2f} ms")
    return {f"mesh{ports}_{name}": value for name, value in {
        "p50_ms": q(took, 50), "p99_ms": q(took, 99), "bytes_p50": q(wire_bytes, 50),
        "wire_ms": q(wire_bytes, 50) * byte_ms, "settle_ms": settle_ms,
        "rest_p50_ms": q(own, 50), "rest_p99_ms": q(own, 99),
        "chip_p50_ms": q(chip_ms, 50),
        "crosstalk_p99_db": q(crosstalk, 99), "crosstalk_worst_db": max(crosstalk),
        "delivered": delivered, "permutations": count,
    }.items()}


async def main(perm8: int, perm16: int, baud: int = BAUD) -> dict[str, float]:
    figures: dict[str, float] = {}
    for ports, count in ((8, perm8), (16, perm16)):
        if count > 0:
            figures |= await bench(ports, count, ports, baud)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--perm8", type=int, default=200)
    parser.add_argument("--perm16", type=int, default=50)
    parser.add_argument("--baud", type=int, default=BAUD,
                        help="the line rate configured in the address (default: the board's)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    args = parser.parse_args()
    figures = run(main(args.perm8, args.perm16, args.baud))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
