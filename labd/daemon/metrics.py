"""The daemon's figures for Prometheus (``GET /metrics``, docs/daemon.md "Metrics").

Two kinds, so that a scrape costs the hot path nothing: what happens (a reconfiguration's
spans, a failover's stages, outcomes, reconnects) is counted as it is published on the
event stream, by an observer that cannot fall behind; what *is* (instruments' states,
hosts by status, GPUs by health, the store's queue, the broker connection, WebSocket
clients) is read at scrape time. Names and labels follow Prometheus' conventions: base
units (seconds), ``_total`` counters, one registry per daemon (tests run several in one
process).

Every labelled series a panel of docs/grafana/labd.json reads is there from the first
scrape, at zero, for each instrument, switch and failover stage the lab has: a panel on a
new daemon shows 0, not "No data", and ``rate()`` sees the first event as an increase. The
registry also carries prometheus_client's process, platform and garbage-collector
collectors and ``labd_build_info``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from labd.build import add_standard_collectors
from labd.daemon.tallies import LoopCounter, LoopHistogram
from labd.events import Event
from labd.vocabulary import SPANS, STAGES, span_ns

if TYPE_CHECKING:
    from labd.daemon.services import Services

__all__ = ["CONTENT_TYPE", "LAG_BUCKETS", "SECONDS_BUCKETS", "DaemonMetrics", "LagSampler"]


# A ``_created`` series per counter and histogram doubles the scrape and says only when the
# daemon started, which ``process_start_time_seconds``-style tooling reads elsewhere.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: 0.1 ms to 1 s in 1-2-5 steps (and 2.5 s, 5 s, 10 s for what a slow switch or a light
#: timeout takes): a 25 ms switch and a 50 µs mesh both land inside the resolved range.
SECONDS_BUCKETS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                   1.0, 2.5, 5.0, 10.0)
#: A failover's stages run from a millisecond (reported) to seconds (first step).
STAGE_BUCKETS = (1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, 30.0, 60.0)
#: Loop lag that matters starts near a millisecond.
LAG_BUCKETS = (1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
#: How often the loop-lag sampler wakes (a sleep of this long, measured against the clock).
LAG_PERIOD_S = 0.1
LINK_STATES = ("online", "connecting", "backoff", "offline", "closed")
HOST_STATUSES = ("online", "offline", "lost", "unknown")
GPU_HEALTH = ("healthy", "degraded", "failed")
#: What a failover starts from and how it mostly ends (labd.hosts.recovery), made at zero so
#: that the failover panels read 0 before the first one; other outcomes appear when met.
FAILOVER_TRIGGERS = ("gpu-failed", "host-lost")
FAILOVER_OUTCOMES = ("recovered", "no-spare", "failed", "timeout")
#: Who publishes warnings on the event stream (``source``; ``daemon`` where none is named).
WARNING_SOURCES = ("daemon", "hosts", "mqtt")
#: A job's statuses (labd.hosts.jobstate), each a ``labd_jobs`` series from the start.
JOB_STATUSES = ("idle", "running", "recovering", "degraded", "stopped")


class DaemonMetrics:
    """One daemon's registry: counted from its event stream (``services.hub``) and read
    from ``services`` and ``bus`` at scrape time."""

    def __init__(self, services: Services, bus: Any = None) -> None:
        self.services = services
        self.bus = bus
        """The MQTT bridge (labd.daemon.bus.MqttBridge), when the lab has a broker."""
        self.registry = CollectorRegistry()
        # Counted on every reconfiguration, from the loop's thread only: tallies without
        # the library's locks (labd.daemon.tallies), exposed as the same families.
        self.reconfiguration_seconds = LoopHistogram(
            "labd_reconfiguration_seconds",
            "A reconfiguration's time per span (docs/daemon.md: device = dispatched to "
            "acknowledged, switching, light, software, total)",
            ["switch", "phase"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self.reconfigurations = LoopCounter(
            "labd_reconfigurations", "Reconfigurations by switch, cause and outcome",
            ["switch", "cause", "outcome"], registry=self.registry)
        self.light_verifications = LoopCounter(
            "labd_light_verifications",
            "Reconfigurations on metered paths by what the meters said: verified (light "
            "seen on every path in the window) or missing",
            ["switch", "result"], registry=self.registry)
        self.instrument_events = Counter(
            "labd_instrument_events", "Instrument events by kind (state, drift, ...)",
            ["instrument", "kind"], registry=self.registry)
        self.reconnects = Counter(
            "labd_instrument_reconnects",
            "Times an instrument came back online after it had been online",
            ["instrument"], registry=self.registry)
        self.failover_stage_seconds = Histogram(
            "labd_failover_stage_seconds",
            "Time from a failure (or its detection, where the failure's own time is unknown) "
            "to each stage of its failover", ["stage"], buckets=STAGE_BUCKETS,
            registry=self.registry)
        self.failovers = Counter(
            "labd_failovers", "Failovers by trigger and outcome", ["trigger", "outcome"],
            registry=self.registry)
        self.warnings = Counter(
            "labd_warnings", "Warnings published on the event stream", ["source"],
            registry=self.registry)
        self.loop_lag_seconds = Histogram(
            "labd_event_loop_lag_seconds",
            f"How late the event loop ran a timer due every {LAG_PERIOD_S} s",
            buckets=LAG_BUCKETS, registry=self.registry)
        self.store_commit_seconds = Histogram(
            "labd_store_commit_seconds", "The store writer's time per committed batch",
            buckets=SECONDS_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(self))
        add_standard_collectors(self.registry)
        self._online: set[str] = set()
        # Label children by switch: ``labels()`` hashes and locks its way to the child on
        # every call, and a reconfiguration observes five spans and a count (bounded: the
        # lab's switches, and a cause and outcome from the engine's few).
        self._spans: dict[str, tuple[tuple[str, str, Any], ...]] = {}
        self._counts: dict[tuple[str, str, str], Any] = {}
        self._zeros()
        services.hub.observe(self.observe)

    def _zeros(self) -> None:
        """Each labelled series the dashboard reads, at zero, for what the lab has."""
        instruments = getattr(self.services, "instruments_state", None)
        known = instruments() if callable(instruments) else []
        for item in known:
            name = str(item["id"])
            self.reconnects.labels(name)
            self.instrument_events.labels(name, "state")
            if item.get("kind") != "switch":
                continue
            for span, _, _ in SPANS:
                self.reconfiguration_seconds.labels(name, span)
            self.reconfigurations.labels(name, "api", "ok")
            for result in ("verified", "missing"):
                self.light_verifications.labels(name, result)
        for stage in STAGES:
            self.failover_stage_seconds.labels(stage)
        for trigger in FAILOVER_TRIGGERS:
            for outcome in FAILOVER_OUTCOMES:
                self.failovers.labels(trigger, outcome)
        for source in WARNING_SOURCES:
            self.warnings.labels(source)

    def expose(self) -> bytes:
        """The text exposition format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    # -- counted as it happens ---------------------------------------------------------------
    def observe(self, event: Event) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(self, event.data)
        elif event.kind.startswith("instrument."):
            self._instrument(event.data)

    def _reconfiguration(self, data: dict[str, Any]) -> None:
        switch = str(data.get("switch"))
        raw = data.get("phases")
        phases = {k: v for k, v in raw.items() if type(v) is int} if isinstance(
            raw, dict) else {}
        spans = self._spans.get(switch)
        if spans is None:
            spans = self._spans[switch] = tuple(
                (start, end, self.reconfiguration_seconds.labels(switch, name))
                for name, start, end in SPANS)
        for start, end, child in spans:
            ns = span_ns(phases, start, end)
            if ns is not None and ns >= 0:
                child.observe(ns / 1e9)
        outcome = str(data.get("outcome"))
        key = (switch, str(data.get("cause")), outcome)
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = self.reconfigurations.labels(*key)
        count.inc()
        if outcome == "light-missing":
            self.light_verifications.labels(switch, "missing").inc()
        elif phases.get("light") is not None:
            self.light_verifications.labels(switch, "verified").inc()

    def _failover(self, data: dict[str, Any]) -> None:
        if data.get("outcome") in ("in-progress", "awaiting-operator"):
            return  # counted once, when it ends
        for stage, ms in (data.get("since_failure_ms") or {}).items():
            if stage in STAGES and isinstance(ms, int | float) and ms >= 0:
                self.failover_stage_seconds.labels(stage).observe(ms / 1e3)
        self.failovers.labels(str(data.get("trigger")), str(data.get("outcome"))).inc()

    def _warning(self, data: dict[str, Any]) -> None:
        self.warnings.labels(str(data.get("source") or "daemon")).inc()

    def _instrument(self, data: dict[str, Any]) -> None:
        name = str(data.get("instrument"))
        self.instrument_events.labels(name, str(data.get("kind"))).inc()
        if data.get("kind") != "state":
            return
        if data.get("state") == "online":
            if name in self._online:
                self.reconnects.labels(name).inc()
            self._online.add(name)

    _handlers: dict[str, Callable[[DaemonMetrics, dict[str, Any]], None]] = {
        "reconfiguration": _reconfiguration, "failover": _failover, "warning": _warning}


class _StateCollector(Collector):
    """What the daemon holds now, read at each scrape."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        services = self.metrics.services
        up = GaugeMetricFamily("labd_instrument_up",
                               "1 while the instrument is online, else 0",
                               labels=["instrument", "kind", "driver"])
        state = GaugeMetricFamily("labd_instrument_state",
                                  "1 for the instrument's connection state",
                                  labels=["instrument", "state"])
        for item in services.instruments_state():
            up.add_metric([item["id"], item["kind"], item["driver"]],
                          1.0 if item["state"] == "online" else 0.0)
            for name in LINK_STATES:
                state.add_metric([item["id"], name], 1.0 if item["state"] == name else 0.0)
        yield up
        yield state
        statuses: Tally[str] = Tally()
        health: Tally[str] = Tally()
        for host in services.hosts.hosts.values():
            statuses[host.status] += 1
            for gpu in host.gpus:
                health[str(gpu.get("health"))] += 1
        hosts = GaugeMetricFamily("labd_hosts", "GPU hosts by status", labels=["status"])
        for name in (*HOST_STATUSES, *sorted(set(statuses) - set(HOST_STATUSES))):
            hosts.add_metric([name], statuses[name])
        yield hosts
        gpus = GaugeMetricFamily("labd_gpus", "GPUs by the health their hosts last reported",
                                 labels=["health"])
        for name in GPU_HEALTH:
            gpus.add_metric([name], health[name])
        yield gpus
        yield GaugeMetricFamily(
            "labd_hosts_unsure", "1 while the daemon is unsure of its hosts (it cannot tell "
            "yet whether they are silent, and holds its verdicts), else 0",
            value=0.0 if services.hosts.unsure is None else 1.0)
        readers = services.hub.readers()
        yield GaugeMetricFamily("labd_websocket_clients",
                                "WebSocket clients reading the event stream",
                                value=readers["websocket"])
        yield GaugeMetricFamily("labd_store_queue_depth",
                                "Writes waiting for the store's writer",
                                value=services.store.queue_depth)
        jobs = GaugeMetricFamily("labd_jobs", "Jobs by status", labels=["status"])
        by_status = Tally(str(state.status) for state in services.jobs.jobs.values())
        for name in (*JOB_STATUSES, *sorted(set(by_status) - set(JOB_STATUSES))):
            jobs.add_metric([name], by_status[name])
        yield jobs
        bus = self.metrics.bus
        if bus is not None:
            yield GaugeMetricFamily("labd_mqtt_connected",
                                    "1 while the daemon holds a session on the MQTT broker",
                                    value=1.0 if bus.connected.is_set() else 0.0)
            yield CounterMetricFamily(
                "labd_mqtt_sessions",
                "MQTT broker sessions so far (a reconnection makes a new one)",
                value=bus.sessions)
            yield CounterMetricFamily(
                "labd_mqtt_bridge_restarts",
                "Times the MQTT bridge's own loops failed and were started again",
                value=bus.restarts)


class LagSampler:
    """How late the event loop runs a timer: every ``LAG_PERIOD_S``, into ``histogram``.
    A loop that is behind delays everything the daemon stamps, so it is watched, not
    assumed."""

    def __init__(self, histogram: Histogram, period_s: float = LAG_PERIOD_S) -> None:
        self.histogram = histogram
        self.period_s = period_s

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.period_s
            await asyncio.sleep(self.period_s)
            self.histogram.observe(max(0.0, time.monotonic() - due))
