#!/usr/bin/env python3
"""Soak: N minutes of random circuit changes, random faults of every kind, and random bad
input on every interface of the daemon, on the packaged demo lab (every instrument family)
and, beside it, the packaged failover lab (emulated GPU hosts), both in emulation. At the
end the faults are cleared and every switch must hold exactly what the daemon intends.

What it does, each step chosen at random:

- a change through the API: connect free ports, disconnect a connected one, or replace a
  switch's whole map (refusals — busy ports, an offline switch — are fine; a 5xx is not);
- a device fault through the emulators' control endpoint, of every kind the device's family
  has: connections dropped (also mid-command, and all at once), stalls, garbage replies,
  delayed replies, failed and restored ports, meter heads gone, saturated or stuck, mesh
  heaters dead and revived;
- a host fault: a failover drill (a GPU's Xid 79, or a host gone silent), which the daemon
  recovers with a spare and the drill then repairs;
- bad HTTP: random bytes, wrong types, huge integers, unknown names, oversized bodies, and
  agents' routes in a host's name with what no agent sends;
- bad WebSocket traffic: random frames at the event stream;
- bad MQTT (where a broker answers on this machine): random bytes, unsigned and mis-signed
  commands, host reports in nobody's name, payloads too large, too deep or slow to scan.

Drift left by a fault mid-change (the daemon reports it: a failed change, a drift event) is
put back by the daemon itself when the switch comes back online (``on_drift = "restore"``,
counted); what is still drifted at the end is put back as an operator would, with a
whole-map PUT of the intended map; a drift with no
failed change behind it is reported as silent. It prints the process's RSS and open file
descriptors at the start, each minute and at the end, and then: steps by kind, HTTP
statuses, refusals by reason, tracebacks logged (must be 0), how the drills ended, hosts
online, instruments online, and intended = observed per switch (device truth from the
emulators). Exit status 1 if any check fails.

Usage: python scripts/soak.py [--minutes 10] [--seed 1] [--no-mqtt]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import websockets
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from labd.emulation.drill import hosts_ready
from labd.emulation.rig import RIG_CLIENT, Rig, emulated_rig
from labd.lab.file import load_lab
from labd.mqtt.client import local_broker
from labd.mqtt.envelope import Sealer, new_key
from labd.runtime import run

console = Console()
SWITCH_FAULTS = ["drop", "drop-apply", "drop-now", "stall", "garbage", "delay", "fail_port",
                 "restore_port"]
METER_FAULTS = ["no_sensor", "saturation", "stuck", "drop", "garbage", "delay"]
MESH_FAULTS = ["dead_heater", "revive_heater", "drop", "garbage", "delay"]


class Tracebacks(logging.Handler):
    """Counts log records that carry a traceback: there must be none."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


def rss_and_fds() -> tuple[float, int]:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20, len(os.listdir("/proc/self/fd"))


def junk(rng: random.Random) -> Any:
    """A value of a random wrong shape."""
    return rng.choice([
        None, True, "17", -1, 0, 2**70, -(2**63) - 1, 1e308, "nan", [], {}, [[1]], [["1", 2]],
        [[True, 2]], "x" * 5000, {"pairs": "all"}, [[1, 2]] * 3000, ["\u0000"], "🙂",
    ])


class Soak:
    """``rig``: the demo lab (every instrument family); ``hosts``: the failover lab beside
    it, whose GPU hosts are emulated, for host faults (drills) and bad host input."""

    def __init__(self, rig: Rig, rng: random.Random, http: httpx.AsyncClient,
                 hosts: Rig, hosts_http: httpx.AsyncClient) -> None:
        self.rig, self.rng, self.http = rig, rng, http
        self.hosts, self.hosts_http = hosts, hosts_http
        self.host_ids = [h.id for h in hosts.daemon.lab.host]
        lab = rig.daemon.lab
        self.switches = [e.id for e in lab.instrument if e.driver in (
            "polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh")]
        self.meters = [e.id for e in lab.instrument if e.driver in (
            "keysight-n77xx", "thorlabs-pm100")]
        self.mesh = [e.id for e in lab.instrument if e.driver == "qontrol-mesh"]
        self.steps: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.server_errors: list[str] = []
        self.differences: dict[str, str] = {}
        self.failed: collections.Counter[str] = collections.Counter()
        self.drift_events = 0
        self.healed: collections.Counter[str] = collections.Counter()
        """The daemon's own restores after a reconnect, per switch (on_drift = restore)."""
        self.unavailable: collections.Counter[str] = collections.Counter()
        self.drills: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()

    def _note(self, what: str, response: httpx.Response) -> None:
        self.statuses[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            self.server_errors.append(f"{what}: {response.status_code} {response.text[:200]}")
        elif response.status_code == 503 or what.startswith(("restore", "drill")):
            self.unavailable[f"{what.split()[0]} {response.status_code}: "
                             f"{response.text[:100]}"] += 1

    def size(self, switch: str) -> int:
        info = self.rig.daemon.engine.switch(switch).info
        return info.ports if info is not None else 8

    async def change(self) -> None:
        sw = self.rng.choice(self.switches)
        n = self.size(sw)
        intended = self.rig.daemon.engine.intended.get(sw, {})
        used = set(intended) | set(intended.values())
        free = [p for p in range(1, n + 1) if p not in used]
        self.rng.shuffle(free)
        op = self.rng.choice(["connect", "connect", "disconnect", "replace"])
        if op == "connect" and len(free) >= 2:
            count = self.rng.randint(1, max(1, min(4, len(free) // 2)))
            pairs = [[free[2 * i], free[2 * i + 1]] for i in range(count)]
            r = await self.http.post(f"/v1/switches/{sw}/connections", json={"pairs": pairs})
        elif op == "disconnect" and intended:
            port = self.rng.choice(sorted(intended))
            r = await self.http.post(f"/v1/switches/{sw}/disconnect", json={"ports": [port]})
        else:
            ports = list(range(1, n + 1))
            self.rng.shuffle(ports)
            half = self.rng.randint(0, min(8, n // 2))
            pairs = [[ports[2 * i], ports[2 * i + 1]] for i in range(half)]
            r = await self.http.put(f"/v1/switches/{sw}/connections", json={"pairs": pairs})
        self._note(f"{op} {sw}", r)
        self.steps["change"] += 1

    async def fault(self) -> None:
        backdoor = self.rig.backdoor
        target = self.rng.choice(self.switches + self.meters)
        kinds = MESH_FAULTS if target in self.mesh else (
            METER_FAULTS if target in self.meters else SWITCH_FAULTS)
        kind = self.rng.choice(kinds)
        fault: dict[str, Any] = {"kind": kind.split("-")[0], "count": self.rng.randint(1, 3)}
        if kind == "drop-apply":
            fault["apply"] = True
        elif kind == "drop-now":
            fault["now"] = True
        elif kind == "delay":
            fault["delay_ms"] = self.rng.choice([5, 50, 400])
        elif kind in ("fail_port", "restore_port"):
            fault["port"] = self.rng.randint(1, self.size(target))
        elif kind in ("dead_heater", "revive_heater"):
            fault.pop("count")
            fault["channel"] = self.rng.randrange(20)  # the demo mesh's 20 heaters
        elif kind in ("no_sensor", "saturation", "stuck"):
            fault.pop("count")
        try:
            await backdoor.inject(target, fault)
        except Exception as exc:  # a fault this family does not have: the endpoint says so
            self.steps[f"fault refused ({type(exc).__name__})"] += 1
            return
        self.steps[f"fault {kind}"] += 1
        if self.rng.random() < 0.3:
            await backdoor.clear_faults(target)

    async def bad_http(self) -> None:
        rng = self.rng
        sw = rng.choice([*self.switches, "nope", "x" * 300, "%00"])
        choice = rng.randrange(7)
        if choice == 0:
            r = await self.http.post(f"/v1/switches/{sw}/connections",
                                     content=rng.randbytes(rng.randint(0, 2000)),
                                     headers={"Content-Type": "application/json"})
        elif choice == 1:
            r = await self.http.post(f"/v1/switches/{sw}/connections",
                                     json={"pairs": junk(rng)})
        elif choice == 2:
            r = await self.http.get("/v1/reconfigurations",
                                    params={"since_ns": str(junk(rng))[:2000],  # a URL's length
                                            "limit": str(junk(rng))[:2000]})
        elif choice == 3:
            r = await self.http.get(f"/v1/failovers/{rng.choice([2**70, -1, 'x', 10**30])}")
        elif choice == 4:
            r = await self.http.post(f"/v1/switches/{sw}/disconnect",
                                     json={"ports": junk(rng), "extra": junk(rng)})
        elif choice == 5:
            r = await self.http.post("/v1/circuits", json={"from": junk(rng), "to": junk(rng)})
        else:  # an agent's route, in a host's name, with what no agent sends
            host = rng.choice([*self.host_ids, "nope"])
            kind = rng.choice(["events", "heartbeat", "status", "nope"])
            body = (rng.randbytes(rng.randint(0, 2000)) if rng.random() < 0.5
                    else json.dumps({"host": junk(rng), "gpu": junk(rng),
                                     "health": junk(rng)}).encode())
            r = await self.hosts_http.post(f"/v1/agents/{host}/{kind}", content=body,
                                           headers={"Content-Type": "application/json"})
        self._note("bad http", r)
        self.steps["bad http"] += 1

    async def drill(self) -> None:
        """A host fault: a GPU fails (Xid 79) or a host goes silent; the daemon recovers the
        job with a spare, then the drill repairs the member (refused while one runs)."""
        kind = self.rng.choice(["gpu", "host"])
        r = await self.hosts_http.post("/v1/drills/failover", json={"kind": kind})
        self._note(f"drill {kind}", r)
        self.steps[f"drill {kind} ({r.status_code})"] += 1

    async def bad_websocket(self) -> None:
        url = str(self.http.base_url).rstrip("/").replace("http", "ws", 1) + "/v1/events"
        try:
            token = {"Authorization": self.http.headers["Authorization"]}
            async with websockets.connect(url, additional_headers=token, open_timeout=5) as ws:
                await asyncio.wait_for(ws.recv(), 5)  # the snapshot
                for _ in range(self.rng.randint(1, 5)):
                    await ws.send(self.rng.randbytes(self.rng.randint(0, 5000)))
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            self.steps[f"websocket closed ({type(exc).__name__})"] += 1
            return
        self.steps["bad websocket"] += 1

    async def bad_mqtt(self, client: aiomqtt.Client) -> None:
        bus, daemon_bus = self.rig.bus, self.rig.daemon.bus
        assert bus is not None and daemon_bus is not None
        root, rng = daemon_bus.prefix, self.rng
        sw = rng.choice(self.switches)
        command = f"{root}/command/{sw}"
        hosts_bus = self.hosts.daemon.bus
        assert hosts_bus is not None
        host, host_root = rng.choice(self.host_ids), f"{hosts_bus.prefix}/hosts"
        choice = rng.randrange(8)
        if choice == 0:
            topic, payload = command, rng.randbytes(rng.randint(0, 3000))
        elif choice == 7:  # unclosed strings behind brackets: a slow scan would freeze us
            topic, payload = command, b"[" * 40 + b'"\\' * 100_000
        elif choice == 1:
            topic, payload = command, json.dumps({"token": "guess", "connect": [[1, 2]]}).encode()
        elif choice == 2:  # sealed with a key the daemon does not know
            stranger = Sealer(RIG_CLIENT, new_key())
            topic, payload = command, stranger.seal(command, '{"connect": [[1, 2]]}')
        elif choice == 3:  # sealed properly, with junk inside
            sealer = Sealer(RIG_CLIENT, bus.credentials.clients[RIG_CLIENT])
            topic, payload = command, sealer.seal(command, json.dumps({"connect": junk(rng)}))
        elif choice == 4:
            topic = f"{host_root}/{host}/events"  # a failure report in nobody's name
            payload = json.dumps({"host": host, "gpu": 0, "health": "failed"}).encode()
        elif choice == 5:
            topic, payload = f"{host_root}/{host}/heartbeat", b'["' * 50_000
        else:
            topic, payload = command, b"x" * 300_000
        await client.publish(topic, payload)
        self.steps["bad mqtt"] += 1

    async def heal(self) -> None:
        """Every fault cleared, every failed port and dead heater back."""
        backdoor = self.rig.backdoor
        for target in self.switches + self.meters:
            await backdoor.clear_faults(target)  # heaters revive with it
            ports = (await backdoor.describe(target)).get("state", {}).get("ports", {})
            for port, state in ports.items():
                if state == "F":
                    await backdoor.inject(target, {"kind": "restore_port", "port": int(port)})


def holds(truth: dict[str, Any], intended: dict[int, int]) -> bool:
    """The device holds exactly the intended circuits (a mesh routes every input somewhere:
    there, each intended circuit must be among its routes)."""
    state = truth.get("state", {})
    if "routes" in state:
        routes = {int(a): int(b) for a, b in state["routes"]}
        return all(routes.get(a) == b for a, b in intended.items())
    return {int(a): int(b) for a, b in state.get("connections", [])} == intended


async def settle(soak: Soak, deadline_s: float) -> dict[str, bool]:
    """Wait (polling the API, with a deadline) until every instrument is online and every
    switch's device holds what the daemon intends; the verdict per switch (and, for one
    that does not hold, what each side says in ``soak.differences``)."""
    daemon = soak.rig.daemon
    verdict: dict[str, bool] = {}
    states: dict[str, str] = {}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        states = {i["id"]: i["state"] for i in (await soak.http.get("/v1/instruments")).json()}
        soak.differences.clear()
        if all(s == "online" for s in states.values()):
            for sw in soak.switches:
                truth = await soak.rig.backdoor.truth(sw)
                verdict[sw] = holds(truth, daemon.engine.intended.get(sw, {}))
                soak.differences[sw] = (f"intended {daemon.engine.intended.get(sw, {})}, "
                                        f"device {truth.get('state')}")
            if all(verdict.values()):
                return verdict
        await asyncio.sleep(0.5)  # polling an outcome, not synchronising: the deadline rules
    offline = [name for name, state in states.items() if state != "online"]
    if offline:
        soak.differences["offline"] = ", ".join(offline)
    return verdict


async def drills_over(soak: Soak, deadline_s: float) -> bool:
    """Wait (with a deadline) for the last drill to end and every host to be back online
    and healthy; whether they are."""
    daemon = soak.hosts.daemon
    drills = daemon.services.drills
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        task = getattr(drills, "task", None)
        if (task is None or task.done()) and hosts_ready(daemon):
            return True
        await asyncio.sleep(0.5)  # polling an outcome, not synchronising: the deadline rules
    return False


async def restore(soak: Soak, verdict: dict[str, bool]) -> list[str]:
    """What an operator does on a drift: put the intended map back (a whole-map replacement
    through the API). Only for a switch whose changes failed while the soak ran: a drift
    with no failed change behind it would be silent, and is reported instead."""
    restored = []
    for sw, ok in verdict.items():
        if ok or not soak.failed[sw]:
            continue
        intended = soak.rig.daemon.engine.intended.get(sw, {})
        r = await soak.http.put(f"/v1/switches/{sw}/connections",
                                json={"pairs": [[a, b] for a, b in sorted(intended.items())]})
        soak._note(f"restore {sw}", r)
        restored.append(sw)
    return restored


async def count_drills(soak: Soak) -> None:
    """How the drills ended, as the failover lab's daemon reports them."""
    _, subscription = soak.hosts.daemon.hub.subscribe()
    try:
        while (event := await subscription.next()) is not None:
            if event.kind == "drill" and event.data.get("state") in ("done", "failed"):
                outcome = event.data.get("outcome") or event.data.get("detail") or ""
                soak.drills[f"{event.data['state']} {str(outcome)[:80]}".strip()] += 1
    finally:
        subscription.close()


async def count_failures(soak: Soak) -> None:
    """Failed changes per switch, as the daemon reports them on its event stream."""
    _, subscription = soak.rig.daemon.hub.subscribe()
    try:
        while (event := await subscription.next()) is not None:
            if event.kind == "reconfiguration" and event.data.get("outcome") == "failed":
                soak.failed[event.data["switch"]] += 1
                soak.reasons[f"{event.data['switch']}: {str(event.data.get('error'))[:90]}"] += 1
            elif event.kind == "reconfiguration" and event.data.get("cause") == "restore":
                soak.healed[event.data["switch"]] += 1
            if event.kind in ("drift", "instrument.drift", "instrument.resync"):
                soak.drift_events += 1
    finally:
        subscription.close()


async def soak(minutes: float, seed: int, use_mqtt: bool) -> int:
    rng = random.Random(seed)
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    broker = local_broker() if use_mqtt else None
    lab = load_lab("demo")
    with tempfile.TemporaryDirectory() as scratch:
        auth = {"Authorization": "Bearer soak"}
        async with emulated_rig(lab, db=str(Path(scratch) / "soak.sqlite"), mqtt=broker,
                                token="soak") as rig, \
                emulated_rig(load_lab("failover"), db=str(Path(scratch) / "hosts.sqlite"),
                             mqtt=broker, token="soak") as hosts_rig, \
                httpx.AsyncClient(base_url=rig.daemon.url, timeout=30, headers=auth) as http, \
                httpx.AsyncClient(base_url=hosts_rig.daemon.url, timeout=30,
                                  headers=auth) as hosts_http:
            soak = Soak(rig, rng, http, hosts_rig, hosts_http)
            counting = [asyncio.create_task(count_failures(soak)),
                        asyncio.create_task(count_drills(soak))]
            rss0, fds0 = rss_and_fds()
            console.print(f"[bold]soak[/]: labs demo and failover, {minutes:g} min, seed "
                          f"{seed}, MQTT {broker or 'off'}; start: RSS {rss0:.0f} MiB, {fds0} fds")
            actions = [(soak.change, 60), (soak.fault, 10), (soak.bad_http, 15),
                       (soak.bad_websocket, 2), (soak.drill, 1)]
            client: aiomqtt.Client | None = None
            if broker is not None:
                client = aiomqtt.Client("127.0.0.1", 1883)
                await client.__aenter__()
                actions.append((None, 13))  # type: ignore[arg-type]
            end = time.monotonic() + minutes * 60
            with Progress(TextColumn("{task.description}"), BarColumn(),
                          TimeRemainingColumn(), console=console) as progress:
                task = progress.add_task("soaking", total=minutes * 60)
                started = time.monotonic()
                minute = started + 60
                samples: list[str] = []  # RSS and fds each minute: flat, or a leak
                while time.monotonic() < end:
                    if time.monotonic() >= minute:
                        rss, fds = rss_and_fds()
                        samples.append(f"{rss:.0f}/{fds}")
                        minute += 60
                    action = rng.choices([a for a, _ in actions],
                                         weights=[w for _, w in actions])[0]
                    if action is None:
                        assert client is not None
                        await soak.bad_mqtt(client)
                    else:
                        await action()
                    progress.update(task, completed=time.monotonic() - started,
                                    description=f"soaking: {sum(soak.steps.values())} steps")
            if client is not None:
                await client.__aexit__(None, None, None)
            hosts = await drills_over(soak, 120)
            await soak.heal()
            verdict = await settle(soak, 60)
            drifted = {sw: soak.differences.get(sw, "") for sw, ok in verdict.items() if not ok}
            restored = await restore(soak, verdict)
            if restored:
                verdict = await settle(soak, 60)
            for task in counting:
                task.cancel()
            rss1, fds1 = rss_and_fds()
            refused = sum(r.daemon.bus.complain.count for r in (rig, hosts_rig)
                          if r.daemon.bus is not None)
    console.print(f"end: RSS {rss1:.0f} MiB, {fds1} fds (start: {rss0:.0f} MiB, {fds0} fds)")
    if samples:
        console.print(f"each minute, RSS MiB/fds: {', '.join(samples)}")
    console.print("steps: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.steps.items())))
    console.print("HTTP statuses: " + ", ".join(f"{k}: {v}"
                                                 for k, v in sorted(soak.statuses.items())))
    console.print(f"MQTT messages refused by the daemon: {refused}")
    console.print(f"5xx other than 503: {len(soak.server_errors)}; tracebacks or errors "
                  f"logged: {len(tracebacks.records)}")
    for line in soak.server_errors[:10]:
        console.print(f"  {line}")
    for record in tracebacks.records[:10]:
        console.print(f"  {record.name}: {record.getMessage()[:200]}")
    console.print(f"failed changes (reported, with drift read back where the switch "
                  f"answered): {sum(soak.failed.values())} ({dict(soak.failed)}); drift "
                  f"events: {soak.drift_events}; restored by the daemon on reconnecting: "
                  f"{sum(soak.healed.values())} ({dict(soak.healed)})")
    for reason, count in soak.reasons.most_common(8):
        console.print(f"  {count} x {reason}")
    console.print("503s (refusals while a device or the store is unavailable), restores, "
                  "drills:")
    for reason, count in soak.unavailable.most_common(8):
        console.print(f"  {count} x {reason}")
    for sw, difference in drifted.items():
        how = "restored through the API" if sw in restored else "SILENT: no failed change"
        console.print(f"  after healing, {sw} differed ({how}): {difference[:300]}")
    console.print("drills: " + (", ".join(f"{count} {what}" for what, count
                                          in soak.drills.most_common()) or "none ended")
                  + f"; hosts online and healthy at the end: {'yes' if hosts else 'NO'}")
    console.print("intended = observed: " + ", ".join(
        f"{sw} {'yes' if ok else 'NO'}" for sw, ok in verdict.items()))
    for sw, ok_ in verdict.items():
        if not ok_:
            console.print(f"  {sw}: {soak.differences.get(sw, '')[:600]}")
    if "offline" in soak.differences:
        console.print(f"  still offline: {soak.differences['offline']}")
    ok = (hosts and not soak.server_errors and not tracebacks.records and bool(verdict)
          and all(verdict.values()) and len(verdict) == len(soak.switches))
    console.print("[green]soak passed[/]" if ok else "[red]soak FAILED[/]")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-mqtt", action="store_true",
                        help="leave the bus out even if a broker answers on this machine")
    args = parser.parse_args()
    sys.exit(run(soak(args.minutes, args.seed, not args.no_mqtt), spawns=True))


if __name__ == "__main__":
    main()
