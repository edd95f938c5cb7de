"""GPU hosts: agents report over the real broker; the daemon sees health, failures and lost
hosts (by last will and by missed heartbeats)."""

import asyncio
import json
from pathlib import Path

import httpx

from labd.agent.agent import Agent
from labd.agent.backends import EmulatedBackend
from labd.daemon.core import Daemon
from labd.emulation.drill import clear_retained
from labd.events import Event
from labd.lab.file import load_lab
from tests.broker import BROKER, MQTT, require_broker, unique_lab
from tests.daemon.test_bus import CuttableProxy


async def next_event(sub, kind: str, timeout: float = 10) -> Event:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while True:
            event = await sub.next()
            if event is not None and event.kind == kind:
                return event


class HangingBackend(EmulatedBackend):
    """A host whose nvidia-smi stops answering: no more heartbeats."""

    hang = False

    async def gpus(self):  # type: ignore[no-untyped-def]
        if self.hang:
            await asyncio.Event().wait()
        return await super().gpus()


async def test_agents_health_failures_and_lost_hosts(tmp_path: Path) -> None:
    require_broker()
    name, path = unique_lab(tmp_path, "hosts", """
[[endpoint]]
id = "a.nic0"
[[endpoint]]
id = "b.nic0"
[[endpoint]]
id = "c.nic0"
[[host]]
id = "a"
nics = ["a.nic0"]
[[host]]
id = "b"
nics = ["b.nic0"]
[[host]]
id = "c"
nics = ["c.nic0"]
""")
    daemon = Daemon(load_lab(path), db=str(tmp_path / "s.sqlite"), port=0, token="t",
                    mqtt=f"mqtt://{BROKER[0]}:{BROKER[1]}")
    await daemon.start()
    _, sub = daemon.hub.subscribe()
    proxy = CuttableProxy()
    proxy_port = await proxy.start()
    a_gpus, c_gpus = EmulatedBackend(count=4), HangingBackend(count=2)
    agents = {
        "a": Agent(lab=name, host="a", mqtt="mqtt://127.0.0.1:1883", backend=a_gpus,
                   interval=0.2, expected_gpus=4),
        # b talks to the broker through a connection the test can cut (a crashed host)
        "b": Agent(lab=name, host="b", mqtt=f"mqtt://127.0.0.1:{proxy_port}",
                   backend=EmulatedBackend(count=2), interval=0.2),
        "c": Agent(lab=name, host="c", mqtt="mqtt://127.0.0.1:1883", backend=c_gpus,
                   interval=0.2),
    }
    assert daemon.bus is not None
    await daemon.bus.wait_sessions(1, timeout=10)  # listening before the agents speak
    tasks = [asyncio.create_task(a.run()) for a in agents.values()]
    try:
        # Each agent's first report announces every GPU (was: none).
        first = set()
        while len(first) < 8:
            event = await next_event(sub, "gpu.health")
            first.add((event.data["host"], event.data["gpu"]))
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            hosts = {h["id"]: h for h in (await http.get("/v1/hosts")).json()}
        assert hosts["a"]["status"] == "online"
        assert [g["health"] for g in hosts["a"]["gpus"]] == ["healthy"] * 4

        a_gpus.fail(2, "xid79")  # a GPU falls off the bus
        failed = await next_event(sub, "gpu.health")
        while failed.data["health"] != "failed":
            failed = await next_event(sub, "gpu.health")
        assert (failed.data["host"], failed.data["gpu"]) == ("a", 2)
        assert failed.data["reasons"] == ["Xid 79"] and failed.data["was"] == "healthy"

        proxy.cut()  # host b dies without a word: its last will speaks for it
        lost = await next_event(sub, "host.lost")
        assert (lost.data["host"], lost.data["status"]) == ("b", "offline")

        c_gpus.hang = True  # host c stops heartbeating but keeps its connection
        lost = await next_event(sub, "host.lost")
        assert (lost.data["host"], lost.data["status"]) == ("c", "lost")

        daemon.hosts.handle("a", "heartbeat", b"{not json")
        warning = await next_event(sub, "warning")
        assert "bad heartbeat message from host a: not JSON" in warning.data["detail"]
        assert daemon.hosts.hosts["a"].status == "online"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sub.close()
        await daemon.stop()
        await proxy.stop()
        await clear_retained(name, agents, MQTT)
    assert json.dumps(hosts)  # the API's answer was plain JSON
