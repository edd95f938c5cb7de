#!/usr/bin/env python3
"""Soak: N minutes of random circuit changes, random faults of every kind, and random bad
input on every interface of the daemon, on the packaged demo lab (every instrument family)
and, beside it, the packaged failover lab (emulated GPU hosts, a running job with spares);
with the broker restarted and the leader changed now and then. At the end the faults are
cleared and every check below must hold.

How it runs (the real paths, as a lab runs them): each lab's instruments and GPU hosts
(their agents, reporting over MQTT with signed messages) are emulated in a ``labd emulate``
process of their own, as hardware would be; the daemons are ``labd run`` processes on it
(one per lab; under --ha two, a leader and a standby, on PostgreSQL), each logging JSON to a
file of its own; the broker is a private Mosquitto on a free loopback port unless --mqtt
names one. The soak itself is only a client: the API (of whichever daemon leads, found from
``/v1/health``), every daemon's event stream, the bus, and the emulators' control endpoint.

The quick steps, chosen at random:

- a change through the API: connect free ports, disconnect a connected one, or replace a
  switch's whole map (refusals — busy ports, an offline switch — are fine; a 5xx is not);
- a device fault through the emulators' control endpoint, of every kind the device's family
  has: connections dropped (also mid-command, and all at once), stalls, garbage replies,
  delayed replies, failed and restored ports, meter heads gone, saturated or stuck, mesh
  heaters dead and revived;
- a failover drill (one at a time): a member's GPU fails (Xid 79) or its host dies; the
  daemon recovers the job with a spare; the drill repairs the host and returns the spare;
- bad HTTP, bad WebSocket frames, bad MQTT (unsigned and mis-signed commands, host reports
  in nobody's name, payloads too large, too deep or slow to scan).

Incidents, one at a time, a random gap (--gap, 5-15 s) apart, the kinds taking turns (their
choices drawn from a generator of their own: a seed gives the same incidents in order):

- broker restart (only where the soak owns the broker: without --mqtt): Mosquitto stopped
  with SIGTERM or SIGKILL, at random, and started again on its port after an outage of 1,
  5 or 20 s (equally likely: a 10-minute soak gets a handful of each); then every daemon
  must be back on it and every host heard again;
- leader change (only under --db postgresql://…, which runs each lab with --ha): the
  leader gets SIGKILL, SIGTERM, or SIGSTOP for longer than the lease's TTL then SIGCONT; the
  standby must lead; then a new standby is started.

The checks (exit status 1 if any fails), in the summary: no false host loss (a ``host.lost``
event, or a failover with trigger ``host-lost``, for a host no drill killed; each set beside
the incident it came in), no traceback and no ERROR line in any daemon's log (nor in the
emulate processes', where the agents run), every job running, every host online and
healthy, every instrument online and intended = observed on every switch, every incident
recovered, every drill ended (recovered, or no spare; but one a leader change cut off), no
5xx but 503. It prints each daemon's RSS and open fds at its start and at the
end (and every minute), and the faults by kind. Drift left by a fault mid-change is put
back by the daemon (``on_drift = "restore"``) or, where still drifted at the end after a
failed change, by the soak's whole-map PUT, as an operator would; a drift with no failed
change behind it is reported as silent.

Its parts, beside it in scripts/ (imported as the script's neighbours): soak_lab.py (the
processes, their logs, the private databases), soak_steps.py (the quick steps and what the
daemons report), soak_faults.py (the drills and the incidents).

Usage: python scripts/soak.py [--minutes 10] [--seed 1] [--mqtt URL] [--db URL]
           [--outages 1,5,20] [--gap 5,15] [--incidents broker,leader] [--logs DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from soak_faults import Faults
from soak_lab import Process, Site, scaled, scan_log, usage
from soak_steps import METER_DRIVERS, SWITCH_DRIVERS, Soak

from labd.lab.loader import load_lab
from labd.mqtt.private import Mosquitto
from labd.runtime import run
from labd.store.private import private_database

#: No markup: what the daemons say ("[code:4] ...") is printed as said.
console = Console(width=120, markup=False, highlight=False)
#: The daemons' admin key: random, since every log line has it redacted wherever it appears.
TOKEN = secrets.token_hex(16)
JOB = "ring4"


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mqtt", help="a broker to use, mqtt://HOST:PORT (default: a "
                                       "private Mosquitto on a free port, which the broker "
                                       "restarts need)")
    parser.add_argument("--db", help="the daemons' store: postgresql://… (a private database "
                                     "per lab is made on that server and dropped after; "
                                     "each lab then runs a leader and a standby with --ha), "
                                     "or a folder for SQLite files (default: the logs folder)")
    parser.add_argument("--outages", default="1,5,20",
                        help="broker outages to choose from, seconds [1,5,20]")
    parser.add_argument("--gap", default="5,15", help="seconds between incidents, "
                                                      "least,most [5,15]")
    parser.add_argument("--incidents", default="broker,leader",
                        help="which incidents: broker, leader, both, or none")
    parser.add_argument("--logs", type=Path, help="where the processes' logs go (default: "
                                                  "a new folder under the temporary one)")
    return parser.parse_args(argv)


def sample(sites: list[Site]) -> str:
    """Every live daemon's RSS (MiB) and fds now."""
    seen = [(p.name, usage(p.pid)) for s in sites for p in s.daemons if p.alive]
    return ", ".join(f"{name} {u[0]:.0f}/{u[1]}" for name, u in seen if u is not None)


async def start_job(hosts: Site, faults: Faults) -> str:
    """Every host heard, then the failover lab's job started; what happened."""
    if await faults.until_hosts_ready(120) is None:
        return "hosts not online within 120 s: job not started"
    r = await hosts.call("POST", f"/v1/jobs/{JOB}/start", json={}, timeout=120)
    return "started" if r is not None and r.status_code == 200 else \
        f"not started: {r and r.status_code} {r and r.text[:200]}"


async def jobs_running(hosts: Site, within_s: float) -> dict[str, str]:
    """Each job's status once all run, or as they are at the deadline (polling)."""
    end = time.monotonic() + scaled(within_s)
    states: dict[str, str] = {}
    while time.monotonic() < end:
        found = await hosts.get_json("/v1/jobs")
        states = {j["id"]: j["status"] for j in found or []}
        if states and all(s == "running" for s in states.values()):
            break
        await asyncio.sleep(0.5)  # polling an outcome with a deadline
    return states


async def soak(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    logs: Path = args.logs
    if args.db and args.db.startswith("postgresql+psycopg://"):  # SQLAlchemy's spelling
        args.db = "postgresql://" + args.db.removeprefix("postgresql+psycopg://")
    postgres = bool(args.db and args.db.startswith("postgresql://"))
    wanted = {k for k in args.incidents.split(",") if k in ("broker", "leader")}
    notes: list[str] = []
    demo_lab, hosts_lab = load_lab("demo"), load_lab("failover")
    async with contextlib.AsyncExitStack() as stack:
        broker: Mosquitto | None = None
        if args.mqtt is None:
            broker = Mosquitto(logs / "broker", name="soak-broker")
            await broker.start()
            stack.push_async_callback(asyncio.to_thread, broker.close)
            mqtt = broker.url
        else:
            mqtt = args.mqtt
            if "broker" in wanted:
                notes.append("broker restarts skipped: the broker is --mqtt's, not the "
                             "soak's to restart")
        if postgres:
            dbs = [stack.enter_context(private_database(args.db, "labd_soak"))
                   for _ in range(2)]
        else:
            folder = Path(args.db or logs)
            dbs = [str(folder / f"{name}.sqlite") for name in ("demo", "failover")]
            if "leader" in wanted:
                notes.append("leader changes skipped: they need two daemons with --ha, "
                             "which needs --db postgresql://…")
        # The demo lab's hosts are played by nobody (it is the instruments' lab); keyed all
        # the same, so that the daemon does not warn of hosts it could not hear.
        demo = Site("demo", [h.id for h in demo_lab.host], logs, mqtt, TOKEN, db=dbs[0],
                    ha=postgres)
        hosts = Site("failover", [h.id for h in hosts_lab.host], logs, mqtt, TOKEN,
                     db=dbs[1], ha=postgres)
        for site in (demo, hosts):
            stack.push_async_callback(site.close)
            await site.start()
        soak = Soak(demo, hosts, rng, mqtt=mqtt,
                    switches=[e.id for e in demo_lab.instrument if e.driver in SWITCH_DRIVERS],
                    meters=[e.id for e in demo_lab.instrument if e.driver in METER_DRIVERS],
                    mesh=[e.id for e in demo_lab.instrument if e.driver == "qontrol-mesh"])
        stack.push_async_callback(soak.close)
        faults = Faults(soak, hosts_lab, rng,
                        broker if "broker" in wanted else None,
                        [float(x) for x in args.outages.split(",")],
                        [demo, hosts] if postgres and "leader" in wanted else [], JOB)
        faults.say = console.print
        stack.push_async_callback(faults.close)
        await soak.sizes_known()
        job = await start_job(hosts, faults)
        store = "PostgreSQL, --ha: a leader and a standby per lab" if postgres else "SQLite"
        console.print(f"soak: labs demo and failover, {args.minutes:g} min, seed "
                      f"{args.seed}, MQTT {mqtt}{' (private)' if broker else ''}, store {store}"
                      f"; job {JOB} {job}; incidents: {', '.join(faults.kinds()) or 'none'}; "
                      f"logs {logs}")
        if postgres:
            notes.append("databases (dropped at the end): "
                         + ", ".join(d.rsplit("/", 1)[1] for d in dbs))
        for note in notes:
            console.print(f"  {note}")
        console.print(f"start, RSS MiB/fds: {sample([demo, hosts])}")
        stop = asyncio.Event()
        gap = tuple(float(x) for x in args.gap.split(","))
        incidents = asyncio.create_task(faults.run(stop, (gap[0], gap[-1])))
        actions: list[tuple[Any, int]] = [
            (soak.change, 60), (soak.fault, 10), (soak.bad_http, 15),
            (soak.bad_websocket, 2), (soak.bad_mqtt, 13), (faults.drill, 1)]
        started = time.monotonic()
        end, minute = started + args.minutes * 60, started + 60
        samples: list[str] = []
        while time.monotonic() < end:
            if time.monotonic() >= minute:
                samples.append(sample([demo, hosts]))
                minute += 60
                console.print(f"  {len(samples)} min: {sum(soak.steps.values())} steps, "
                              f"{len(faults.incidents)} incidents")
            if incidents.done():
                break  # an incident broke: the summary says how
            action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
            result = action()
            if asyncio.iscoroutine(result):
                await result
        stop.set()
        console.print("ending: the incident under way, then the last drill; then the faults "
                      "healed, the switches settled, the jobs and the logs read")
        with contextlib.suppress(Exception):
            await incidents  # the one under way ends first: its own deadlines bound it
        broke = incidents.exception() if incidents.done() and not incidents.cancelled() \
            else None
        hosts_ok = await faults.drills_over(scaled(180))
        await soak.heal()
        extra = [(hosts, faults.backdoor, "ocs1")] if faults.backdoor is not None else []
        verdict = await soak.settle(extra, 90)
        drifted = {w: soak.differences.get(w, "") for w, ok in verdict.items() if not ok}
        restored = await soak.restore(verdict)
        if restored:
            verdict = await soak.settle(extra, 60)
        jobs = await jobs_running(hosts, 60)
        losses = soak.losses + await faults.failover_losses()
        not_recovered = await faults.not_recovered()
        false = [loss for loss in losses if not faults.caused(loss)]
        final = {p.name: usage(p.pid) for s in (demo, hosts) for p in s.daemons if p.alive}
        roles = {p.name: await s.role(p) for s in (demo, hosts) for p in s.daemons if p.alive}
        # Standbys first: a leader stopped first would hand its lab to them at the end.
        for site in (demo, hosts):
            site.daemons.sort(key=lambda p: roles.get(p.name) == "leader")
            await site.close()
        if broker is None:
            await clear_bus(mqtt, [demo, hosts])
    console.print(f"each minute, per daemon RSS MiB/fds: {' | '.join(samples) or '-'}")
    summary = Summary(soak, faults, [demo, hosts], final, roles)
    summary.not_recovered = not_recovered
    checks = summary.print(broke, hosts_ok, verdict, drifted, restored, jobs, false)
    console.print(f"logs: {logs}")
    ok = all(checks.values())
    console.print("soak passed" if ok else "soak FAILED", style="green" if ok else "bold red")
    return 0 if ok else 1


async def clear_bus(mqtt: str, sites: list[Site]) -> None:
    """The retained topics the run left on a broker that outlives it (--mqtt)."""
    from labd.emulation.rig import clear_retained
    from labd.mqtt.credentials import BusSettings

    for site in sites:
        await clear_retained(BusSettings(mqtt, site.instance), site.lab, site.hosts)


class Summary:
    def __init__(self, soak: Soak, faults: Faults, sites: list[Site],
                 final: dict[str, tuple[float, int] | None], roles: dict[str, str | None]
                 ) -> None:
        self.soak, self.faults, self.sites, self.final, self.roles = \
            soak, faults, sites, final, roles
        self.not_recovered: list[str] = []

    def processes(self) -> tuple[int, int, int, int]:
        """Each process's line; the daemons' tracebacks and ERROR lines, then the emulate
        processes'."""
        totals = [0, 0, 0, 0]
        for site in self.sites:
            procs: list[Process] = [*site.daemons,
                                    *([site.emulator] if site.emulator is not None else [])]
            for proc in procs:
                scan = scan_log(proc.log)
                daemon = proc in site.daemons
                totals[0 if daemon else 2] += scan.tracebacks
                totals[1 if daemon else 3] += scan.errors
                line = f"  {proc.name} (pid {proc.pid}): "
                if daemon:
                    start, end = proc.started, self.final.get(proc.name)
                    line += (f"RSS {_mib(start)} -> {_mib(end)} MiB, fds {_fds(start)} -> "
                             f"{_fds(end)}; " + (f"{self.roles.get(proc.name)} at the end"
                                                 if proc.name in self.roles else proc.ended)
                             + "; ")
                line += f"tracebacks {scan.tracebacks}, ERROR lines {scan.errors}"
                console.print(line)
                for excerpt in scan.excerpts[:4]:
                    console.print(f"      {excerpt}")
        return totals[0], totals[1], totals[2], totals[3]

    def print(self, broke: BaseException | None, hosts_ok: bool, verdict: dict[str, bool],
              drifted: dict[str, str], restored: list[str], jobs: dict[str, str],
              false: list[Any]) -> dict[str, bool]:
        soak, faults = self.soak, self.faults
        console.print("steps: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.steps.items())))
        console.print(f"faults by kind ({sum(soak.faults.values())}): " + ", ".join(
            f"{k} {v}" for k, v in sorted(soak.faults.items())))
        console.print("HTTP statuses: " + ", ".join(f"{k}: {v}" for k, v
                                                     in sorted(soak.statuses.items())))
        console.print(f"MQTT warnings (refused messages, rate-limited): {soak.mqtt_warnings}")
        console.print(f"5xx other than 503: {len(soak.server_errors)}")
        for line in soak.server_errors[:10]:
            console.print(f"  {line}")
        console.print(f"failed changes: {sum(soak.failed.values())} ({dict(soak.failed)}); "
                      f"drift events: {soak.drift_events}; restored by the daemons: "
                      f"{sum(soak.healed.values())}")
        for reason, count in soak.reasons.most_common(5):
            console.print(f"  {count} x {reason}")
        for reason, count in soak.unavailable.most_common(5):
            console.print(f"  503 or restore: {count} x {reason}")
        for where, difference in drifted.items():
            how = "restored through the API" if where in restored else "SILENT: no failed change"
            console.print(f"  after healing, {where} differed ({how}): {difference[:300]}")
        console.print("drills: " + (", ".join(f"{n} {what}" for what, n
                                              in faults.drills.most_common()) or "none"))
        for line in faults.odd_drills[:10]:
            console.print(f"  {line}")
        console.print(f"failovers not recovered (any cause): {len(self.not_recovered)}")
        for line in self.not_recovered[:10]:
            console.print(f"  {line}")
        console.print(f"incidents ({len(faults.incidents)}; times UTC, as in the logs):")
        for incident in faults.incidents:
            console.print(f"  {incident}")
        if broke is not None:
            console.print(f"  the incidents stopped: {type(broke).__name__}: {broke}")
        if soak.leadings:
            console.print("takeovers (ha.leading): " + ", ".join(soak.leadings))
        during = collections.Counter(
            f"{faults.during(loss)}: {loss.what.split()[0]}" for loss in false)
        console.print(f"false host losses: {len(false)}" + (" (by the incident they came in: "
                      + ", ".join(f"{k} {n}" for k, n in sorted(during.items())) + ")"
                      if false else ""))
        for loss in false[:8]:
            at = time.strftime("%H:%M:%S", time.localtime(loss.at))
            console.print(f"  {loss.site}/{loss.host} at {at}: {loss.what} (during: "
                          f"{faults.during(loss)})")
        console.print("processes (RSS and fds at their start and at the end):")
        tracebacks, errors, emu_tracebacks, emu_errors = self.processes()
        console.print(f"daemons' logs: {tracebacks} tracebacks, {errors} ERROR lines; "
                      f"emulate processes' (agents, emulators): {emu_tracebacks} "
                      f"tracebacks, {emu_errors} ERROR lines")
        console.print("jobs at the end: " + (", ".join(f"{j} {s}" for j, s in jobs.items())
                                             or "none answered"))
        console.print(f"hosts online and healthy at the end: {'yes' if hosts_ok else 'NO'}")
        console.print("intended = observed: " + ", ".join(
            f"{w} {'yes' if ok else 'NO'}" for w, ok in verdict.items()))
        for where, ok in verdict.items():
            if not ok:
                console.print(f"  {where}: {soak.differences.get(where, '')[:600]}")
        if "offline" in soak.differences:
            console.print(f"  still offline: {soak.differences['offline']}")
        recovered = broke is None and not any(
            "NOT" in i.outcome or "did not" in i.outcome for i in faults.incidents)
        checks = {
            "0 false host losses": not false,
            "0 tracebacks and 0 ERROR lines in the daemons' logs": not (tracebacks or errors),
            "0 tracebacks and 0 ERROR lines in the emulate processes' logs":
                not (emu_tracebacks or emu_errors),
            "every job running": bool(jobs) and all(s == "running" for s in jobs.values()),
            "every host online and healthy": hosts_ok,
            "intended = observed on every switch": bool(verdict) and all(verdict.values())
                and len(verdict) == len(soak.switches) + 1,
            "every incident recovered": recovered,
            # A leader change that cut a recovery off is the drill's bad luck, not a fault.
            "every drill ended": not [d for d in faults.odd_drills
                                      if "during the recovery" not in d],
            "no 5xx but 503": not soak.server_errors,
        }
        console.print("checks: " + "; ".join(f"{name}: {'pass' if ok else 'FAIL'}"
                                             for name, ok in checks.items()))
        return checks


def _mib(found: tuple[float, int] | None) -> str:
    return "-" if found is None else f"{found[0]:.0f}"


def _fds(found: tuple[float, int] | None) -> str:
    return "-" if found is None else str(found[1])


def main() -> None:
    # SIGTERM ends the soak as Ctrl-C does: the run is cancelled, and its processes and
    # databases are put away on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = options()
    args.logs = args.logs or Path(tempfile.mkdtemp(prefix="labd-soak-"))
    args.logs.mkdir(parents=True, exist_ok=True)
    try:
        sys.exit(run(soak(args), spawns=True))
    except KeyboardInterrupt:
        console.print(f"soak interrupted: its processes stopped, its databases dropped; the "
                      f"logs are in {args.logs}")
        sys.exit(130)


if __name__ == "__main__":
    main()
