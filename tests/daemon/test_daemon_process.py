"""The daemon as a real process: killed with SIGKILL in the middle of a stream of
reconfigurations, then restarted; nothing acknowledged is lost and the intended state comes
back. The emulators run in their own process (labd emulate), as in hardware-in-the-loop CI."""

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiomqtt
import httpx
import sqlalchemy
import websockets

from tests import labs
from tests.broker import BROKER, MQTT, require_broker

TOKEN = "kill-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def start(*args: str) -> asyncio.subprocess.Process:
    """``labd ARGS``, its token from the environment (never argv)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "LABD_TOKEN": TOKEN})


async def wait_http(url: str) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for _ in range(200):
            try:
                if (await http.get(url + "/v1/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)  # polling a starting process: there is no event to wait on
    raise AssertionError(f"{url} never came up")


async def test_sigkill_loses_no_acknowledged_reconfiguration(tmp_path: Path) -> None:
    _, lab_file = labs.write_lab(tmp_path, "killme",
                                 labs.switch(size="16x16", switch_ms=3, jitter_ms=0.5))
    resolved = tmp_path / "resolved.toml"
    emulator = await start("emulate", str(lab_file), "--resolved", str(resolved))
    assert emulator.stdout is not None
    while True:
        line = json.loads(await asyncio.wait_for(emulator.stdout.readline(), 30))
        if line.get("ready"):
            control = line["control"]
            break
    db = tmp_path / "store.sqlite"
    with socket.socket() as probe:  # a free port for the daemon (and its restart)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    args = ("run", str(resolved), "--db", str(db), "--port", str(port))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    daemon = await start(*args)
    acknowledged: list[int] = []
    twenty_done = asyncio.Event()
    try:
        await wait_http(url)
        async with httpx.AsyncClient(base_url=url, headers=auth) as http:
            async def stream() -> None:
                for i in range(200):
                    a, b = i % 16 + 1, (i * 7) % 16 + 17
                    try:
                        r = await http.put("/v1/switches/ocs1/connections",
                                           json={"pairs": [[a, b]], "verify_light": False})
                    except httpx.TransportError:
                        return
                    assert r.status_code == 200, r.text
                    acknowledged.append(i)
                    if len(acknowledged) == 20:
                        twenty_done.set()

            streaming = asyncio.create_task(stream())
            await asyncio.wait_for(twenty_done.wait(), 60)  # kill it well into the stream
            daemon.send_signal(signal.SIGKILL)
            await daemon.wait()
            await streaming
        assert 20 <= len(acknowledged) < 200
        engine = sqlalchemy.create_engine(f"sqlite:///{db}")
        with engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(
                "select count(*) from reconfigurations")).scalar_one()
            intended = dict(connection.execute(sqlalchemy.text(
                "select a, b from intended_pairs where switch = 'ocs1'")).all())
        engine.dispose()
        # Every acknowledged request is there (one more may have committed unanswered).
        assert len(acknowledged) <= rows <= len(acknowledged) + 1
        assert len(intended) == 1
        async with httpx.AsyncClient() as http:
            # The switch loses its circuits while the daemon is down ...
            await http.post(f"{control}/v1/emulators/ocs1/reset")
            restarted = await start(*args)
            try:
                await wait_http(url)
                state = (await http.get(f"{url}/v1/switches/ocs1", headers=auth)).json()
                truth = (await http.get(f"{control}/v1/emulators/ocs1/truth")).json()
            finally:
                restarted.send_signal(signal.SIGINT)
                await asyncio.wait_for(restarted.wait(), 15)
        # ... and the restart puts them back.
        assert state["intended"] == [[a, b] for a, b in sorted(intended.items())]
        assert truth["state"]["connections"] == state["intended"]
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
        emulator.send_signal(signal.SIGINT)
        await asyncio.wait_for(emulator.wait(), 15)


async def test_emulate_and_run_as_processes_with_mqtt_and_websocket(tmp_path: Path) -> None:
    """The HIL-CI shape: labd emulate (TCP and a pty), labd run on the resolved lab with
    Mosquitto and SQLite; API requests reach the emulators; the record agrees with the
    ground truth; events arrive on the WebSocket and on MQTT."""
    require_broker()
    name, lab_file = labs.write_lab(tmp_path, "hil", labs.switch(switch_ms=5, jitter_ms=1),
                                    labs.instrument("mesh1", "qontrol-mesh", size="4x4"))
    resolved = tmp_path / "resolved.toml"
    emulator = await start("emulate", str(lab_file), "--resolved", str(resolved))
    assert emulator.stdout is not None
    endpoints = {}
    while True:
        line = json.loads(await asyncio.wait_for(emulator.stdout.readline(), 30))
        if line.get("ready"):
            control = line["control"]
            break
        endpoints[line["id"]] = line["endpoint"]
    assert endpoints["mesh1"].startswith("serial:///dev/pts/")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    daemon = await start("run", str(resolved), "--db", str(tmp_path / "store.sqlite"),
                         "--port", str(port), "--mqtt", MQTT)
    try:
        await wait_http(url)
        async with aiomqtt.Client(*BROKER) as mqtt:
            await mqtt.subscribe(f"labd/{name}/events/reconfiguration")
            async with websockets.connect(url.replace("http", "ws") + "/v1/events",
                                          additional_headers=AUTH) as ws:
                snapshot = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert snapshot["kind"] == "snapshot"
                async with httpx.AsyncClient(
                        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                    before = (await http.get(f"{control}/v1/emulators/mesh1/truth",
                                             params={"light": "false"})).json()
                    # an output input 1 does not reach yet, so the mesh must change
                    output = 5 if before["state"]["routes"][0][1] != 5 else 6
                    for body, switch in (({"pairs": [[1, 9]]}, "ocs1"),
                                         ({"pairs": [[2, 10]]}, "ocs1"),
                                         ({"pairs": [[1, output]]}, "mesh1")):
                        r = await http.post(f"/v1/switches/{switch}/connections", json=body)
                        assert r.status_code == 200 and r.json()["outcome"] == "ok", r.text
                    rows = (await http.get("/v1/reconfigurations")).json()
                    truth = {s: (await http.get(f"{control}/v1/emulators/{s}/truth",
                                                params={"light": "false"})).json()
                             for s in ("ocs1", "mesh1")}
                seen_ws = []
                while len(seen_ws) < 3:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    if event["kind"] == "reconfiguration":
                        seen_ws.append(event["data"]["id"])
                seen_mqtt = []
                async with asyncio.timeout(10):
                    async for message in mqtt.messages:
                        seen_mqtt.append(json.loads(message.payload)["data"]["id"])
                        if len(seen_mqtt) == 3:
                            break
        assert sorted(seen_ws) == sorted(seen_mqtt) == sorted(r["id"] for r in rows)
        assert truth["ocs1"]["state"]["connections"] == [[1, 9], [2, 10]]
        assert truth["mesh1"]["state"]["routes"][0] == [1, output]
        for row in rows:
            p = row["phases"]
            assert p["requested"] <= p["dispatched"] <= p["acknowledged"] <= p["done"]
            changes = [c for c in truth[row["switch"]]["changes"]
                       if p["dispatched"] <= c["arrived_ns"] <= p["acknowledged"]]
            assert changes, row  # the device's change happened while labd waited for it
            assert max(c["settled_ns"] for c in changes) <= p["acknowledged"]
    finally:
        daemon.send_signal(signal.SIGINT)
        await asyncio.wait_for(daemon.wait(), 15)
        emulator.send_signal(signal.SIGINT)
        await asyncio.wait_for(emulator.wait(), 15)
    assert daemon.returncode == 0 and emulator.returncode == 0
