"""The soak's quick steps (scripts/soak.py), each against whichever daemon leads: circuit
changes through the API, device faults through the emulators' control endpoint, and bad
input on every interface; what every daemon says on its event stream, counted; and, at the
end, the faults healed and each switch's device set against what the daemon intends."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import aiomqtt
import httpx
import websockets
from soak_lab import SOAK_CLIENT, Process, Site, scaled

from labd.client.control import Backdoor
from labd.errors import BackdoorError
from labd.mqtt.client import parse_url, session
from labd.mqtt.envelope import Sealer, new_key

SWITCH_FAULTS = ["drop", "drop-apply", "drop-now", "stall", "garbage", "delay", "fail_port",
                 "restore_port"]
METER_FAULTS = ["no_sensor", "saturation", "stuck", "drop", "garbage", "delay"]
MESH_FAULTS = ["dead_heater", "revive_heater", "drop", "garbage", "delay"]
SWITCH_DRIVERS = ("polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh")
METER_DRIVERS = ("keysight-n77xx", "thorlabs-pm100")


def junk(rng: random.Random) -> Any:
    """A value of a random wrong shape."""
    return rng.choice([
        None, True, "17", -1, 0, 2**70, -(2**63) - 1, 1e308, "nan", [], {}, [[1]], [["1", 2]],
        [[True, 2]], "x" * 5000, {"pairs": "all"}, [[1, 2]] * 3000, ["\u0000"], "🙂",
    ])


@dataclass
class HostLoss:
    """A ``host.lost`` event, or a recorded failover with trigger ``host-lost``."""

    site: str
    host: str
    at: float
    """When (time.time()): the event's arrival, the failover's wall time."""
    what: str


class Soak:
    """The steps on ``demo`` (every instrument family) and ``hosts`` (the failover lab:
    GPU hosts, a job with spares), both started, and what their daemons report."""

    def __init__(self, demo: Site, hosts: Site, rng: random.Random, *, switches: list[str],
                 meters: list[str], mesh: list[str], mqtt: str) -> None:
        self.demo, self.hosts, self.rng = demo, hosts, rng
        self.switches, self.meters, self.mesh = switches, meters, mesh
        self.mqtt = mqtt
        self.backdoor = Backdoor(demo.control)
        self.sizes: dict[str, int] = {}
        self.steps: collections.Counter[str] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()
        """Faults by kind: device faults, drills, broker restarts, leader changes."""
        self.statuses: collections.Counter[int] = collections.Counter()
        self.server_errors: list[str] = []
        self.unavailable: collections.Counter[str] = collections.Counter()
        self.failed: collections.Counter[str] = collections.Counter()
        """Failed changes per ``site/switch``, as the daemons report them."""
        self.reasons: collections.Counter[str] = collections.Counter()
        self.healed: collections.Counter[str] = collections.Counter()
        self.drift_events = 0
        self.mqtt_warnings = 0
        self.leadings: list[str] = []
        self.losses: list[HostLoss] = []
        self.differences: dict[str, str] = {}
        self._mqtt: contextlib.AsyncExitStack | None = None
        self._client: aiomqtt.Client | None = None
        self._followers: list[asyncio.Task[None]] = []
        for site in (demo, hosts):  # those running now, and those a leader change starts
            for proc in site.daemons:
                self.follow(site, proc)
            site.on_daemon.append(lambda proc, site=site: self.follow(site, proc))

    # -- what the daemons say ---------------------------------------------------------------
    def follow(self, site: Site, proc: Process) -> None:
        """Read a daemon's event stream for as long as it runs: every daemon's, since a
        standby that takes over reports from then on without a gap."""
        self._followers.append(asyncio.create_task(self._follow(site, proc),
                                                   name=f"events-{proc.name}"))

    async def _follow(self, site: Site, proc: Process) -> None:
        url = proc.url.replace("http", "ws", 1) + "/v1/events"
        auth = {"Authorization": f"Bearer {site.token}"}
        while proc.alive:
            with contextlib.suppress(OSError, websockets.WebSocketException, TimeoutError):
                async with websockets.connect(url, additional_headers=auth, open_timeout=5,
                                              max_size=None) as ws:
                    async for raw in ws:
                        self.on_event(site, json.loads(raw))
            await asyncio.sleep(0.2)  # reconnecting (a stream closed for falling behind)

    def on_event(self, site: Site, event: dict[str, Any]) -> None:
        kind, data = event.get("kind"), event.get("data") or {}
        if kind == "reconfiguration":
            where = f"{site.lab}/{data.get('switch')}"
            if data.get("outcome") == "failed":
                self.failed[where] += 1
                self.reasons[f"{where}: {str(data.get('error'))[:90]}"] += 1
            elif data.get("cause") == "restore":
                self.healed[where] += 1
        elif kind in ("drift", "instrument.drift", "instrument.resync"):
            self.drift_events += 1
        elif kind == "host.lost":
            self.losses.append(HostLoss(site.lab, str(data.get("host")), time.time(),
                                        f"host.lost {data.get('was')} -> {data.get('status')}"))
        elif kind == "warning" and data.get("source") == "mqtt":
            self.mqtt_warnings += 1
        elif kind == "ha.leading":
            self.leadings.append(f"{site.lab} epoch {data.get('epoch')} "
                                 f"({data.get('took_over_ms')} ms)")

    async def close(self) -> None:
        for task in self._followers:
            task.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        await self._drop_mqtt()
        await self.backdoor.close()

    def note(self, what: str, response: httpx.Response | None) -> None:
        if response is None:
            step = "bad http" if what.startswith("bad http") else what.split()[0]
            self.steps[f"{step}: no leader answered"] += 1
            return
        self.statuses[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            self.server_errors.append(f"{what}: {response.status_code} {response.text[:200]}")
        elif response.status_code == 503 or what.startswith("restore"):
            self.unavailable[f"{what.split()[0]} {response.status_code}: "
                             f"{response.text[:100]}"] += 1

    # -- the steps ---------------------------------------------------------------------------
    async def sizes_known(self) -> None:
        for sw in self.switches:
            ports = await self.demo.get_json(f"/v1/switches/{sw}/ports")
            self.sizes[sw] = len(ports) if isinstance(ports, list) and ports else 8

    async def change(self) -> None:
        sw = self.rng.choice(self.switches)
        n = self.sizes.get(sw, 8)
        state = await self.demo.get_json(f"/v1/switches/{sw}")
        if state is None:
            self.steps["change: no leader answered"] += 1
            return
        intended = {a: b for a, b in state["intended"]}
        used = set(intended) | set(intended.values())
        free = [p for p in range(1, n + 1) if p not in used]
        self.rng.shuffle(free)
        op = self.rng.choice(["connect", "connect", "disconnect", "replace"])
        if op == "connect" and len(free) >= 2:
            count = self.rng.randint(1, max(1, min(4, len(free) // 2)))
            pairs = [[free[2 * i], free[2 * i + 1]] for i in range(count)]
            r = await self.demo.call("POST", f"/v1/switches/{sw}/connections",
                                     json={"pairs": pairs})
        elif op == "disconnect" and intended:
            port = self.rng.choice(sorted(intended))
            r = await self.demo.call("POST", f"/v1/switches/{sw}/disconnect",
                                     json={"ports": [port]})
        else:
            ports = list(range(1, n + 1))
            self.rng.shuffle(ports)
            half = self.rng.randint(0, min(8, n // 2))
            pairs = [[ports[2 * i], ports[2 * i + 1]] for i in range(half)]
            r = await self.demo.call("PUT", f"/v1/switches/{sw}/connections",
                                     json={"pairs": pairs})
        self.note(f"{op} {sw}", r)
        self.steps["change"] += 1

    async def fault(self) -> None:
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
            fault["port"] = self.rng.randint(1, self.sizes.get(target, 8))
        elif kind in ("dead_heater", "revive_heater"):
            fault.pop("count")
            fault["channel"] = self.rng.randrange(20)  # the demo mesh's 20 heaters
        elif kind in ("no_sensor", "saturation", "stuck"):
            fault.pop("count")
        try:
            await self.backdoor.inject(target, fault)
        except BackdoorError as exc:  # a fault this family does not have: the endpoint says so
            self.steps[f"fault refused ({type(exc).__name__})"] += 1
            return
        self.steps["fault"] += 1
        self.faults[f"device {kind}"] += 1
        if self.rng.random() < 0.3:
            await self.backdoor.clear_faults(target)

    async def bad_http(self) -> None:
        rng, site = self.rng, self.demo
        sw = rng.choice([*self.switches, "nope", "x" * 300, "%00"])
        choice = rng.randrange(7)
        json_type = {"Content-Type": "application/json"}
        if choice == 0:
            r = await site.call("POST", f"/v1/switches/{sw}/connections", headers=json_type,
                                content=rng.randbytes(rng.randint(0, 2000)))
        elif choice == 1:
            r = await site.call("POST", f"/v1/switches/{sw}/connections",
                                json={"pairs": junk(rng)})
        elif choice == 2:
            r = await site.call("GET", "/v1/reconfigurations",
                                params={"since_ns": str(junk(rng))[:2000],  # a URL's length
                                        "limit": str(junk(rng))[:2000]})
        elif choice == 3:
            r = await site.call("GET", f"/v1/failovers/{rng.choice([2**70, -1, 'x', 10**30])}")
        elif choice == 4:
            r = await site.call("POST", f"/v1/switches/{sw}/disconnect",
                                json={"ports": junk(rng), "extra": junk(rng)})
        elif choice == 5:
            r = await site.call("POST", "/v1/circuits", json={"from": junk(rng), "to": junk(rng)})
        else:  # an agent's route, in a host's name, with what no agent sends
            host = rng.choice([*self.hosts.hosts, "nope"])
            kind = rng.choice(["events", "heartbeat", "status", "nope"])
            body = (rng.randbytes(rng.randint(0, 2000)) if rng.random() < 0.5
                    else json.dumps({"host": junk(rng), "gpu": junk(rng),
                                     "health": junk(rng)}).encode())
            r = await self.hosts.call("POST", f"/v1/agents/{host}/{kind}", content=body,
                                      headers=json_type)
        self.note("bad http", r)
        self.steps["bad http"] += 1

    async def bad_websocket(self) -> None:
        proc = self.demo.leading or await self.demo.find_leader()
        if proc is None:
            self.steps["bad websocket: no leader answered"] += 1
            return
        url = proc.url.replace("http", "ws", 1) + "/v1/events"
        token = {"Authorization": f"Bearer {self.demo.token}"}
        try:
            async with websockets.connect(url, additional_headers=token, open_timeout=5) as ws:
                await asyncio.wait_for(ws.recv(), 5)  # the snapshot
                for _ in range(self.rng.randint(1, 5)):
                    await ws.send(self.rng.randbytes(self.rng.randint(0, 5000)))
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            self.steps[f"websocket closed ({type(exc).__name__})"] += 1
            return
        self.steps["bad websocket"] += 1

    async def _connect_mqtt(self) -> aiomqtt.Client | None:
        if self._client is not None:
            return self._client
        host, port = parse_url(self.mqtt)
        stack = contextlib.AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(
                session(hostname=host, port=port, timeout=2))
        except aiomqtt.MqttError:
            await stack.aclose()
            return None
        self._mqtt = stack
        return self._client

    async def _drop_mqtt(self) -> None:
        stack, self._mqtt, self._client = self._mqtt, None, None
        if stack is not None:
            with contextlib.suppress(aiomqtt.MqttError, OSError):
                await stack.aclose()

    async def bad_mqtt(self) -> None:
        """Bad messages on both labs' topics; while the broker is down (a restart), the
        step is counted as such and the soak's client connects again on a later one."""
        client = await self._connect_mqtt()
        if client is None:
            self.steps["bad mqtt: broker down"] += 1
            return
        rng = self.rng
        sw = rng.choice(self.switches)
        command = f"{self.demo.root}/command/{sw}"
        host, host_root = rng.choice(self.hosts.hosts), f"{self.hosts.root}/hosts"
        choice = rng.randrange(8)
        if choice == 0:
            topic, payload = command, rng.randbytes(rng.randint(0, 3000))
        elif choice == 7:  # unclosed strings behind brackets: a slow scan would freeze us
            topic, payload = command, b"[" * 40 + b'"\\' * 100_000
        elif choice == 1:
            topic, payload = command, json.dumps({"token": "guess", "connect": [[1, 2]]}).encode()
        elif choice == 2:  # sealed with a key the daemon does not know
            stranger = Sealer(SOAK_CLIENT, new_key())
            topic, payload = command, stranger.seal(command, '{"connect": [[1, 2]]}')
        elif choice == 3:  # sealed properly, with junk inside
            sealer = Sealer(SOAK_CLIENT, self.demo.credentials.clients[SOAK_CLIENT])
            topic, payload = command, sealer.seal(command, json.dumps({"connect": junk(rng)}))
        elif choice == 4:
            topic = f"{host_root}/{host}/events"  # a failure report in nobody's name
            payload = json.dumps({"host": host, "gpu": 0, "health": "failed"}).encode()
        elif choice == 5:
            topic, payload = f"{host_root}/{host}/heartbeat", b'["' * 50_000
        else:
            topic, payload = command, b"x" * 300_000
        try:
            await client.publish(topic, payload)
        except aiomqtt.MqttError:
            await self._drop_mqtt()
            self.steps["bad mqtt: broker down"] += 1
            return
        self.steps["bad mqtt"] += 1

    # -- the end -----------------------------------------------------------------------------
    async def heal(self) -> None:
        """Every device fault cleared, every failed port and dead heater back."""
        for target in self.switches + self.meters:
            await self.backdoor.clear_faults(target)  # heaters revive with it
            ports = (await self.backdoor.describe(target)).get("state", {}).get("ports", {})
            for port, state in ports.items():
                if state == "F":
                    await self.backdoor.inject(target, {"kind": "restore_port",
                                                        "port": int(port)})

    def targets(self) -> list[tuple[Site, Backdoor, str]]:
        return [(self.demo, self.backdoor, sw) for sw in self.switches]

    async def settle(self, extra: list[tuple[Site, Backdoor, str]], deadline_s: float
                     ) -> dict[str, bool]:
        """Wait (polling the leaders, with a deadline) until every instrument of both labs
        is online and every switch's device holds what its daemon intends; the verdict per
        ``lab/switch`` (what differs in ``self.differences``)."""
        verdict: dict[str, bool] = {}
        offline: list[str] = []
        end = time.monotonic() + scaled(deadline_s)
        while time.monotonic() < end:
            offline = []
            for site in (self.demo, self.hosts):
                found = await site.get_json("/v1/instruments")
                states = {i["id"]: i["state"] for i in found} if found is not None else {}
                offline += [f"{site.lab}/{name}" for name, state in states.items()
                            if state != "online"] if states else [f"{site.lab}: no leader"]
            self.differences.clear()
            if not offline:
                for site, backdoor, sw in self.targets() + extra:
                    where = f"{site.lab}/{sw}"
                    state = await site.get_json(f"/v1/switches/{sw}")
                    intended = {a: b for a, b in state["intended"]} if state else {}
                    truth = await backdoor.truth(sw)
                    verdict[where] = state is not None and holds(truth, intended)
                    self.differences[where] = (f"intended {intended}, device "
                                               f"{truth.get('state')}")
                if all(verdict.values()):
                    return verdict
            await asyncio.sleep(0.5)  # polling an outcome, not synchronising: the deadline rules
        if offline:
            self.differences["offline"] = ", ".join(offline)
        return verdict

    async def restore(self, verdict: dict[str, bool]) -> list[str]:
        """What an operator does on a drift: put the intended map back (a whole-map
        replacement through the API). Only where changes failed while the soak ran: a
        drift with no failed change behind it would be silent, and is reported instead."""
        restored = []
        for where, ok in verdict.items():
            if ok or not self.failed[where]:
                continue
            lab, sw = where.split("/", 1)
            site = self.demo if lab == self.demo.lab else self.hosts
            state = await site.get_json(f"/v1/switches/{sw}")
            if state is None:
                continue
            r = await site.call("PUT", f"/v1/switches/{sw}/connections",
                                json={"pairs": state["intended"]})
            self.note(f"restore {where}", r)
            restored.append(where)
        return restored


def holds(truth: dict[str, Any], intended: dict[int, int]) -> bool:
    """The device holds exactly the intended circuits (a mesh routes every input somewhere:
    there, each intended circuit must be among its routes)."""
    state = truth.get("state", {})
    if "routes" in state:
        routes = {int(a): int(b) for a, b in state["routes"]}
        return all(routes.get(a) == b for a, b in intended.items())
    return {int(a): int(b) for a, b in state.get("connections", [])} == intended
