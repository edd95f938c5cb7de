"""The hosts' unsure episode (docs/daemon.md, "When a host is lost") is visible: ``GET
/v1/health`` says whether the daemon is unsure of its hosts, since when and why, and
``/metrics`` has it as the gauge ``labd_hosts_unsure``."""

from __future__ import annotations

import time

import httpx

from labd.emulation.drill import hosts_ready, wait_for
from tests.broker import MQTT
from tests.daemon.test_metrics import parse, value
from tests.hosts.test_failover import bounded
from tests.labs import ring_lab
from tests.rigs import AUTH, StartRig


@bounded(60)
async def test_an_unsure_episode_shows_in_the_health_and_the_metrics(
        start_rig: StartRig) -> None:
    async with start_rig("unsure", ring_lab(), mqtt=MQTT, token="t") as rig:
        daemon = rig.daemon
        await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online",
                       "every host online")
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            async def health() -> dict[str, object]:
                answer = (await http.get("/v1/health")).json()["hosts"]
                assert isinstance(answer, dict)
                return answer

            async def gauge() -> float:
                return value(parse((await http.get("/metrics")).text), "labd_hosts_unsure")

            assert await health() == {"unsure": False}
            assert await gauge() == 0
            # The daemon's own link lost (as the bridge tells it): unsure until it hears.
            before = time.monotonic_ns()
            daemon.hosts.link_down("a test's outage", agents_connected=True)
            await wait_for(daemon.hub, lambda: daemon.hosts.unsure is not None, 10,
                           "the unsure episode")
            said = await health()
            assert said["unsure"] is True and said["hosts"] == 6
            assert "a test's outage" in str(said["why"])
            assert before <= int(str(said["since_ns"])) <= time.monotonic_ns()
            assert isinstance(said["for_s"], float) and said["lost"] == 0
            assert await gauge() == 1
            daemon.hosts.link_up()
            await wait_for(daemon.hub, lambda: daemon.hosts.unsure is None, 20,
                           "the episode's end")
            assert await health() == {"unsure": False}
            assert await gauge() == 0
