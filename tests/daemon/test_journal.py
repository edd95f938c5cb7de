"""The journal's WARNING lines, read off the event stream: one for each change an operator
must hear of, none for what is no change, and a flood held to a few lines with a count."""

from __future__ import annotations

import logging

import pytest

from labd.daemon.journal import Journal
from labd.events import EventHub


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "labd.daemon.journal"]


def test_an_instrument_offline_and_back(caplog: pytest.LogCaptureFixture) -> None:
    hub, clock = EventHub(), Clock()
    Journal(hub, clock=clock)
    with caplog.at_level(logging.WARNING):
        for state in ("connecting", "online"):  # start-up: no warning
            hub.publish("instrument.state", {"instrument": "ocs1", "state": state})
        hub.publish("instrument.state", {"instrument": "ocs1", "state": "backoff",
                                         "detail": "connection reset by peer"})
        hub.publish("instrument.state", {"instrument": "ocs1", "state": "connecting"})
        clock.now += 2.5
        hub.publish("instrument.state", {"instrument": "ocs1", "state": "online"})
        hub.publish("instrument.state", {"instrument": "ocs1", "state": "closed"})
    assert lines(caplog) == [
        ("WARNING", "ocs1: offline (connection reset by peer); the daemon reconnects by "
                    "itself"),
        ("WARNING", "ocs1: back online after 2.5 s")]
    assert all(r.__dict__.get("instrument") == "ocs1" for r in caplog.records)


def test_a_host_lost_and_back_and_a_failover(caplog: pytest.LogCaptureFixture) -> None:
    hub, clock = EventHub(), Clock()
    Journal(hub, clock=clock)
    with caplog.at_level(logging.WARNING):
        hub.publish("host.status", {"host": "h1", "status": "online", "was": "unknown"})
        hub.publish("host.lost", {"host": "h1", "status": "lost", "was": "online"})
        timeline = {"job": "ring4", "member": "h1.nic0", "trigger": "host-lost",
                    "host": "h1", "outcome": "in-progress"}
        for _ in range(3):  # each stage is published: one line for the start
            hub.publish("failover", timeline)
        hub.publish("failover", {**timeline, "outcome": "recovered"})
        clock.now += 4
        hub.publish("host.status", {"host": "h1", "status": "online", "was": "lost"})
    assert lines(caplog) == [
        ("WARNING", "host h1: lost (was online)"),
        ("WARNING", "job ring4: failover started: member h1.nic0 (host-lost, host h1)"),
        ("WARNING", "job ring4: failover of member h1.nic0 ended: recovered"),
        ("WARNING", "host h1: back online after 4.0 s")]


def test_a_flood_is_a_few_lines_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    hub, clock = EventHub(), Clock()
    Journal(hub, clock=clock)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            hub.publish("host.lost", {"host": f"h{i}", "status": "lost", "was": "online"})
        clock.now += 60
        hub.publish("host.lost", {"host": "late", "status": "lost", "was": "online"})
    said = lines(caplog)
    assert 2 <= len(said) <= 25  # the limiter's budget, not a thousand
    assert "other lines held back" in said[-1][1]
