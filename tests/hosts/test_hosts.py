"""GPU hosts: agents report over the real broker; the daemon sees health, failures and lost
hosts (by last will and by missed heartbeats)."""

import asyncio
import json
from dataclasses import replace

import httpx

from labd.agent.backends import EmulatedBackend
from labd.agent.reporter import Agent
from labd.emulation.rig import clear_retained
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import new_instance
from tests.broker import MQTT, require_broker
from tests.daemon.test_bus import CuttableProxy
from tests.labs import endpoint, host, unique_name
from tests.rigs import AUTH, StartRig, next_event


class HangingBackend(EmulatedBackend):
    """A host whose nvidia-smi stops answering: no more heartbeats."""

    hang = False

    async def gpus(self):  # type: ignore[no-untyped-def]
        if self.hang:
            await asyncio.Event().wait()
        return await super().gpus()


async def test_agents_health_failures_and_lost_hosts(start_rig: StartRig) -> None:
    require_broker()
    name = unique_name("hosts")  # the agents, made before the daemon starts, need it
    # Hosts whose agents the test runs itself, each as it needs.
    parts = [part for h in "abc" for part in (endpoint(f"{h}.nic0"), host(h, emulate=False))]
    proxy = CuttableProxy()
    proxy_port = await proxy.start()
    a_gpus, c_gpus = EmulatedBackend(count=4), HangingBackend(count=2)
    # The daemon knows each host's key; each agent holds its own.
    bus = BusSettings(MQTT, new_instance()).with_keys(hosts={h: new_key() for h in "abc"})
    agents = {
        "a": Agent(lab=name, host="a", mqtt=bus.for_host("a"), backend=a_gpus,
                   interval=0.2, expected_gpus=4),
        # b talks to the broker through a connection the test can cut (a crashed host)
        "b": Agent(lab=name, host="b",
                   mqtt=replace(bus.for_host("b"), url=f"mqtt://127.0.0.1:{proxy_port}"),
                   backend=EmulatedBackend(count=2), interval=0.2),
        "c": Agent(lab=name, host="c", mqtt=bus.for_host("c"), backend=c_gpus,
                   interval=0.2),
    }
    try:
        async with start_rig("hosts", *parts, name=name, mqtt=bus, token="t") as rig:
            daemon = rig.daemon
            _, sub = daemon.hub.subscribe()
            assert daemon.bus is not None
            await daemon.bus.wait_sessions(1, timeout=10)  # listening before the agents speak
            tasks = [asyncio.create_task(a.run()) for a in agents.values()]
            try:
                # Each agent's first report announces every GPU (was: none).
                first = set()
                while len(first) < 8:
                    event = await next_event(sub, "gpu.health")
                    first.add((event.data["host"], event.data["gpu"]))
                async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
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
                assert "bad heartbeat message from host a: it is not JSON" in warning.data["detail"]
                assert daemon.hosts.hosts["a"].status == "online"

                # The paged and filtered form: lost hosts, a page at a time.
                async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
                    lost_ids = [h["id"] for h in (await http.get(
                        "/v1/hosts", params={"status": "lost"})).json()]
                    page = (await http.get("/v1/hosts", params={"limit": 1, "after": "a"})
                            ).json()
                    unknown = await http.get("/v1/hosts", params={"after": "zz"})
                    bad = await http.get("/v1/hosts", params={"status": "sleepy"})
                    whole = (await http.get("/v1/hosts")).json()
                assert lost_ids == ["c"]  # b's will said offline (and b came back since)
                assert [h["id"] for h in page] == ["b"]
                assert unknown.status_code == 404 and "no host 'zz'" in unknown.text
                assert bad.status_code == 422
                assert [h["id"] for h in whole] == ["a", "b", "c"]
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                sub.close()
    finally:
        await proxy.stop()
        await clear_retained(bus, name, agents)
    assert json.dumps(hosts)  # the API's answer was plain JSON
