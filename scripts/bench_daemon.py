#!/usr/bin/env python3
"""Benchmark: what the daemon adds, how fast the store writes, how much it reconfigures.

Emulators run in their own process (``labd emulate``, 8 zero-latency Polatis switches), the
daemon in this one. Prints, in one run:

1. the added latency of the API path over a direct driver call: a one-pair connect through
   ``POST /v1/switches/{id}/connections`` (engine, reservations, durable record, event)
   against the same connect through a driver of its own, interleaved (target: p50 ≤ 0.5 ms);
2. the store, on SQLite and on every database given with ``--db``, side by side: sustained
   throughput (reconfiguration records committed per second by the writer, with the event
   loop's lag measured meanwhile; targets: SQLite ≥ 40,000 rows/s, PostgreSQL ≥ 20,000,
   lag p99 < 2 ms) and one durable record awaited alone (a recovery's: two circuits made,
   two broken, the intended state updated), its p50 and p99;
3. reconfiguration throughput on the 8 switches at once through the engine, and how the
   recorded phases agree with the emulators' ground truth;
4. the same with the daemon's event loop held on one CPU, as ``labd run --cpu auto`` holds
   it (Linux; labd/daemon/placement.py).

Usage: python scripts/bench_daemon.py [--samples 300] [--rows 100000] [--seconds 5]
                                     [--durable 500] [--db URL ...] [--json FILE]
                                     [--without shortcut|follow ...]

``--db postgresql://user@host/db`` (repeatable, or a comma-separated list) measures the store
on that server too: in a scratch database made beside the one named (the role needs
CREATEDB) and dropped afterwards, so nothing of the run stays behind. The URL's query passes
through to the connection (``?options=-csynchronous_commit%3Doff`` measures what durability
costs). ``--json FILE`` also writes the figures as one flat JSON object (scripts/bench_all.py
reads it): SQLite's under the keys it always had, another store's prefixed with its engine
(``postgresql_store_rows_per_s``; a second PostgreSQL ``postgresql2_``...).

``--without ROOM`` runs the daemon with one of labd's rooms beside a library taken out, the
library's own path in its place, to set the two side by side (docs/benchmarks.md, "Rooms
around a library"): ``shortcut``, every reconfiguration routed by FastAPI alone
(labd/daemon/api/shortcut.py); ``follow``, the store's writer left where the kernel puts it
(labd/store/affinity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from instruments.polatis_scpi import PolatisScpi
from labd.client.control import Backdoor
from labd.daemon.core import Daemon
from labd.daemon.placement import Placement, PlacementError
from labd.emulation.rig import emulated_rig
from labd.lab.loader import load_lab
from labd.runtime import run
from labd.store.writer import ReconfigurationRecord, Store, normalise_url
from labd.vocabulary import percentile

SWITCHES = 8
#: The most records waiting on the store's writer at once in the store benchmark.
WINDOW = 500
TOKEN = "bench"


def lab_text() -> str:
    entries = "".join(f"""
[[instrument]]
id = "s{i}"
driver = "polatis-scpi"
emulate = true
size = "16x16"
[instrument.emulator]
technology = "ideal"
""" for i in range(1, SWITCHES + 1))
    return f'[lab]\nname = "bench-daemon"\n{entries}'


#: The rooms --without can take out.
ROOMS = ("shortcut", "follow")


def without(rooms: list[str]) -> None:
    """Take ``rooms`` out of this process's daemon and stores, before any is made."""
    if "shortcut" in rooms:
        from labd.daemon.api import switches

        switches.SHORTCUTS.clear()  # create_app hands the middleware none: FastAPI routes all
    if "follow" in rooms:
        from labd.store import writer

        class Stays:
            """The writer's follower that never moves it (nor makes it a batch thread)."""

            def before(self, records: int, loop_cpu: int) -> None:
                pass

        # ... nor does the loop note its CPU for each record.
        writer.__dict__.update(Follower=Stays, current_cpu=None)


async def lag_probe(samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(0.001)
        samples.append((time.monotonic() - start - 0.001) * 1e3)


#: The API client runs in its own process, as a script of the lab's would (a client in the
#: daemon's own event loop would be measured twice), and is a minimal keep-alive HTTP/1.1
#: client on a raw socket, like the raw SCPI client of bench_switch: what it measures is the
#: daemon's path, not an HTTP library's.
CLIENT = """
import json, socket, sys, time
from urllib.parse import urlsplit
url, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
parts = urlsplit(url)
sock = socket.create_connection((parts.hostname, parts.port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
stream = sock.makefile("rb")

def request(method, path, body):
    data = json.dumps(body).encode()
    sock.sendall((f"{method} {path} HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {token}"
                  f"\\r\\nContent-Type: application/json\\r\\nContent-Length: {len(data)}"
                  "\\r\\n\\r\\n").encode() + data)
    status = stream.readline()
    length = 0
    while (line := stream.readline()) not in (b"\\r\\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    payload = stream.read(length)
    assert b" 200 " in status, (status, payload)

for _ in range(count):
    sys.stdin.readline()  # one request per go, interleaved with the direct calls
    start = time.perf_counter_ns()
    request("POST", "/v1/switches/s1/connections", {"pairs": [[1, 17]], "verify_light": False})
    took = (time.perf_counter_ns() - start) / 1e3
    request("POST", "/v1/switches/s1/disconnect", {"ports": [1], "verify_light": False})
    print(json.dumps(took), flush=True)
"""


async def api_vs_direct(daemon: Daemon, endpoint: str, samples: int) -> tuple[list[float],
                                                                              list[float]]:
    direct = PolatisScpi(endpoint, name="direct")
    await direct.open()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, daemon.url, TOKEN, str(samples),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None
    api_us: list[float] = []
    direct_us: list[float] = []
    for _ in range(samples):
        client.stdin.write(b"go\n")
        await client.stdin.drain()
        api_us.append(float(await client.stdout.readline()))
        start = time.perf_counter_ns()
        await direct.connect([(2, 18)])
        direct_us.append((time.perf_counter_ns() - start) / 1e3)
        await direct.disconnect([2])
    await client.wait()
    await direct.close()
    return api_us, direct_us


@dataclass(frozen=True)
class Target:
    """A store to measure: SQLite in the run's scratch folder, or a server by URL."""

    url: str
    label: str
    #: The prefix of its figures' JSON keys ("" for SQLite, whose keys bench_all reads).
    key: str


def targets(urls: list[str]) -> list[Target]:
    """SQLite first, always (the figure the others are set beside), then each PostgreSQL
    given; each server is asked to answer now, before the minute of the rest of the run."""
    out = [Target("", "SQLite (WAL)", "")]
    for number, given in enumerate(urls, start=1):
        url = normalise_url(given)
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise SystemExit(f"bench_daemon: --db {given!r} is not a database URL: "
                             f"{exc}") from None
        if parsed.get_backend_name() != "postgresql":
            raise SystemExit(f"bench_daemon: --db takes a PostgreSQL URL, not {given!r}: "
                             f"SQLite is measured in every run, in a scratch file")
        shown = parsed.render_as_string(hide_password=True)
        engine = create_engine(parsed, connect_args={"connect_timeout": 10})
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            raise SystemExit(f"bench_daemon: PostgreSQL at {shown} does not answer: "
                             f"{exc.__class__.__name__}: {exc.args[0] if exc.args else exc}"
                             ) from None
        finally:
            engine.dispose()
        query = "".join(f" {k}={v}" for k, v in sorted(parsed.query.items()))
        out.append(Target(url, f"PostgreSQL {parsed.host or 'local'}:{parsed.port or 5432}"
                               f"{query}", "postgresql_" if number == 1
                          else f"postgresql{number}_"))
    return out


@contextlib.contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """A fresh database beside the one ``url`` names, dropped afterwards: the run's records
    never land in a database that is in use."""
    parsed = make_url(url)
    name = f"labd_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(parsed, isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 10})
    shown = parsed.render_as_string(hide_password=True)
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        admin.dispose()
        raise SystemExit(f"bench_daemon: cannot make a scratch database on {shown} "
                         f"(the role needs CREATEDB): {exc.__class__.__name__}: "
                         f"{exc.args[0] if exc.args else exc}") from None
    try:
        yield parsed.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.asynccontextmanager
async def opened(target: Target) -> AsyncIterator[Store]:
    with contextlib.ExitStack() as scratch:
        url = scratch.enter_context(scratch_database(target.url)) if target.url else \
            str(Path(scratch.enter_context(tempfile.TemporaryDirectory())) / "bench.sqlite")
        store = Store(url)
        await store.open()
        try:
            yield store
        finally:
            await store.close()


async def store_throughput(target: Target, rows: int) -> tuple[float, list[float]]:
    async with opened(target) as store:
        lags: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(lag_probe(lags, stop))
        now = time.monotonic_ns()
        start = time.perf_counter()
        # A steady producer, as the engine is: each record handed over and awaited by its own
        # task, at most WINDOW waiting on the writer at once (the oldest awaited before the
        # next is handed over); the producer yields to the loop every few records.
        pending: deque[asyncio.Task[int]] = deque()
        for i in range(rows):
            pending.append(asyncio.ensure_future(store.record(ReconfigurationRecord(
                switch=f"s{i % 8}", cause="measurement", outcome="ok", error=None,
                connected=[(i % 16 + 1, 17 + i % 16)], disconnected=[], requested_ns=now,
                dispatched_ns=now, activated_ns=now, acked_ns=now, light_ns=None,
                done_ns=now))))
            if i % 50 == 49:
                await asyncio.sleep(0)
            if len(pending) >= WINDOW:
                await pending.popleft()
        await asyncio.gather(*pending)
        elapsed = time.perf_counter() - start
        stop.set()
        await probe
    return rows / elapsed, lags


async def durable_record(target: Target, count: int) -> list[float]:
    """µs from handing one record to the store to its commit, nothing else queued: what a
    recovery waits for before it may go on (the record of its reconfiguration)."""
    async with opened(target) as store:
        took: list[float] = []
        for i in range(count):
            a = 1 + 2 * (i % 8)
            now = time.monotonic_ns()
            record = ReconfigurationRecord(
                switch="s1", cause="recovery", outcome="ok", error=None,
                connected=[(a, 17 + a), (a + 1, 18 + a)],
                disconnected=[(a, 33 + a), (a + 1, 34 + a)], requested_ns=now,
                dispatched_ns=now, activated_ns=now, acked_ns=now, light_ns=now, done_ns=now,
                update_intended=True)
            start = time.perf_counter_ns()
            await store.record(record)
            took.append((time.perf_counter_ns() - start) / 1e3)
    return took


def children_cpu_s() -> float | None:
    """CPU seconds this process's children (the emulators' ``labd emulate``) have used so
    far, from /proc; None where there is none (not Linux)."""
    me = os.getpid()
    total = 0.0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if int(fields[1]) == me:  # its parent: utime and stime, in clock ticks
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@dataclass
class Cpu:
    """CPU seconds over a run: the event loop's thread (the engine, drivers, API), the
    process's other threads (the store's writer), the emulators' process."""

    loop_s: float
    threads_s: float
    emulators_s: float | None

    @classmethod
    def now(cls) -> Cpu:
        loop = time.thread_time()
        return cls(loop, time.process_time() - loop, children_cpu_s())

    def since(self, start: Cpu) -> Cpu:
        emulators = None if self.emulators_s is None or start.emulators_s is None else \
            self.emulators_s - start.emulators_s
        return Cpu(self.loop_s - start.loop_s, self.threads_s - start.threads_s, emulators)


async def fleet(daemon: Daemon, backdoor: Backdoor, seconds: float) -> tuple[int, float,
                                                                             list[float],
                                                                             list[float], Cpu]:
    deadline = time.monotonic() + seconds
    # Each record's window, as a tuple of a string and two integers: the collector leaves
    # such a tuple alone, where a kept Result (its lists and dicts) was tens of thousands of
    # objects more in every full pass of the daemon's own collector, the benchmark's doing.
    results: list[tuple[str, int | None, int | None]] = []

    async def drive(name: str) -> None:
        i = 0
        while time.monotonic() < deadline:
            target = {1 + i % 16: 17 + (i * 5) % 16}
            i += 1
            if target == daemon.engine.intended[name]:
                # What the switch holds already (a second run may start where the first
                # left off): the device changes nothing and its truth has no change to set
                # the record beside, so every record here is of a real change.
                continue
            phases = (await daemon.engine.reconfigure(name, replace=target,
                                                      cause="measurement",
                                                      verify_light=False)).phases
            results.append((name, phases["dispatched"], phases["acknowledged"]))

    start, cpu = time.perf_counter(), Cpu.now()
    await asyncio.gather(*(drive(f"s{i}") for i in range(1, SWITCHES + 1)))
    elapsed, cpu = time.perf_counter() - start, Cpu.now().since(cpu)
    after_settle: list[float] = []
    inside: list[float] = []
    for name in (f"s{i}" for i in range(1, SWITCHES + 1)):
        # By arrival: each record's own changes found by bisection (thousands of records
        # per switch, each against every change, took longer than the run itself).
        truth = sorted((await backdoor.truth(name))["changes"], key=lambda c: c["arrived_ns"])
        arrivals = [c["arrived_ns"] for c in truth]
        for switch, dispatched, acknowledged in results:
            if switch != name or dispatched is None or acknowledged is None:
                continue
            last = bisect.bisect_right(arrivals, acknowledged)
            if last > bisect.bisect_left(arrivals, dispatched):
                after_settle.append((acknowledged - truth[last - 1]["settled_ns"]) / 1e6)
                inside.append(1.0)
    return len(results), elapsed, after_settle, inside, cpu


def one_cpu() -> Placement | None:
    """The daemon's loop (this thread) held on its CPU, the writer following it there;
    None where that cannot be done (not Linux), and the run says so."""
    try:
        return Placement.pin("auto")
    except PlacementError as exc:
        print(f"(the 8 switches on one CPU not measured: {exc})")
        return None


async def main(samples: int, rows: int, seconds: float, durable: int = 500,
               urls: list[str] | None = None) -> dict[str, float]:
    """Prints the report; returns its figures by name (for --json)."""
    stores = targets(urls or [])
    with tempfile.TemporaryDirectory() as scratch:
        lab_file = Path(scratch) / "bench.toml"
        lab_file.write_text(lab_text())
        lab = load_lab(lab_file)
        async with emulated_rig(lab, db=str(Path(scratch) / "daemon.sqlite"), token=TOKEN,
                                apart=True) as rig:
            api_us, direct_us = await api_vs_direct(rig.daemon, rig.addresses["s1"], samples)
            count, elapsed, after_settle, inside, cpu = await fleet(rig.daemon, rig.backdoor,
                                                                    seconds)
            # The same again with the loop held on one CPU, as ``labd run --cpu auto`` holds
            # it (labd/daemon/placement.py); the writer follows it there as it always does.
            placed = one_cpu()
            try:
                placed_fleet = await fleet(rig.daemon, rig.backdoor, seconds) \
                    if placed is not None else None
            finally:
                if placed is not None:
                    placed.release()
    measured = {t: await store_throughput(t, rows) for t in stores}
    records = {t: await durable_record(t, durable) for t in stores}

    print(f"1. One-pair connect, API path vs a direct driver call ({samples} each, "
          f"interleaved, zero-latency emulator), µs:")
    print(f"   {'':<34}{'p50':>10}{'p99':>10}")
    print(f"   {'direct driver call':<34}{percentile(direct_us, 50):>10.0f}"
          f"{percentile(direct_us, 99):>10.0f}")
    print(f"   {'POST /v1/switches/s1/connections':<34}{percentile(api_us, 50):>10.0f}"
          f"{percentile(api_us, 99):>10.0f}")
    added50 = (percentile(api_us, 50) - percentile(direct_us, 50)) / 1e3
    added99 = (percentile(api_us, 99) - percentile(direct_us, 99)) / 1e3
    print(f"   added by the API path: p50 {added50:.2f} ms, p99 {added99:.2f} ms "
          f"(target p50 ≤ 0.5 ms; includes the durable record and the event)")
    width = max(len(t.label) for t in stores) + 2
    print(f"2. Store: {rows} reconfiguration records committed, with the event loop's lag "
          f"meanwhile; one durable record (a recovery's) awaited alone, {durable} times:")
    print(f"   {'':<{width}}{'rows/s':>10}{'lag p50':>10}{'lag p99':>10}"
          f"{'durable p50':>13}{'durable p99':>13}")
    for t in stores:
        rate, lags = measured[t]
        print(f"   {t.label:<{width}}{rate:>10,.0f}{percentile(lags, 50):>7.2f} ms"
              f"{percentile(lags, 99):>7.2f} ms{percentile(records[t], 50):>10.0f} µs"
              f"{percentile(records[t], 99):>10.0f} µs")
    print("   (targets: SQLite ≥ 40,000 rows/s, PostgreSQL ≥ 20,000 rows/s, lag p99 < 2 ms)")
    print(f"3. {SWITCHES} switches at once through the engine for {elapsed:.1f} s: {count} "
          f"reconfigurations, {count / elapsed:,.0f}/s")
    print(f"   acknowledged after the emulator's settle time: p50 "
          f"{percentile(after_settle, 50):.3f} ms, p99 {percentile(after_settle, 99):.3f} ms; "
          f"the true change lay between dispatched and acknowledged in "
          f"{len(inside)}/{count} records")
    per = {"loop": cpu.loop_s / count * 1e6, "threads": cpu.threads_s / count * 1e6,
           "emulators": None if cpu.emulators_s is None else cpu.emulators_s / count * 1e6}
    spent = sum(v for v in per.values() if v is not None)
    cores = os.cpu_count() or 1
    print(f"   CPU per reconfiguration: the daemon's event loop {per['loop']:.0f} µs, its other "
          f"threads (the store's writer) {per['threads']:.0f} µs, the emulators "
          + ("not measured" if per["emulators"] is None else f"{per['emulators']:.0f} µs")
          + f": {spent:.0f} µs in all, which {cores} cores hold at most "
          f"{cores * 1e6 / spent:,.0f} times a second (the loop alone: "
          f"{1e6 / per['loop']:,.0f}/s)")
    placed_figures: dict[str, float] = {}
    if placed_fleet is not None:
        p_count, p_elapsed, p_after, p_inside, p_cpu = placed_fleet
        print(f"4. The same, the daemon's loop held on one CPU (labd run --cpu auto): "
              f"{p_count} reconfigurations, {p_count / p_elapsed:,.0f}/s; the true "
              f"change lay between dispatched and acknowledged in {len(p_inside)}/{p_count} "
              f"records; CPU per reconfiguration: loop {p_cpu.loop_s / p_count * 1e6:.0f} µs, "
              f"writer {p_cpu.threads_s / p_count * 1e6:.0f} µs")
        placed_figures = {"fleet_one_cpu_per_s": p_count / p_elapsed,
                          "fleet_one_cpu_truth_inside": len(p_inside),
                          "fleet_one_cpu_truth_total": p_count,
                          "fleet_one_cpu_after_settle_p50_ms": percentile(p_after, 50)}
    q = percentile
    figures: dict[str, float] = {}
    for t in stores:
        rate, lags = measured[t]
        figures |= {f"{t.key}store_rows_per_s": rate, f"{t.key}lag_p50_ms": q(lags, 50),
                    f"{t.key}lag_p99_ms": q(lags, 99),
                    f"{t.key}durable_p50_us": q(records[t], 50),
                    f"{t.key}durable_p99_us": q(records[t], 99)}
    return figures | {
        "direct_p50_us": q(direct_us, 50), "direct_p99_us": q(direct_us, 99),
        "api_p50_us": q(api_us, 50), "api_p99_us": q(api_us, 99),
        "api_added_p50_ms": added50, "api_added_p99_ms": added99,
        "fleet_per_s": count / elapsed, "fleet_seconds": elapsed,
        "fleet_loop_cpu_us": per["loop"], "fleet_threads_cpu_us": per["threads"],
        **({} if per["emulators"] is None else {"fleet_emulators_cpu_us": per["emulators"]}),
        "fleet_cpu_bound_per_s": cores * 1e6 / spent,
        "after_settle_p50_ms": q(after_settle, 50),
        "after_settle_p99_ms": q(after_settle, 99),
        "truth_inside": len(inside), "truth_total": count,
        "samples": samples, "store_rows": rows, "durable_records": durable,
    } | placed_figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--durable", type=int, default=500, metavar="N",
                        help="durable records awaited one at a time, per store (default 500)")
    parser.add_argument("--db", action="append", default=[], metavar="URL",
                        help="also measure the store on this database (repeatable, or "
                             "comma-separated), e.g. postgresql://postgres@127.0.0.1/postgres")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    parser.add_argument("--without", action="append", default=[], choices=ROOMS,
                        help="take this room out, the library's path in its place "
                             "(repeatable)")
    args = parser.parse_args()
    without(args.without)
    urls = [url.strip() for given in args.db for url in given.split(",") if url.strip()]
    figures = run(main(args.samples, args.rows, args.seconds, args.durable, urls))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
