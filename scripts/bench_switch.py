#!/usr/bin/env python3
"""Benchmark: what labd's switch driver adds on top of the device.

Runs a zero-latency Polatis emulator in its own process (``labd emulate``) and measures,
interleaved in one run:

1. the round-trip time of a one-pair connect through the labd driver (``PolatisScpi``) and
   through a minimal blocking raw-socket client sending the very same bytes; p50/p99 of
   each and their ratio (target: ratio ≤ 1.3 at p50). Beside them, the floor of any client
   on an event loop: a bare one on the driver's own loop, the same socket options and
   kernel stamps, one future per reply and nothing else. What it takes above the raw
   client is the loop's (a wake-up through epoll and a read, where the blocking client
   sleeps in its read); what the driver takes above it is labd's;
2. a full 384-pair map replacement on a 384x384 emulator: labd's own time, i.e. the wall
   time of ``replace()`` minus the time on the wire and in the device: from the command's
   first byte leaving to the kernel's stamp of the reply's arrival (the ``Exchange`` that
   ``replace()`` returns), which holds the emulator's parsing and its switch model's time
   (target: < 2 ms at p50). The device's settle time by its ground truth is printed beside it.

Usage: python scripts/bench_switch.py [--rounds 10] [--per-round 200] [--replacements 30]
                                     [--json FILE]

``--json FILE`` also writes the figures as one flat JSON object (scripts/bench_all.py reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

from instruments.link import LinkSettings
from instruments.polatis_scpi import PolatisScpi
from instruments.transports import wirestamp
from labd.runtime import run
from labd.vocabulary import percentile

LAB = """
[lab]
name = "bench"

[[instrument]]
id = "small"
driver = "polatis-scpi"
emulate = true
size = "16x16"
[instrument.emulator]
technology = "ideal"

[[instrument]]
id = "big"
driver = "polatis-scpi"
emulate = true
size = "384x384"
[instrument.emulator]
technology = "ideal"
"""

CONNECT = b":OXC:SWIT:CONN:ADD (@1),(@17);*OPC?;:SYST:ERR?\n"
DISCONNECT = b":OXC:SWIT:CONN:SUB (@1),(@);*OPC?;:SYST:ERR?\n"


async def start_emulators(lab_file: Path) -> tuple[asyncio.subprocess.Process, dict[str, str],
                                                   str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "emulate", str(lab_file),
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    endpoints: dict[str, str] = {}
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise SystemExit("labd emulate exited before it was ready")
        data = json.loads(line)
        if data.get("ready"):
            return proc, endpoints, data["control"]
        endpoints[data["id"]] = data["endpoint"]


def raw_round(address: str, count: int) -> list[float]:
    """The minimal client: blocking socket, same bytes, read to the second answer."""
    host, port = address.removeprefix("tcp://").split(":")
    samples = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            start = time.perf_counter_ns()
            sock.sendall(CONNECT)
            reply = b""
            while not reply.endswith(b"\n"):
                reply += sock.recv(4096)
            samples.append((time.perf_counter_ns() - start) / 1e3)
            assert reply.startswith(b"1;0,"), reply
            sock.sendall(DISCONNECT)
            reply = b""
            while not reply.endswith(b"\n"):
                reply += sock.recv(4096)
    return samples


async def floor_round(address: str, count: int) -> list[float]:
    """The bare event-loop client: the same bytes, socket options and kernel stamps as the
    driver's transport, each reply read when the loop says the socket is readable and
    handed to the waiting coroutine through one future; no timeout, no parsing, no layers.
    """
    host, port = address.removeprefix("tcp://").split(":")
    loop = asyncio.get_running_loop()
    sock = socket.create_connection((host, int(port)))
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    wirestamp.enable(sock)
    into = memoryview(bytearray(4096))
    reply = bytearray()
    waiting: list[asyncio.Future[bytes]] = []

    def readable() -> None:
        try:
            count, _, _, _ = sock.recvmsg_into([into], wirestamp.ANCILLARY_SIZE)
        except BlockingIOError:
            return
        if not count:  # the emulator went away: fail the exchange, not spin on EOF
            loop.remove_reader(sock.fileno())
            if waiting:
                waiting.pop().set_exception(ConnectionError(f"{address} closed"))
            return
        reply.extend(into[:count])
        if reply.endswith(b"\n") and waiting:
            waiting.pop().set_result(bytes(reply))
            reply.clear()

    async def exchange(message: bytes) -> bytes:
        future: asyncio.Future[bytes] = loop.create_future()
        waiting.append(future)
        if sock.send(message) != len(message):  # a command's few bytes fit the buffer
            raise ConnectionError(f"{address} took part of a command")
        return await future

    loop.add_reader(sock.fileno(), readable)
    samples = []
    try:
        for _ in range(count):
            start = time.perf_counter_ns()
            answer = await exchange(CONNECT)
            samples.append((time.perf_counter_ns() - start) / 1e3)
            assert answer.startswith(b"1;0,"), answer
            await exchange(DISCONNECT)
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
    return samples


async def driver_round(switch: PolatisScpi, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        await switch.connect([(1, 17)])
        samples.append((time.perf_counter_ns() - start) / 1e3)
        await switch.disconnect([1])
    return samples


async def replacements(switch: PolatisScpi, control: str, count: int
                       ) -> list[tuple[float, float, float, float]]:
    """(wall time, labd's own, the wire and the device's, the device's settle) in ms."""
    rng = random.Random(1)
    results = []
    async with httpx.AsyncClient(base_url=control) as http:
        for _ in range(count):
            egress = list(range(385, 769))
            rng.shuffle(egress)
            target = dict(zip(range(1, 385), egress, strict=True))
            since = (await http.get("/v1/emulators/big/truth")).json()["changes"]
            last = since[-1]["seq"] if since else 0
            start = time.monotonic_ns()
            stamps = await switch.replace(target)
            total = time.monotonic_ns() - start
            sent, answered = stamps.sent_ns, stamps.answered_ns
            assert sent is not None and answered is not None
            (change,) = (await http.get("/v1/emulators/big/truth",
                                        params={"since": last})).json()["changes"]
            settle = change["settled_ns"] - change["arrived_ns"]
            wire = answered - sent
            results.append((total / 1e6, (total - wire) / 1e6, wire / 1e6, settle / 1e6))
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--replacements", type=int, default=30)
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lab_file = Path(tmp) / "bench.toml"
        lab_file.write_text(LAB)
        proc, endpoints, control = await start_emulators(lab_file)
        try:
            settings = LinkSettings(timeout=5.0)
            small = PolatisScpi(endpoints["small"], name="small", settings=settings)
            big = PolatisScpi(endpoints["big"], name="big", settings=settings)
            await small.open()
            await big.open()
            raw: list[float] = []
            floor: list[float] = []
            labd: list[float] = []
            # Warm the three paths, then interleave rounds so drift hits them alike.
            await driver_round(small, 50)
            await floor_round(endpoints["small"], 50)
            await asyncio.to_thread(raw_round, endpoints["small"], 50)
            for _ in range(args.rounds):
                labd += await driver_round(small, args.per_round)
                raw += raw_round(endpoints["small"], args.per_round)
                floor += await floor_round(endpoints["small"], args.per_round)
            full = await replacements(big, control, args.replacements)
            await small.close()
            await big.close()
        finally:
            proc.terminate()
            await proc.wait()

    print(f"One-pair connect round trip against a zero-latency Polatis SCPI emulator "
          f"({len(labd)} samples each, interleaved), microseconds:")
    print(f"  {'client':<28}{'p50':>10}{'p99':>10}")
    for name, values in (("raw socket (same bytes)", raw), ("bare event-loop client", floor),
                         ("labd PolatisScpi driver", labd)):
        print(f"  {name:<28}{percentile(values, 50):>10.1f}{percentile(values, 99):>10.1f}")
    for name, over, under in (("ratio labd / raw", labd, raw),
                              ("ratio bare loop / raw", floor, raw),
                              ("ratio labd / bare loop", labd, floor)):
        print(f"  {name:<28}{percentile(over, 50) / percentile(under, 50):>10.2f}"
              f"{percentile(over, 99) / percentile(under, 99):>10.2f}"
              + ("   (target ≤ 1.30 at p50)" if over is labd and under is raw else ""))
    print(f"\nFull 384-pair map replacement on a 384x384 emulator ({len(full)} runs), ms:")
    print(f"  {'':<28}{'p50':>10}{'p99':>10}{'max':>10}")
    for i, name in enumerate(("wall time of replace()", "labd own (wall - wire)",
                              "wire and device", "device settle (truth)")):
        values = [row[i] for row in full]
        print(f"  {name:<28}{percentile(values, 50):>10.2f}{percentile(values, 99):>10.2f}"
              f"{max(values):>10.2f}" + ("   (target < 2 ms at p50)" if i == 1 else ""))
    print(f"\n(cpu count {os.cpu_count()}, python {sys.version.split()[0]})")
    if args.json is not None:
        args.json.write_text(json.dumps(figures(raw, floor, labd, full), indent=1) + "\n")


def figures(raw: list[float], floor: list[float], labd: list[float],
            full: list[tuple[float, float, float, float]]) -> dict[str, float]:
    """The printed figures by name, for --json: µs for the round trips, ms for replace()."""
    wall, own, wire, settle = ([row[i] for row in full] for i in range(4))
    return {
        "raw_p50_us": percentile(raw, 50), "raw_p99_us": percentile(raw, 99),
        "driver_p50_us": percentile(labd, 50), "driver_p99_us": percentile(labd, 99),
        "ratio_p50": percentile(labd, 50) / percentile(raw, 50),
        "ratio_p99": percentile(labd, 99) / percentile(raw, 99),
        "floor_p50_us": percentile(floor, 50), "floor_p99_us": percentile(floor, 99),
        "floor_ratio_p50": percentile(floor, 50) / percentile(raw, 50),
        "driver_floor_ratio_p50": percentile(labd, 50) / percentile(floor, 50),
        "replace_wall_p50_ms": percentile(wall, 50), "replace_wall_p99_ms": percentile(wall, 99),
        "replace_own_p50_ms": percentile(own, 50), "replace_own_p99_ms": percentile(own, 99),
        "replace_wire_p50_ms": percentile(wire, 50),
        "replace_settle_p50_ms": percentile(settle, 50),
        "samples": len(labd), "replacements": len(full),
    }


if __name__ == "__main__":
    run(main())
