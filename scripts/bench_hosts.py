#!/usr/bin/env python3
"""Benchmark: how many GPU hosts one daemon holds, at 1 s heartbeats.

For each size N (default 1,024, 2,048 and 4,096 hosts of 8 GPUs each), a private Mosquitto
on a free loopback port, a daemon (``labd run``, pinned to core 0 with ``taskset -c 0``) on a
lab file generated with N hosts, and, in this process (on the other cores), N agents'
exact MQTT traffic: one broker connection per host, its sealed ``status`` (``online``, with
the sealed ``offline`` last will), the first report of every GPU's verdict, then a sealed
heartbeat every interval, the hosts spread evenly over it. The payloads are the real
agent's (``labd.agent.reporter.Agent``: its snapshot, its events, its stamp), sealed with each
host's key as the agent seals them.

During the measured window (``--seconds``, 60 by default) it injects real failures (a GPU
turning ``failed``: the agent's event, then heartbeats that say so) and host deaths, half of
them silent (heartbeats stop, the connection stays) and half by last will (the connection
is cut without a goodbye, and the broker publishes the will). A client process of its own
asks ``GET /v1/hosts`` (the whole fleet) and ``GET /v1/hosts?status=lost&limit=100`` (the
paged form) four times a second. It prints per N:

- the daemon's CPU (of one core) over the window, from /proc;
- the daemon's event-loop lag p99 (its ``labd_event_loop_lag_seconds`` histogram over the
  window; the bucket the 99th percentile falls in);
- ``GET /v1/hosts`` p50/p99 and the paged form's, ms;
- false losses: ``host.lost`` for hosts that never stopped (target: 0 at 4,096);
- real deaths found, and the p99 of the last heartbeat → ``host.lost`` in intervals
  (target: ≤ 1.5 and 10 ms);
- failures reported: GPU failures → ``gpu.health`` failed, and its p99 in ms;
- ``hosts.unsure`` events (the daemon saying it was too far behind to judge).

``--emulate`` measures the other side instead: the hosts played by ``labd emulate`` (the
real agent on emulated GPUs, one broker connection per host, each host's NIC fibred
through emulated 384x384 switches so that the optical model is read for its link), pinned
to core 0, with no daemon. Per N it prints the heartbeats a second that reach the broker
(target: N), the hosts heard, ``labd emulate``'s CPU (of one core) and how long it takes
to stop on SIGTERM.

Usage: python scripts/bench_hosts.py [--hosts 1024,2048,4096] [--seconds 60]
                                    [--deaths 8] [--failures 8] [--py-spy FILE] [--json FILE]
                                    [--burst] [--broker-restart] [--emulate | --feeds]

``--burst`` connects every host at once (as after a broker restart) instead of over 5 s,
and says how long until the daemon counts them all online, and whether any was declared
lost meanwhile. ``--broker-restart`` stops the broker (SIGTERM) mid-window and starts it
again on its port; every living host reconnects at once, and the run says how long until
the daemon is sure of them all again (its unsure episode over, every host online). Each
size says whether the load generator kept its schedule (its heartbeats late by at most
10 ms at p99): figures from a run where it did not are the generator's, not the daemon's.
``--feeds`` measures the host feed alone (labd.hosts.feed against aiomqtt with a batched
reader: each reader's CPU per message at N messages a second), with no daemon.

``--py-spy FILE`` records the daemon with py-spy (raw, 200 Hz), one file per size
(``FILE.N``). Figures from a shared machine are provisional: the daemon has core 0 to itself
only where nothing else runs there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt

from labd.agent.backends import EmulatedBackend
from labd.agent.links import client_id
from labd.agent.reporter import Agent
from labd.hostwire import GpuHealth
from labd.mqtt.credentials import BusSettings, Credentials
from labd.mqtt.envelope import Sealer, new_key
from labd.mqtt.private import Mosquitto, MosquittoError
from labd.mqtt.topics import host_root, lab_root
from labd.vocabulary import percentile

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-hosts"
LAB = "bench-hosts"
INSTANCE = "bench"
INTERVAL_S = 1.0
GPUS = 8
KEEPALIVE_S = 60
#: How long the fleet takes to connect: hosts of a pod boot over seconds, not in one instant.
RAMP_S = 5.0
#: After the fleet is online, before the window: the start-up burst (every GPU's first
#: verdict) worked through.
SETTLE_S = 5.0
#: How often the client process asks for the hosts.
GET_EVERY_S = 0.25
#: A death found in time: within 1.5 intervals of the last heartbeat, and 10 ms for the
#: message's way through the broker and the loop.
IN_TIME = 1.5 + 0.010 / INTERVAL_S
#: The load generator kept its schedule while its heartbeats were this late at most (p99).
BEHIND_MS = 10.0


# -- MQTT 3.1.1, just what an agent sends -------------------------------------------------

def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(raw)) + raw


def connect_packet(identifier: str, will_topic: str, will: bytes) -> bytes:
    # Clean session, a QoS 1 retained will: what aiomqtt sends for the agent.
    flags = 0x02 | 0x04 | (1 << 3) | 0x20
    body = _text("MQTT") + bytes([4, flags]) + struct.pack("!H", KEEPALIVE_S) + \
        _text(identifier) + _text(will_topic) + _text(will)
    return b"\x10" + _length(len(body)) + body


def publish_packet(topic: str, payload: bytes, *, qos: int = 0, retain: bool = False,
                   packet_id: int = 1) -> bytes:
    body = _text(topic) + (struct.pack("!H", packet_id) if qos else b"") + payload
    return bytes([0x30 | (qos << 1) | int(retain)]) + _length(len(body)) + body


def subscribe_packet(topic: str, packet_id: int) -> bytes:
    body = struct.pack("!H", packet_id) + _text(topic) + b"\x01"
    return b"\x82" + _length(len(body)) + body


PINGREQ = b"\xc0\x00"


class _Wire(asyncio.Protocol):
    """One host's broker connection; what the broker sends (acks, pongs) is read and
    dropped."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.acked = asyncio.Event()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.acked.is_set() and data[:1] == b"\x20":
            self.acked.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True


# -- the fleet -------------------------------------------------------------------------------

@dataclass
class FakeHost:
    """One agent's traffic: the real agent's messages, sent on a connection of its own."""

    id: str
    key: bytes
    agent: Agent
    backend: EmulatedBackend
    prefix: str
    wire: _Wire | None = None
    sealer: Sealer | None = None
    packet_id: int = 0
    heartbeat: tuple[str, str, str] = ("", "", "")
    """The heartbeat's JSON around its two stamps (at_ns, sent_ns)."""
    silent: bool = False
    last_sent_ns: int = 0
    last_ping: float = 0.0

    def _next_id(self) -> int:
        self.packet_id = self.packet_id % 65535 + 1
        return self.packet_id

    def send(self, kind: str, body: bytes, *, qos: int) -> None:
        assert self.wire is not None and self.wire.transport is not None and self.sealer
        topic = f"{self.prefix}/{kind}"
        self.wire.transport.write(publish_packet(
            topic, self.sealer.seal(topic, body), qos=qos, retain=kind == "status",
            packet_id=self._next_id()))

    async def connect(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        _, wire = await loop.create_connection(_Wire, "127.0.0.1", port)
        self.wire, self.sealer = wire, Sealer(self.id, self.key)
        will = self.sealer.seal(f"{self.prefix}/status", b"offline", last=True)
        assert wire.transport is not None
        wire.transport.write(connect_packet(client_id(self.prefix, self.key),
                                            f"{self.prefix}/status", will))
        async with asyncio.timeout(30):
            await wire.acked.wait()
        self.send("status", b"online", qos=1)
        wire.transport.write(subscribe_packet(f"{self.prefix}/job", self._next_id()))
        await self.report()

    async def report(self) -> int:
        """As the agent's report loop: every verdict that changed as an event (in order),
        then the heartbeat; returns when the first event was stamped."""
        snap, verdicts = await self.agent.snapshot()
        stamped = 0
        for index, verdict in sorted(verdicts.items()):
            before = self.agent.verdicts.get(index)
            if before is None or before.health != verdict.health:
                event = GpuHealth(host=self.id, gpu=index, health=verdict.health.value,
                                  reasons=list(verdict.reasons), at_ns=snap.at_ns,
                                  since_ns=self.backend.since_ns(index),
                                  was=before.health.value if before else None)
                stamped = stamped or event.at_ns or 0
                self.send("events", self.agent.stamp(event), qos=1)
        self.agent.verdicts = verdicts
        snap.nics = {}
        snap.at_ns = 111_111_111_111_111_111
        # The heartbeat as the agent stamps it, with its two stamps left open.
        text = snap.stamped(222_222_222_222_222_222).decode()
        first, second = sorted(("111111111111111111", "222222222222222222"), key=text.find)
        head, rest = text.split(first)
        middle, tail = rest.split(second)
        self.heartbeat = (head, middle, tail)
        self.beat()
        return stamped

    def beat(self) -> None:
        now = time.monotonic_ns()
        head, middle, tail = self.heartbeat
        self.send("heartbeat", f"{head}{now}{middle}{now}{tail}".encode(), qos=0)
        self.last_sent_ns = now

    def cut(self) -> None:
        """Death by last will: the connection goes without a goodbye."""
        assert self.wire is not None and self.wire.transport is not None
        self.wire.transport.abort()


@dataclass
class Fleet:
    hosts: list[FakeHost]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    beats: int = 0
    behind_ms: list[float] = field(default_factory=list)

    async def play(self) -> None:
        """Every host's heartbeat once an interval, host i at i/N of it; a silent host only
        keeps its connection (a ping within the keepalive)."""
        count = len(self.hosts)
        step_ns = int(INTERVAL_S * 1e9) // count
        start = time.monotonic_ns()
        i = 0
        while not self.stop.is_set():
            due = start + i * step_ns
            now = time.monotonic_ns()
            if due > now:
                await asyncio.sleep((due - now) / 1e9)
                continue
            self.behind_ms.append((now - due) / 1e6)
            # Everything due by now, then back to the loop (acks, the test's own tasks).
            sent = 0
            while due <= now and sent < 256:
                host = self.hosts[i % count]
                # A host beats from its first report on (it connects meanwhile).
                if host.wire is not None and not host.wire.closed and host.heartbeat[0]:
                    if not host.silent:
                        host.beat()
                        self.beats += 1
                    elif time.monotonic() - host.last_ping > KEEPALIVE_S / 2:
                        assert host.wire.transport is not None
                        host.wire.transport.write(PINGREQ)
                        host.last_ping = time.monotonic()
                i += 1
                sent += 1
                due = start + i * step_ns
            await asyncio.sleep(0)


def make_fleet(n: int, keys: dict[str, bytes], bus: BusSettings) -> list[FakeHost]:
    out = []
    for index, (host, key) in enumerate(keys.items()):
        backend = EmulatedBackend(count=GPUS, seed=index)
        agent = Agent(lab=LAB, host=host, backend=backend, mqtt=bus.for_host(host),
                      interval=INTERVAL_S, expected_gpus=GPUS)
        out.append(FakeHost(host, key, agent, backend, host_root(LAB, host, INSTANCE)))
    assert len(out) == n
    return out


def host_ids(n: int) -> list[str]:
    return [f"h{i:05d}" for i in range(n)]


def lab_text(n: int) -> str:
    hosts = "".join(f'\n[[host]]\nid = "{h}"\ngpus = {GPUS}\nheartbeat_s = {INTERVAL_S}\n'
                    f'rack = "r{i // 32:03d}"\n' for i, h in enumerate(host_ids(n)))
    return f'[lab]\nname = "{LAB}"\n{hosts}'


# -- the daemon and the broker ---------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_port(port: int, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_hosts: {what} did not listen on port {port} within "
                                 f"{timeout:.0f} s") from None
            await asyncio.sleep(0.1)


def pinned(cores: str) -> list[str]:
    return ["taskset", "-c", cores] if shutil.which("taskset") and os.cpu_count() else []


def other_cores() -> str:
    count = os.cpu_count() or 1
    return ",".join(str(c) for c in range(1, count)) if count > 1 else "0"


@contextlib.asynccontextmanager
async def broker(folder: Path) -> AsyncIterator[Mosquitto]:
    """A private Mosquitto on a free port (labd.mqtt.private): the lab's broker (1883) is not
    disturbed."""
    mosquitto = Mosquitto(folder, wrapper=pinned(other_cores()),
                          config=["persistence false", "max_queued_messages 100000"])
    try:
        await mosquitto.start()
    except MosquittoError as exc:
        raise SystemExit(f"bench_hosts: {exc}") from None
    try:
        yield mosquitto
    finally:
        await mosquitto.stop()


def spawn(command: list[str], *, env: dict[str, str] | None = None,
          log: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """A process of the run's (the broker, the daemon): started at once, stopped by us."""
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def metrics(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                 "Connection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def lag_p99_ms(before: str, after: str) -> float | None:
    """The upper bound of the bucket the window's 99th percentile of loop lag falls in."""
    name = "labd_event_loop_lag_seconds_bucket"
    a, b = series(before, name), series(after, name)
    buckets = sorted(((float(k.split('le="')[1].split('"')[0]), b[k] - a.get(k, 0.0))
                      for k in b), key=lambda x: x[0])
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= 0.99 * total:
            return bound * 1e3
    return None


async def _sure_again(port: int, living: Callable[[], int], since: float,
                      timeout: float = 60) -> float:
    """Seconds from ``since`` until the daemon's unsure episode (``labd_hosts_unsure``) has
    begun and ended with every living host online (``living()`` of them: some may die
    meanwhile); ``inf`` if not within ``timeout``."""
    began = False
    while time.monotonic() - since < timeout:
        text = await metrics(port)
        unsure = sum(series(text, "labd_hosts_unsure").values())
        online = sum(series(text, 'labd_hosts{status="online"}').values())
        began = began or unsure > 0
        if began and not unsure and online >= living():
            return time.monotonic() - since
        await asyncio.sleep(0.1)
    return float("inf")


async def wait_online(port: int, n: int, timeout: float) -> int:
    """Hosts online once all are, or ``timeout`` s have passed: a daemon that never gets
    there is measured all the same, and the table says how many it had."""
    deadline = time.monotonic() + timeout
    while True:
        online = int(sum(series(await metrics(port), 'labd_hosts{status="online"}').values()))
        if online >= n:
            return online
        if time.monotonic() > deadline:
            print(f"bench_hosts: only {online} of {n} hosts online after {timeout:.0f} s; "
                  "measuring all the same", file=sys.stderr)
            return online
        await asyncio.sleep(0.5)


#: The API's client, a process of its own (a client in this loop would be timed with the
#: fleet's work): GET the whole fleet and the paged form in turn, latencies as JSON at end.
GETTER = """
import http.client, json, sys, time
port, token, every, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
head = {"Authorization": f"Bearer {token}"}
out = {"full": [], "paged": [], "bytes": 0, "errors": 0}
end = time.monotonic() + seconds
turn = 0
while time.monotonic() < end:
    path, key = (("/v1/hosts", "full"), ("/v1/hosts?status=lost&limit=100", "paged"))[turn % 2]
    turn += 1
    start = time.perf_counter()
    try:
        conn.request("GET", path, headers=head)
        response = conn.getresponse()
        body = response.read()
        took = (time.perf_counter() - start) * 1e3
        if response.status == 200:
            out[key].append(took)
            out["bytes"] = max(out["bytes"], len(body)) if key == "full" else out["bytes"]
        else:
            out["errors"] += 1
    except OSError:
        out["errors"] += 1
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    time.sleep(max(0.0, every - (time.perf_counter() - start)))
print(json.dumps(out))
"""


@dataclass
class Point:
    hosts: int
    cpu_pct: float
    lag_p99_ms: float | None
    get_p50_ms: float
    get_p99_ms: float
    paged_p50_ms: float
    paged_p99_ms: float
    get_bytes: int
    false_losses: int
    deaths: int
    deaths_found: int
    deaths_in_time: int
    death_p99_intervals: float | None
    failures: int
    failures_reported: int
    failure_p99_ms: float | None
    unsure: int
    beats: int
    generator_behind_p99_ms: float
    beats_due: int
    """Heartbeats the schedule asked for in the window (a dead host's counted as half)."""
    warnings: int
    burst: bool
    connected_s: float
    """From the first connect to the last host's CONNACK and first report sent."""
    online_s: float
    """From the first connect until the daemon counts every host online."""
    burst_lost: int
    """``host.lost`` events from the first connect to the window's start (target 0)."""
    online: int
    """Hosts the daemon counted online as the window began (all of them, or 120 s up)."""
    sessions: float
    """The bridge's broker sessions by the window's end (1: never remade)."""
    window_s: float = 0.0
    """The window as it ran: ``--seconds``, or longer where a restart held up the plan."""
    restart_online_s: float | None = None
    """With a broker restart: from its stop until the daemon's unsure episode has ended
    with every living host online (inf: not within 60 s; None: no restart)."""

    @property
    def kept_schedule(self) -> bool:
        """Whether the load generator kept its schedule: its heartbeats late by at most
        :data:`BEHIND_MS` at p99, and none of those due short by more than 2 % (more is
        a generator catching up on what it owed before the window)."""
        return self.generator_behind_p99_ms <= BEHIND_MS and \
            self.beats >= 0.98 * self.beats_due

    def figures(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.__dict__.items() if v is not None},
                "kept_schedule": float(self.kept_schedule)}


async def point(n: int, seconds: float, deaths: int, failures: int,
                profile: Path | None, burst: bool = False, restart: bool = False) -> Point:
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as scratch:
        folder = Path(scratch)
        lab = folder / "lab.toml"
        lab.write_text(lab_text(n), encoding="utf-8")
        keys = {h: new_key() for h in host_ids(n)}
        creds = folder / "daemon.toml"
        Credentials(hosts=keys).write(creds)
        async with broker(folder) as mosquitto:
            mqtt_port = mosquitto.port
            url = f"mqtt://127.0.0.1:{mqtt_port}"
            api_port = free_port()
            command = [sys.executable, "-m", "labd", "run", str(lab), "--db",
                       str(folder / "labd.sqlite"), "--port", str(api_port), "--mqtt", url,
                       "--mqtt-credentials", str(creds), "--instance", INSTANCE]
            command = [*pinned("0"), *command]
            if profile is not None:  # py-spy itself keeps off the daemon's core
                spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                command = [spy, "record", "-r", "200", "-f", "raw", "-o", f"{profile}.{n}",
                           "--", *command]
            env = {**os.environ, "LABD_TOKEN": TOKEN}
            log = (folder / "daemon.log").open("wb")
            daemon = spawn(command, env=env, log=log)
            try:
                await wait_port(api_port, "the daemon", 120)
                pid = daemon_pid(daemon.pid)
                return await measure(n, seconds, deaths, failures, mosquitto, api_port, pid,
                                     BusSettings(url, INSTANCE).with_keys(hosts=keys), burst,
                                     restart)
            finally:
                daemon.send_signal(2)
                try:
                    daemon.wait(60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
                log.close()
                if daemon.returncode not in (0, -2, 130) or os.environ.get("BENCH_HOSTS_LOG"):
                    print((folder / "daemon.log").read_text(errors="replace")[-3000:],
                          file=sys.stderr)


def daemon_pid(pid: int) -> int:
    """The daemon's own process: under py-spy, its child (taskset execs in place)."""
    if b"py-spy" in Path(f"/proc/{pid}/cmdline").read_bytes():
        deadline = time.monotonic() + 30
        while not (kids := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
            if time.monotonic() > deadline:
                raise SystemExit("bench_hosts: py-spy started no daemon")
            time.sleep(0.05)
        return int(kids[0])
    return pid


async def measure(n: int, seconds: float, deaths: int, failures: int, mosquitto: Mosquitto,
                  api_port: int, pid: int, bus: BusSettings, burst: bool,
                  restart: bool) -> Point:
    mqtt_port = mosquitto.port
    hosts = make_fleet(n, bus.credentials.hosts, bus)
    root = lab_root(LAB, INSTANCE)
    events: list[dict[str, Any]] = []
    listening = asyncio.Event()

    async def listen() -> None:
        while True:  # back on the broker after a restart (what it said meanwhile is lost)
            try:
                async with aiomqtt.Client("127.0.0.1", mqtt_port) as client:
                    for kind in ("host.lost", "host.status", "hosts.unsure", "gpu.health",
                                 "warning"):
                        await client.subscribe(f"{root}/events/{kind}")
                    listening.set()
                    async for message in client.messages:
                        body = message.payload
                        if isinstance(body, bytes):
                            events.append(json.loads(body))
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)

    listener = asyncio.create_task(listen())
    await listening.wait()
    started = time.monotonic()
    # Each host's heartbeats start with its first report, as the agent's do: a ramp of
    # hosts that said nothing until the last had connected would be found lost by then.
    fleet = Fleet(hosts)
    player = asyncio.create_task(fleet.play())
    if burst:
        # Every host at once, as after a broker restart: the daemon rides it through.
        await asyncio.gather(*(host.connect(mqtt_port) for host in hosts))
    else:
        # Hosts come up over RAMP_S, each with its first report (every GPU's verdict).
        per = RAMP_S / n
        for i, host in enumerate(hosts):
            await host.connect(mqtt_port)
            ahead = started + (i + 1) * per - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
    connected_s = time.monotonic() - started
    try:
        online = await wait_online(api_port, n, 120)
        online_s = time.monotonic() - started
        await asyncio.sleep(SETTLE_S)
        burst_lost = sum(e.get("kind") == "host.lost" for e in events)
        events.clear()
        getter = await asyncio.create_subprocess_exec(
            *pinned(other_cores()), sys.executable, "-c", GETTER, str(api_port), TOKEN,
            str(GET_EVERY_S), str(seconds), stdout=asyncio.subprocess.PIPE)
        fleet.beats = 0
        fleet.behind_ms.clear()
        before, cpu_before, wall_before = await metrics(api_port), cpu_seconds(pid), \
            time.monotonic()
        # Injections spread over the window, the last leaving time to be found.
        victims = random.Random(n).sample(hosts, deaths + failures)
        dying, failing = victims[:deaths], victims[deaths:]
        plan = sorted(
            [(seconds * 0.1 + (seconds * 0.7) * k / max(1, deaths), "die", h)
             for k, h in enumerate(dying)]
            + [(seconds * 0.15 + (seconds * 0.7) * k / max(1, failures), "fail", h)
               for k, h in enumerate(failing)], key=lambda x: x[0])
        killed: dict[str, int] = {}
        failed: dict[str, int] = {}
        if restart:
            plan = sorted([*plan, (seconds * 0.5, "restart", hosts[0])], key=lambda x: x[0])
        back: asyncio.Task[float] | None = None
        for at, what, host in plan:
            wait = wall_before + at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if what == "restart":
                # The broker stops (SIGTERM: it says goodbye) and starts again on its port;
                # every living host reconnects at once, as agents do.
                restarted = time.monotonic()
                await mosquitto.stop()
                await mosquitto.start()
                alive = [h for h in hosts if h.id not in killed]
                await asyncio.gather(*(h.connect(mqtt_port) for h in alive))
                back = asyncio.create_task(_sure_again(
                    api_port, lambda: len(hosts) - len(killed), restarted))
            elif what == "fail":
                host.backend.fail(3, "ecc")
                failed[host.id] = await host.report()
            elif len(killed) % 2:
                host.cut()
                killed[host.id] = host.last_sent_ns  # timed from its last heartbeat
            else:
                host.silent = True
                killed[host.id] = host.last_sent_ns
        await asyncio.sleep(max(0.0, wall_before + seconds - time.monotonic()))
        after, cpu_after, wall_after = await metrics(api_port), cpu_seconds(pid), \
            time.monotonic()
        restart_online_s = await back if back is not None else None
        beats = fleet.beats  # the window's (the fleet goes on until the client is done)
        out, _ = await getter.communicate()
        got = json.loads(out)
    finally:
        fleet.stop.set()
        await player
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        for host in hosts:
            if host.wire is not None and host.wire.transport is not None:
                host.wire.transport.close()
    lost = [e for e in events if e.get("kind") == "host.lost"]
    false = [e for e in lost if e["data"]["host"] not in killed]
    found: dict[str, int] = {}
    for e in lost:
        found.setdefault(e["data"]["host"], e["at_ns"])
    delays = [(found[h] - at) / 1e9 / INTERVAL_S for h, at in killed.items() if h in found]
    reported = {}
    for e in events:
        data = e.get("data", {})
        if e.get("kind") == "gpu.health" and data.get("health") == "failed":
            reported.setdefault(data["host"], e["at_ns"])
    failure_ms = [(reported[h] - at) / 1e6 for h, at in failed.items() if h in reported]
    full, paged = got["full"] or [float("nan")], got["paged"] or [float("nan")]
    return Point(
        hosts=n, cpu_pct=100 * (cpu_after - cpu_before) / (wall_after - wall_before),
        lag_p99_ms=lag_p99_ms(before, after),
        get_p50_ms=percentile(full, 50), get_p99_ms=percentile(full, 99),
        paged_p50_ms=percentile(paged, 50), paged_p99_ms=percentile(paged, 99),
        get_bytes=got["bytes"], false_losses=len(false), deaths=len(killed),
        deaths_found=len(delays), deaths_in_time=sum(d <= IN_TIME for d in delays),
        death_p99_intervals=percentile(delays, 99) if delays else None,
        failures=len(failed), failures_reported=len(failure_ms),
        failure_p99_ms=percentile(failure_ms, 99) if failure_ms else None,
        unsure=sum(e.get("kind") == "hosts.unsure" for e in events), beats=beats,
        generator_behind_p99_ms=percentile(fleet.behind_ms or [0.0], 99),
        # Over the window as it ran (a broker restart can stretch it past ``seconds``).
        beats_due=int(sum(1.0 if h.id not in killed else 0.5 for h in hosts)
                      * (wall_after - wall_before) / INTERVAL_S),
        warnings=sum(e.get("kind") == "warning" for e in events), burst=burst,
        connected_s=connected_s, online_s=online_s, burst_lost=burst_lost, online=online,
        restart_online_s=restart_online_s, window_s=wall_after - wall_before,
        sessions=sum(series(after, "labd_mqtt_sessions_total").values()))


def show(points: list[Point], seconds: float) -> None:
    print(f"GPU hosts ({GPUS} GPUs each, {INTERVAL_S:g} s heartbeats) on one daemon pinned to "
          f"core 0, {seconds:g} s per size:")
    head = (f"{'hosts':>6}{'CPU':>7}{'lag p99':>9}{'GET p50/p99':>16}{'paged p50/p99':>16}"
            f"{'false':>7}{'deaths found':>14}{'p99':>7}{'failures':>10}{'p99':>8}{'unsure':>8}")
    print(head)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"

    for p in points:
        print(f"{p.hosts:>6,}{p.cpu_pct:>6.0f}%{ms(p.lag_p99_ms):>6} ms"
              f"{ms(p.get_p50_ms):>9}/{ms(p.get_p99_ms):<6}"
              f"{ms(p.paged_p50_ms):>9}/{ms(p.paged_p99_ms):<6}"
              f"{p.false_losses:>7}{p.deaths_in_time:>7}/{p.deaths:<2} in 1.5"
              f"{'-' if p.death_p99_intervals is None else f'{p.death_p99_intervals:.2f}':>7}"
              f"{p.failures_reported:>7}/{p.failures:<2}{ms(p.failure_p99_ms):>6}ms"
              f"{p.unsure:>8}")
    print("   CPU: the daemon's, of one core; lag: event loop, p99 bucket; GET: /v1/hosts, "
          "whole fleet (ms); paged: ?status=lost&limit=100 (ms); false: host.lost for hosts "
          "that never stopped (target 0); deaths: host.lost within 1.5 intervals + 10 ms of "
          "the last heartbeat / deaths, and the p99 in intervals; failures: gpu.health "
          "failed reported / injected, p99 ms; unsure: hosts.unsure events")
    for p in points:
        print(f"   {p.hosts:,} hosts: {p.beats:,} heartbeats in the window ({p.window_s:.0f} s), "
              "generator behind "
              f"p99 {p.generator_behind_p99_ms:.1f} ms ({p.beats_due:,} due; kept its "
              f"schedule: {'yes' if p.kept_schedule else 'NO'}), /v1/hosts "
              f"{p.get_bytes / 1024:,.0f} KiB, {p.warnings} warning events")
        print(f"   {p.hosts:,} hosts {'connecting all at once' if p.burst else 'ramped over'}"
              f"{'' if p.burst else f' {RAMP_S:g} s'}: connected in {p.connected_s:.1f} s, "
              f"{'all' if p.online == p.hosts else f'only {p.online:,}'} online in "
              f"{p.online_s:.1f} s, {p.burst_lost} host.lost before the window; "
              f"{p.sessions:.0f} broker session(s) by its end")
        if p.restart_online_s is not None:
            print(f"   {p.hosts:,} hosts, the broker restarted mid-window: sure of every "
                  f"living host again {p.restart_online_s:.1f} s after its stop (deaths "
                  "within the unsure episode are judged from its end, so later)")


def emulated_lab_text(n: int) -> str:
    """N hosts whose NICs each reach an ingress and leave an egress of an emulated switch."""
    side = 384
    parts = [f'[lab]\nname = "{LAB}-emulated"\n']
    for k in range((n + side - 1) // side):
        parts.append(f'[[instrument]]\nid = "ocs{k}"\ndriver = "polatis-scpi"\n'
                     f'emulate = true\nsize = "{side}x{side}"\n')
    for i, h in enumerate(host_ids(n)):
        k, j = divmod(i, side)
        parts.append(f'[[endpoint]]\nid = "{h}.nic0"\nlaunch_dbm = 0.0\n'
                     f'[[fiber]]\nfrom = "{h}.nic0"\nto = "ocs{k}:{j + 1}"\n'
                     f'[[fiber]]\nfrom = "ocs{k}:{side + j + 1}"\nto = "{h}.nic0"\n'
                     f'[[host]]\nid = "{h}"\nemulate = true\ngpus = {GPUS}\n'
                     f'heartbeat_s = {INTERVAL_S}\nnics = ["{h}.nic0"]\n')
    return "".join(parts)


@dataclass
class EmulatePoint:
    hosts: int
    beats_per_s: float
    heard: int
    cpu_pct: float
    stop_s: float

    def figures(self) -> dict[str, float]:
        return {"emulate_beats_per_s": self.beats_per_s, "emulate_heard": self.heard,
                "emulate_cpu_pct": self.cpu_pct, "emulate_stop_s": self.stop_s}


async def emulate_point(n: int, seconds: float) -> EmulatePoint:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        lab = folder / "lab.toml"
        lab.write_text(emulated_lab_text(n), encoding="utf-8")
        async with broker(folder) as mosquitto:
            port = mosquitto.port
            process = await asyncio.create_subprocess_exec(
                *pinned("0"), sys.executable, "-m", "labd", "emulate", str(lab), "--mqtt",
                f"mqtt://127.0.0.1:{port}", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL)
            assert process.stdout is not None
            try:
                async with asyncio.timeout(120):
                    while b'"ready"' not in await process.stdout.readline():
                        if process.returncode is not None:
                            raise SystemExit(f"bench_hosts: labd emulate ended "
                                             f"({process.returncode}) before it was ready")
                pid = daemon_pid(process.pid)
                heard: dict[str, int] = {}
                async with aiomqtt.Client("127.0.0.1", port) as client:
                    await client.subscribe(f"labd/{LAB}-emulated/hosts/+/heartbeat")

                    async def count() -> None:
                        async for message in client.messages:
                            topic = str(message.topic)
                            heard[topic] = heard.get(topic, 0) + 1

                    counter = asyncio.create_task(count())
                    await asyncio.sleep(RAMP_S + SETTLE_S)  # connected, first burst over
                    heard.clear()
                    cpu, start = cpu_seconds(pid), time.monotonic()
                    await asyncio.sleep(seconds)
                    took = time.monotonic() - start
                    used = cpu_seconds(pid) - cpu
                    counter.cancel()
                stopping = time.monotonic()
                process.terminate()
                await asyncio.wait_for(process.wait(), 60)
                return EmulatePoint(n, sum(heard.values()) / took, len(heard),
                                    100 * used / took, time.monotonic() - stopping)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def main_emulate(sizes: list[int], seconds: float) -> dict[str, float]:
    points = [await emulate_point(n, seconds) for n in sizes]
    print(f"GPU hosts played by labd emulate ({GPUS} GPUs each, {INTERVAL_S:g} s heartbeats, "
          f"NICs through emulated switches) pinned to core 0, {seconds:g} s per size:")
    print(f"{'hosts':>6}{'heartbeats/s':>14}{'heard':>8}{'CPU':>7}{'stop':>8}")
    for p in points:
        print(f"{p.hosts:>6,}{p.beats_per_s:>14,.0f}{p.heard:>8,}{p.cpu_pct:>6.0f}%"
              f"{p.stop_s:>7.1f}s")
    print("   heartbeats/s: those that reached the broker (target: one per host); heard: "
          "hosts with at least one; CPU: labd emulate's, of one core; stop: SIGTERM to exit")
    figures: dict[str, float] = {"seconds": seconds, "interval_s": INTERVAL_S}
    for p in points:
        figures |= {f"hosts{p.hosts}_{k}": v for k, v in p.figures().items()}
    return figures


# -- the host feed alone: labd.hosts.feed against aiomqtt --------------------------------------

#: What the feed comparison reads: one heartbeat-sized message per host per interval.
FEED_PAYLOAD = 700
FEED_CONNECTIONS = 64

FEED_READER = """
import asyncio, json, sys, time
import aiomqtt
from labd.hosts.feed import HostFeed
from labd.mqtt.credentials import BusSettings

kind, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
got = {"messages": 0, "batches": 0}

def deliver(batch):
    got["messages"] += len(batch)
    got["batches"] += 1

async def measure(ready):
    print(json.dumps({"ready": True}), flush=True)
    await ready
    start, cpu = time.monotonic(), time.process_time()
    before = got["messages"]
    await asyncio.sleep(seconds)
    took, used = time.monotonic() - start, time.process_time() - cpu
    return {"kind": kind, "messages": got["messages"] - before, "seconds": took,
            "cpu_s": used, "batches": got["batches"]}

async def main():
    topic = "bench/hosts/+/heartbeat"
    loop = asyncio.get_running_loop()
    ready = loop.run_in_executor(None, sys.stdin.readline)
    if kind == "feed":
        feed = HostFeed(BusSettings(f"mqtt://127.0.0.1:{port}"), [topic], deliver)
        async with feed.connected() as protocol:
            keep = asyncio.create_task(HostFeed.keep(protocol))
            out = await measure(ready)
            keep.cancel()
    else:
        async with aiomqtt.Client("127.0.0.1", port) as client:
            await client.subscribe(topic, qos=0)

            async def read():
                # The batched reader: the first message awaited, the rest already queued
                # taken at once, handed over as one batch.
                queue = client._queue
                async for message in client.messages:
                    batch = [(str(message.topic), message.payload, message.retain)]
                    while not queue.empty():
                        m = queue.get_nowait()
                        batch.append((str(m.topic), m.payload, m.retain))
                    deliver(batch)

            reader = asyncio.create_task(read())
            out = await measure(ready)
            reader.cancel()
    print(json.dumps(out), flush=True)

asyncio.run(main())
"""


async def feed_point(kind: str, n: int, seconds: float, port: int) -> dict[str, float]:
    """One reader (``feed``: labd.hosts.feed; ``aiomqtt``: aiomqtt with a batched reader)
    pinned to core 0, fed ``n`` heartbeat-sized messages a second from FEED_CONNECTIONS
    connections: its CPU per message."""
    reader = await asyncio.create_subprocess_exec(
        *pinned("0"), sys.executable, "-c", FEED_READER, kind, str(port), str(n),
        str(seconds), cwd=ROOT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert reader.stdout is not None and reader.stdin is not None
    await reader.stdout.readline()  # subscribed
    loop = asyncio.get_running_loop()
    wires = []
    for _ in range(FEED_CONNECTIONS):
        _, wire = await loop.create_connection(_Wire, "127.0.0.1", port)
        assert wire.transport is not None
        body = _text("MQTT") + bytes([4, 2]) + struct.pack("!H", KEEPALIVE_S) + _text("")
        wire.transport.write(b"\x10" + _length(len(body)) + body)  # clean, no id
        async with asyncio.timeout(30):
            await wire.acked.wait()
        wires.append(wire)
    packets = [publish_packet(f"bench/hosts/h{i:05d}/heartbeat", b"x" * FEED_PAYLOAD)
               for i in range(n)]
    stop = asyncio.Event()

    async def publish() -> None:
        # Each host's message once a second, host i at i/n of it, in slices of 1 ms.
        start, i = time.monotonic(), 0
        while not stop.is_set():
            due = start + i / n
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            while start + i / n <= time.monotonic():
                wire = wires[i % FEED_CONNECTIONS]
                assert wire.transport is not None
                wire.transport.write(packets[i % n])
                i += 1

    publisher = asyncio.create_task(publish())
    await asyncio.sleep(2.0)  # connected and flowing before the window
    reader.stdin.write(b"go\n")
    await reader.stdin.drain()
    out = json.loads((await reader.stdout.readline()).decode())
    stop.set()
    await publisher
    for wire in wires:
        assert wire.transport is not None
        wire.transport.close()
    await reader.wait()
    per = out["cpu_s"] / max(1, out["messages"])
    return {"messages_per_s": out["messages"] / out["seconds"], "us_per_message": per * 1e6,
            "cpu_pct": 100 * out["cpu_s"] / out["seconds"],
            "per_batch": out["messages"] / max(1, out["batches"])}


async def main_feeds(sizes: list[int], seconds: float) -> dict[str, float]:
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {int(c) for c in other_cores().split(",")})
    figures: dict[str, float] = {"seconds": seconds}
    print(f"The host feed alone, pinned to core 0: N heartbeat-sized ({FEED_PAYLOAD} B) "
          f"messages a second from {FEED_CONNECTIONS} connections, {seconds:g} s each, "
          "the two readers in turn (twice):")
    print(f"{'hosts':>6}{'reader':>10}{'msgs/s':>10}{'µs/msg':>9}{'CPU':>7}{'per batch':>11}")
    with tempfile.TemporaryDirectory(prefix="bench-feeds-") as scratch:
        async with broker(Path(scratch)) as mosquitto:
            port = mosquitto.port
            for n in sizes:
                for kind in ("feed", "aiomqtt", "feed", "aiomqtt"):
                    got = await feed_point(kind, n, seconds, port)
                    print(f"{n:>6,}{kind:>10}{got['messages_per_s']:>10,.0f}"
                          f"{got['us_per_message']:>9.1f}{got['cpu_pct']:>6.0f}%"
                          f"{got['per_batch']:>11.1f}")
                    for k, v in got.items():
                        key = f"hosts{n}_{kind}_{k}"
                        figures[key] = min(figures.get(key, v), v) if k == "cpu_pct" else v
    print("   reader: feed = labd.hosts.feed (the daemon's); aiomqtt = aiomqtt 2 (paho) with "
          "a batched reader (the first message awaited, the queued rest taken at once); "
          "µs/msg and CPU: the reader process's CPU time over the window")
    return figures


async def main(sizes: list[int], seconds: float, deaths: int, failures: int,
               profile: Path | None, burst: bool = False, restart: bool = False
               ) -> dict[str, float]:
    if len(os.sched_getaffinity(0)) > 1:
        # The fleet keeps off the daemon's core.
        os.sched_setaffinity(0, {int(c) for c in other_cores().split(",")})
    points = []
    for n in sizes:
        points.append(await point(n, seconds, deaths, failures, profile, burst, restart))
    show(points, seconds)
    figures: dict[str, float] = {"seconds": seconds, "interval_s": INTERVAL_S}
    for p in points:
        figures |= {f"hosts{p.hosts}_{k}": v for k, v in p.figures().items() if k != "hosts"}
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1024,2048,4096",
                        help="sizes, comma-separated (default 1024,2048,4096)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the measured window per size (default 60)")
    parser.add_argument("--deaths", type=int, default=8,
                        help="hosts that die in the window, half silent, half by last will")
    parser.add_argument("--failures", type=int, default=8,
                        help="GPUs that turn failed in the window (one per host)")
    parser.add_argument("--py-spy", type=Path, metavar="FILE", dest="profile",
                        help="record the daemon with py-spy into FILE.<hosts> (raw)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures to FILE as a flat JSON object")
    parser.add_argument("--burst", action="store_true",
                        help="connect every host at once (as after a broker restart) "
                             f"instead of over {RAMP_S:g} s")
    parser.add_argument("--broker-restart", action="store_true",
                        help="restart the broker mid-window; every living host reconnects "
                             "at once")
    parser.add_argument("--feeds", action="store_true",
                        help="measure the host feed alone: labd.hosts.feed against aiomqtt "
                             "with a batched reader (no daemon)")
    parser.add_argument("--emulate", action="store_true",
                        help="measure labd emulate playing the hosts instead (no daemon)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.hosts.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"bench_hosts: --hosts {args.hosts!r}: expected numbers, "
                         "comma-separated") from None
    if not sizes or min(sizes) < 2 or args.seconds <= 0:
        raise SystemExit("bench_hosts: give at least 2 hosts per size and --seconds above 0")
    if args.deaths + args.failures > min(sizes):
        raise SystemExit("bench_hosts: more deaths and failures than hosts")
    # The standard loop: the fleet is many small writes, the same on either.
    figures = asyncio.run(main_feeds(sizes, args.seconds) if args.feeds else
                          main_emulate(sizes, args.seconds) if args.emulate else
                          main(sizes, args.seconds, args.deaths, args.failures, args.profile,
                               args.burst, args.broker_restart))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
