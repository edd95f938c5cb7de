"""The agent's ``/metrics`` (``--metrics-port``): a real agent on the real broker, scraped
over HTTP after its heartbeats and a GPU failure have gone out."""

from __future__ import annotations

import asyncio
import secrets

import aiomqtt
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from labd import deadlines
from labd.agent.agent import Agent
from labd.agent.backends import EmulatedBackend
from labd.agent.metrics import MetricsServer
from labd.errors import AgentError
from labd.mqtt.topics import lab_root
from tests.broker import BROKER, MQTT, require_broker


async def test_the_agent_serves_its_metrics() -> None:
    require_broker()
    lab = f"agent-metrics-{secrets.token_hex(3)}"
    backend = EmulatedBackend(count=2)
    agent = Agent(lab=lab, host="h1", mqtt=MQTT, backend=backend, interval=0.2)
    server = MetricsServer(agent, port=0)
    root = lab_root(lab)
    try:
        async with aiomqtt.Client(*BROKER) as watcher, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            await watcher.subscribe(f"{root}/hosts/h1/+")
            task = asyncio.create_task(agent.run())
            try:
                async with asyncio.timeout(deadlines.current().times(10)):
                    async for message in watcher.messages:
                        if str(message.topic).endswith("/heartbeat"):
                            break
                    backend.fail(1, "xid79")
                    async for message in watcher.messages:
                        if str(message.topic).endswith("/events") and b'"failed"' in bytes(
                                message.payload):  # type: ignore[arg-type]
                            break
                text = (await http.get("/metrics")).text
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        server.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    me = (("host", "h1"), ("lab", lab))
    assert samples[("labd_agent_connected", me)] == 1
    assert samples[("labd_agent_heartbeats_total", me)] >= 1
    assert samples[("labd_agent_gpu_health", tuple(sorted(
        (*me, ("gpu", "1"), ("health", "failed")))))] == 1
    assert samples[("labd_agent_gpu_health", tuple(sorted(
        (*me, ("gpu", "0"), ("health", "healthy")))))] == 1
    assert samples[("labd_agent_events_queued", me)] >= 0


def test_a_port_in_use_is_a_clear_error() -> None:
    agent = Agent(lab="x", host="h1", mqtt=MQTT, backend=EmulatedBackend(count=1))
    first = MetricsServer(agent, port=0)
    try:
        with pytest.raises(AgentError, match=f"127.0.0.1:{first.port}.*--metrics-port"):
            MetricsServer(agent, port=first.port)
    finally:
        first.close()
