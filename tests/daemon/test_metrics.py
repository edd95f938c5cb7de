"""``GET /metrics``: Prometheus' text format, scraped from a running rig after
reconfigurations, a failover drill and an instrument fault; each family read back with the
parser Prometheus' own client ships, so a malformed exposition fails here too."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from labd.emulation.drill import run_drill, wait_for
from labd.events import Event, EventHub
from tests.broker import MQTT
from tests.hosts.test_failover import bounded, running
from tests.labs import ring_lab, switch
from tests.rigs import AUTH, StartRig

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def counted(metric: Any, **labels: str) -> float:
    """A counter's or histogram's sample with ``labels``, read through its public
    ``collect()``."""
    return sum(s.value for family in metric.collect() for s in family.samples
               if s.labels == labels and s.name.endswith(("_total", "_count")))


def reconnects(metrics: Any) -> float:
    return counted(metrics.reconnects, instrument="ocs1")


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not exported; have " + ", ".join(
        sorted({n for n, _ in samples if n.startswith(name.rsplit("_", 1)[0])}))
    return samples[key]


@bounded(60)
async def test_metrics_after_reconfigurations_a_failover_and_a_fault(
        start_rig: StartRig) -> None:
    async with start_rig("metrics", ring_lab(), mqtt=MQTT, token="t") as rig:
        daemon = rig.daemon
        await running(rig)
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            # Open by default, as scrapers expect; the rest of the API still needs a key.
            before = parse((await http.get("/metrics")).text)
            assert (await http.get("/v1/instruments")).status_code == 401
            for pairs in ([[8, 24]], [[7, 23]]):
                r = await http.post("/v1/switches/ocs1/connections", json={"pairs": pairs},
                                    headers=AUTH)
                assert r.status_code == 200 and r.json()["outcome"] == "ok", r.text
            result = await run_drill(rig, "ring4", random.Random(1), member="h1.nic0",
                                     timeout="recovery")
            assert result.timeline["outcome"] == "recovered"
            # A fault: the switch's connections cut, so the driver reconnects.
            await rig.backdoor.inject("ocs1", {"kind": "drop", "now": True})
            await wait_for(daemon.hub, lambda: reconnects(daemon.metrics) >= 1, "resync",
                           "ocs1 back online after its connections were cut")
            r = await http.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        after = parse(r.text)

    def api_ops(samples: Samples) -> float:
        return sum(v for (n, labels), v in samples.items()
                   if n == "labd_reconfigurations_total" and ("cause", "api") in labels)

    # Two through the API, each in the histograms of every span it reached.
    assert api_ops(after) - api_ops(before) == 2
    ok = value(after, "labd_reconfigurations_total", switch="ocs1", cause="api", outcome="ok")
    assert ok >= 2
    total = value(after, "labd_reconfiguration_seconds_count", switch="ocs1", phase="total")
    assert total >= ok + value(after, "labd_reconfigurations_total", switch="ocs1",
                               cause="recovery", outcome="ok")
    # A 10 ms switch: the device span's histogram has nothing at or under 0.1 ms.
    assert value(after, "labd_reconfiguration_seconds_bucket", switch="ocs1", phase="device",
                 le="0.0001") == 0
    assert value(after, "labd_reconfiguration_seconds_bucket", switch="ocs1", phase="device",
                 le="+Inf") >= 3
    # The recovery's circuits end on metered receivers (the API's two do not).
    assert value(after, "labd_light_verifications_total", switch="ocs1",
                 result="verified") >= 1
    # The failover, each stage it reached once.
    assert value(after, "labd_failovers_total", trigger="gpu-failed", outcome="recovered") == 1
    for stage in ("reported", "detected", "spare_chosen", "switches_acked", "first_step"):
        assert value(after, "labd_failover_stage_seconds_count", stage=stage) == 1
    # The fault: one reconnect, the switch online again.
    assert value(after, "labd_instrument_reconnects_total", instrument="ocs1") == 1
    assert value(after, "labd_instrument_up", instrument="ocs1", kind="switch",
                 driver="polatis-scpi") == 1
    assert value(after, "labd_instrument_state", instrument="ocs1", state="online") == 1
    # What is read at scrape time.
    assert value(after, "labd_hosts", status="online") == 6
    assert value(after, "labd_gpus", health="failed") == 1  # the drill's, still failed
    assert value(after, "labd_mqtt_connected") == 1
    assert value(after, "labd_mqtt_sessions_total") >= 1
    assert value(after, "labd_websocket_clients") == 0
    assert value(after, "labd_store_queue_depth") >= 0
    # Every record above went through a committed batch, each of which is timed.
    assert value(after, "labd_store_commit_seconds_count") >= 1
    assert value(after, "labd_event_loop_lag_seconds_count") >= 1


async def test_metrics_can_need_a_key(start_rig: StartRig) -> None:
    from labd.daemon.access import ApiSettings

    async with start_rig("metrics-key", switch(), token="t",
                         api=ApiSettings(open_metrics=False)) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        assert (await http.get("/metrics")).status_code == 401
        r = await http.get("/metrics", headers=AUTH)
        assert r.status_code == 200 and "labd_instrument_up" in r.text


def test_an_observer_that_fails_costs_the_event_nothing() -> None:
    hub = EventHub()
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise ValueError("a bug in counting")

    hub.observe(broken)
    hub.observe(seen.append)
    _, sub = hub.subscribe()
    hub.publish("warning", {"detail": "x"})
    assert [e.kind for e in seen] == ["warning"]
    assert sub.queue.qsize() == 1


@pytest.mark.parametrize("data", [
    {}, {"switch": None, "phases": None}, {"phases": {"requested": "x", "done": 5}},
    {"phases": {"requested": 10, "done": 5}, "outcome": 3},
])
def test_odd_reconfiguration_events_are_counted_not_fatal(data: dict[str, Any]) -> None:
    """The observer reads what engine and drills publish; a field missing or odd is
    skipped, never an exception in the publisher's task."""
    from labd.daemon.metrics import DaemonMetrics

    class Services:
        hub = EventHub()

    metrics = DaemonMetrics(Services())  # type: ignore[arg-type]
    metrics.observe(Event(1, "reconfiguration", data))
    metrics.observe(Event(2, "failover", {**data, "since_failure_ms": {"first_step": "x"}}))
    assert counted(metrics.reconfigurations, switch=str(data.get("switch")), cause="None",
                   outcome=str(data.get("outcome"))) == 1
    assert counted(metrics.reconfiguration_seconds, switch=str(data.get("switch")),
                   phase="total") == 0  # no span from odd phases
    assert counted(metrics.failover_stage_seconds, stage="first_step") == 0


DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "labd.json"


def exported_names(text: str) -> set[str]:
    """Every sample name the exposition can carry, families without samples yet included
    (a labelled counter before its first event): a histogram's ``_bucket``, ``_count``,
    ``_sum``; a counter's ``_total``."""
    suffixes = {"counter": ("_total", "_created"), "histogram": (
        "_bucket", "_count", "_sum", "_created"), "gauge": ("",)}
    return {family.name + suffix for family in text_string_to_metric_families(text)
            for suffix in suffixes.get(family.type, ("",))}


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in board["panels"]
             for target in panel.get("targets", [])]
    found += [var["query"] for var in board["templating"]["list"] if var["type"] == "query"]
    return found


async def test_the_grafana_dashboard_names_only_exported_metrics(start_rig: StartRig) -> None:
    async with start_rig("dashboard", switch(), mqtt=MQTT, token="t") as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        text = (await http.get("/metrics")).text
    exported = exported_names(text)
    expressions = dashboard_expressions()
    assert len(expressions) >= 20
    used = {name for expr in expressions for name in re.findall(r"\blabd_[a-z0-9_]+", expr)}
    assert not used - exported, f"the dashboard names metrics labd does not export: " \
                                f"{sorted(used - exported)}"
    # And every family labd exports is on the dashboard, so a new one is not forgotten.
    families = {name.removesuffix(suffix) for name in used
                for suffix in ("_bucket", "_total") if name.endswith(suffix)} | used
    # (labd's own: prometheus_client's process_* and python_* are there for whoever wants.)
    unseen = {f.name for f in text_string_to_metric_families(text)
              if f.name.startswith("labd_")} - families
    assert not unseen, f"exported but on no panel: {sorted(unseen)}"
