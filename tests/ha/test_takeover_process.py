"""Two ``labd run --ha`` processes on one lab, one Mosquitto, one PostgreSQL, the lab's
instruments and GPU hosts emulated in a ``labd emulate`` process of their own (as hardware
would be):

- the leader is killed (SIGKILL) just after a GPU of a running job failed: the standby
  leads within the lease's TTL and a second, the intended state is intact on the switch, the
  failover is carried out (or reported), and no host is declared lost;
- that leader is then paused (SIGSTOP) past its TTL while a restarted daemon stands by: the
  standby takes over; resumed (SIGCONT), the paused one refuses the change it was sent
  meanwhile, steps down and exits with an error, and its late write changed nothing; what
  it logged through the takeover and the step-down holds no traceback and no ERROR line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from labd import deadlines
from labd.emulation.rig import clear_retained
from labd.mqtt.credentials import Credentials
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import new_instance
from tests import labs
from tests.broker import MQTT, require_broker
from tests.databases import postgres_database

TOKEN = "ha-process"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RENEW_S, TTL_S = 0.2, 1.0


async def start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "LABD_TOKEN": TOKEN})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def role(url: str) -> str | None:
    """The daemon's role (leader, standby, taking-over), or None while it does not answer."""
    try:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=1) as http:
            answer = (await http.get("/v1/health")).json()
    except (httpx.TransportError, ValueError):
        return None
    found: str | None = answer["ha"]["role"]
    return found


async def until_role(url: str, wanted: str, within_s: float) -> float:
    """Wait (polling: another process has no event to wait on) until the daemon at ``url``
    says it is ``wanted``; the seconds that took."""
    began = time.monotonic()
    async with asyncio.timeout(deadlines.current().times(within_s)):
        while True:
            if await role(url) == wanted:
                return time.monotonic() - began
            await asyncio.sleep(0.02)


class Daemons:
    def __init__(self, lab: Path, db: str, keys: Path, instance: str) -> None:
        self.lab, self.db, self.keys, self.instance = lab, db, keys, instance
        self.running: list[asyncio.subprocess.Process] = []

    async def start(self, port: int) -> asyncio.subprocess.Process:
        process = await start("run", str(self.lab), "--ha", self.db, "--port", str(port),
                              "--mqtt", MQTT, "--mqtt-credentials", str(self.keys),
                              "--instance", self.instance, "--lease-renew", str(RENEW_S),
                              "--lease-ttl", str(TTL_S))
        self.running.append(process)
        return process

    async def close(self) -> None:
        for process in self.running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.kill()
            await process.wait()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Daemons, str, str]]:
    require_broker()
    name, lab_file = labs.write_lab(tmp_path, "ha", labs.ring_lab())
    keys = tmp_path / "keys.toml"
    Credentials(hosts={h: new_key() for h, _ in labs.HOSTS}).write(keys)
    instance = new_instance()
    resolved = tmp_path / "resolved.toml"
    emulator = await start("emulate", str(lab_file), "--resolved", str(resolved),
                           "--mqtt", MQTT, "--mqtt-credentials", str(keys),
                           "--instance", instance)
    assert emulator.stdout is not None
    try:
        while True:
            line = json.loads(await asyncio.wait_for(emulator.stdout.readline(), 30))
            if line.get("ready"):
                control = line["control"]
                break
        with postgres_database() as db:
            daemons = Daemons(resolved, db, keys, instance)
            try:
                yield daemons, control, name
            finally:
                await daemons.close()
    finally:
        emulator.terminate()
        await emulator.wait()
        from labd.mqtt.credentials import BusSettings
        await clear_retained(BusSettings.load(MQTT, keys, instance), name,
                             [h for h, _ in labs.HOSTS])


async def collect(url: str, into: list[dict[str, Any]], ready: asyncio.Event) -> None:
    """Every event of the daemon at ``url`` (until cancelled or it goes)."""
    with contextlib.suppress(websockets.ConnectionClosed, OSError):
        async with websockets.connect(url.replace("http", "ws") + "/v1/events",
                                      additional_headers=AUTH) as ws:
            ready.set()
            async for raw in ws:
                into.append(json.loads(raw))


async def switch_map(control: str) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=control) as ctl:
        state = (await ctl.get("/v1/emulators/ocs1")).json()
    found: list[list[int]] = state["state"]["connections"]
    return found


async def test_kill_then_pause_the_leader(rig: tuple[Daemons, str, str]) -> None:
    daemons, control, _ = rig
    a_url, b_url = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    a = await daemons.start(int(a_url.rsplit(":", 1)[1]))
    await until_role(a_url, "leader", 30)
    b = await daemons.start(int(b_url.rsplit(":", 1)[1]))
    await until_role(b_url, "standby", 30)
    events: list[dict[str, Any]] = []
    listening = asyncio.Event()
    follow = asyncio.create_task(collect(b_url, events, listening))
    try:
        await asyncio.wait_for(listening.wait(), deadlines.current().times(10))
        async with httpx.AsyncClient(base_url=a_url, headers=AUTH, timeout=30) as http:
            # Every host heard by the leader before the job starts.
            async with asyncio.timeout(deadlines.current().times(30)):
                while True:
                    if all(h["status"] == "online" for h in (await http.get("/v1/hosts")).json()):
                        break
                    await asyncio.sleep(0.05)
            started = await http.post("/v1/jobs/ring4/start", json={})
            assert started.status_code == 200, started.text
            intended = (await http.get("/v1/switches/ocs1")).json()["intended"]
        assert intended, "the job's circuits are intended"
        # The drill: h0's GPU fails, and the leader dies as it hears of it.
        async with httpx.AsyncClient(base_url=control) as ctl:
            failed = await ctl.post("/v1/hosts/h0/fail", json={"gpu": 0, "signal": "xid79"})
            assert failed.status_code == 200, failed.text
        a.kill()
        await a.wait()
        took = await until_role(b_url, "leader", TTL_S + 1)
        print(f"standby led {took * 1000:.0f} ms after the leader was killed "
              f"(TTL {TTL_S:g} s)")
        async with httpx.AsyncClient(base_url=b_url, headers=AUTH, timeout=30) as http:
            # The failover: carried out by whichever daemon got to it, and recorded.
            async with asyncio.timeout(deadlines.current().times(30)):
                while True:
                    timelines = [t for t in (await http.get("/v1/failovers")).json()
                                 if t["member"] == "h0.nic0"]
                    if timelines and timelines[-1]["outcome"] != "in-progress":
                        break
                    await asyncio.sleep(0.05)
            assert timelines[-1]["outcome"] == "recovered", timelines[-1]
            job = (await http.get("/v1/jobs/ring4")).json()
            assert "h0.nic0" not in job["members"] and job["status"] == "running"
            after = (await http.get("/v1/switches/ocs1")).json()["intended"]
            # Intact: what the store intends is what the switch holds.
            assert sorted(map(tuple, after)) == sorted(map(tuple, await switch_map(control)))
            hosts = (await http.get("/v1/hosts")).json()
        assert [e for e in events if e["kind"] == "host.lost"] == []
        assert all(h["status"] == "online" for h in hosts), hosts
        assert [e["data"]["epoch"] for e in events if e["kind"] == "ha.leading"] == [2]

        # A new standby, then the leader paused past its TTL.
        c_url = f"http://127.0.0.1:{free_port()}"
        await daemons.start(int(c_url.rsplit(":", 1)[1]))
        await until_role(c_url, "standby", 30)
        b.send_signal(signal.SIGSTOP)
        await until_role(c_url, "leader", TTL_S + 1)
        before = await switch_map(control)
        free = next(p for p in range(1, 17) if all(p != pair[0] for pair in before))
        # Sent while it sleeps (the kernel takes the connection and the bytes): the paused
        # daemon reads the request as it wakes.
        reader, writer = await asyncio.open_connection("127.0.0.1", int(b_url.rsplit(":", 1)[1]))
        body = json.dumps({"pairs": [[free, 32]], "verify_light": False}).encode()
        writer.write(b"POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: b\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        b.send_signal(signal.SIGCONT)
        answer = await asyncio.wait_for(reader.read(), deadlines.current().times(10))
        writer.close()
        # Refused (503), or never answered as the daemon stepped down first: never done.
        assert not answer.startswith(b"HTTP/1.1 200"), answer
        out, err = await asyncio.wait_for(b.communicate(), deadlines.current().times(10))
        said = (out + err).decode()
        assert b.returncode != 0 and "lost the lead" in said, said
        # It took over and stepped down: each a line of its own, never a traceback, and
        # its late writes refused by the fence as warnings (the fence working).
        assert "Traceback" not in said and " ERROR " not in said, said
        assert said.count("this daemon leads") == 1, said
        assert await switch_map(control) == before
        async with httpx.AsyncClient(base_url=c_url, headers=AUTH) as http:
            assert [free, 32] not in (await http.get("/v1/switches/ocs1")).json()["intended"]
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
