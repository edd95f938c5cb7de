"""The agent's own figures for Prometheus, served where asked (``labd agent --metrics-port``,
docs/agent.md "Metrics"): read from the agent at each scrape, so reporting costs nothing
between scrapes. A small threaded server of prometheus-client's own, not the daemon's web
stack: the agent stays light on every GPU host."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from labd.agent.health import Health
from labd.build import add_standard_collectors
from labd.errors import AgentError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from labd.agent.reporter import Agent

__all__ = ["AgentCollector", "MetricsServer", "agent_registry"]


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterable[Metric]:
        agent = self.agent
        labels = {"lab": agent.lab, "host": agent.host}
        names, values = list(labels), list(labels.values())
        up = GaugeMetricFamily("labd_agent_connected",
                               "1 while the agent has a session with the daemon (MQTT or "
                               "HTTP)", labels=names)
        up.add_metric(values, 1.0 if agent.ready.is_set() else 0.0)
        yield up
        beats = CounterMetricFamily("labd_agent_heartbeats", "Heartbeats sent", labels=names)
        beats.add_metric(values, agent.beats)
        yield beats
        health = GaugeMetricFamily("labd_agent_gpu_health",
                                   "1 for each GPU's latest verdict", labels=[
                                       *names, "gpu", "health"])
        verdicts = dict(agent.verdicts)  # a copy: read off-loop
        # The GPUs the host should have are there, all 0, before their first verdict: a
        # panel of a new agent reads "no verdict yet", not "No data".
        indices = sorted(set(verdicts) | set(range(agent.expected or 0)))
        for index in indices:
            verdict = verdicts.get(index)
            for name in Health:
                health.add_metric([*values, str(index), name.value],
                                  1.0 if verdict is not None and verdict.health is name
                                  else 0.0)
        yield health
        nics = GaugeMetricFamily("labd_agent_nic_up", "1 while the NIC's link has carrier",
                                 labels=[*names, "nic"])
        for nic, carrier in sorted(dict(agent.links).items()):  # a copy: read off-loop
            nics.add_metric([*values, nic], 1.0 if carrier else 0.0)
        yield nics
        queued = GaugeMetricFamily("labd_agent_events_queued",
                                   "Events waiting for the daemon to be reachable",
                                   labels=names)
        queued.add_metric(values, agent.queued())
        yield queued
        ranks = GaugeMetricFamily("labd_agent_job_ranks",
                                  "Ranks of each job running on this host",
                                  labels=[*names, "job"])
        for job, procs in sorted(dict(agent.jobs.running).items()):
            ranks.add_metric([*values, job], sum(p.returncode is None for p in procs))
        yield ranks


def agent_registry(agent: Agent) -> CollectorRegistry:
    """The agent's figures, with the process's and ``labd_build_info``
    (labd.build.add_standard_collectors)."""
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    add_standard_collectors(registry)
    return registry


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0: any free one, read back as ``.port``),
    in a thread of its own until ``close()``."""

    def __init__(self, agent: Agent, host: str = "127.0.0.1", port: int = 9471) -> None:
        try:
            server, thread = start_http_server(port, host, registry=agent_registry(agent))
        except OSError as exc:
            raise AgentError(f"cannot serve the agent's metrics on {host}:{port}: "
                             f"{exc.strerror or exc}; choose another --metrics-port") from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.host, self.port = host, server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
