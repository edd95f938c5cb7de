"""The agent's ``/metrics`` (``--metrics-port``): a real agent on the real broker, scraped
over HTTP after its heartbeats and a GPU failure have gone out; and ``labd agent
--metrics-port`` as a process, scraped while it runs and closed when it ends."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import sys

import aiomqtt
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from labd import deadlines
from labd.agent.backends import EmulatedBackend
from labd.agent.metrics import MetricsServer
from labd.agent.reporter import Agent
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


async def test_labd_agent_serves_its_metrics_where_asked() -> None:
    require_broker()
    lab = f"agent-cli-metrics-{secrets.token_hex(3)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABD_")
           or k == deadlines.SCALE_ENV}
    async with aiomqtt.Client(*BROKER) as watcher:
        await watcher.subscribe(f"{lab_root(lab)}/hosts/h1/heartbeat")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "labd", "agent", "--host", "h1", "--lab", lab,
            "--mqtt", MQTT, "--backend", "emulated", "--gpus", "2", "--interval", "0.2",
            "--metrics-port", "0", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env)
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(deadlines.current().of("process_ready")):
                printed = ""
                while (found := re.search(r"metrics: (http://\S+/metrics)", printed)) is None:
                    line = await proc.stdout.readline()
                    assert line, f"labd agent ended before saying where its metrics are:\n" \
                                 f"{printed}{(await proc.communicate())[1].decode()}"
                    printed += line.decode()
                url = found.group(1)
                # Two heartbeats: the first is counted before the second is sent.
                heartbeats = 0
                async for _ in watcher.messages:
                    heartbeats += 1
                    if heartbeats == 2:
                        break
            async with httpx.AsyncClient() as http:
                r = await http.get(url)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(deadlines.current().times(10)):
                _, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert url.startswith("http://127.0.0.1:")  # loopback unless --metrics-host says
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(r.text) for s in f.samples}
    me = (("host", "h1"), ("lab", lab))
    assert samples[("labd_agent_connected", me)] == 1
    assert samples[("labd_agent_heartbeats_total", me)] >= 1
    for gpu in ("0", "1"):
        assert samples[("labd_agent_gpu_health", tuple(sorted(
            (*me, ("gpu", gpu), ("health", "healthy")))))] == 1
    # The server ended with the agent.
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(url)


async def test_a_metrics_port_in_use_stops_labd_agent_with_one_message() -> None:
    agent = Agent(lab="x", host="h1", mqtt=MQTT, backend=EmulatedBackend(count=1))
    taken = MetricsServer(agent, port=0)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "labd", "agent", "--host", "h1", "--lab", "x",
            "--mqtt", MQTT, "--backend", "emulated", "--metrics-port", str(taken.port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"})
        async with asyncio.timeout(deadlines.current().of("process_ready")):
            out, err = await proc.communicate()
    finally:
        taken.close()
    assert proc.returncode == 2
    assert f"127.0.0.1:{taken.port}" in err.decode() and "--metrics-port" in err.decode()
    assert "Traceback" not in out.decode() + err.decode()


def test_a_new_agent_has_every_series_from_the_first_scrape() -> None:
    """Before its first heartbeat: each GPU it expects at 0 for every verdict, the
    process's figures and the build it runs."""
    from prometheus_client import generate_latest

    from labd import __version__
    from labd.agent.metrics import agent_registry
    from labd.build import commit

    agent = Agent(lab="fresh", host="h1", mqtt=MQTT, backend=EmulatedBackend(count=2),
                  expected_gpus=2)
    text = generate_latest(agent_registry(agent)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    me = (("host", "h1"), ("lab", "fresh"))
    for gpu in ("0", "1"):
        for health in ("healthy", "degraded", "failed"):
            key = ("labd_agent_gpu_health", tuple(sorted((*me, ("gpu", gpu),
                                                           ("health", health)))))
            assert samples[key] == 0
    assert samples[("labd_agent_connected", me)] == 0
    assert samples[("labd_build_info", (("commit", commit()), ("version", __version__)))] == 1
    assert any(name == "process_resident_memory_bytes" for name, _ in samples)
