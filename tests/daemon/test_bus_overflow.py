"""The bridge under load: a flood of events that overflows its queue to the broker starts
its stream over from a snapshot on the same session, said in one log line, while the host
feed stays connected and a host that dies meanwhile is still declared lost and recovered;
a backlog of agent messages works off each host's newest heartbeat; complaints are bounded
however many senders there are."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from labd.daemon.bus import MqttBridge
from labd.daemon.bus_commands import Complaints
from labd.emulation.drill import wait_for
from labd.hosts.state import HostState
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer, new_key
from tests.broker import MQTT
from tests.hosts.test_failover import bounded, running, within
from tests.labs import endpoint, host, ring_lab
from tests.rigs import StartRig, background_rig


@bounded(90)
async def test_an_event_flood_while_a_host_dies_leaves_the_host_feed_alone(
        start_rig: StartRig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="labd.daemon.bus")
    async with start_rig("flood", ring_lab(), mqtt=MQTT) as rig:
        await running(rig)
        daemon = rig.daemon
        bridge = daemon.bus
        assert bridge is not None
        sessions, feed = bridge.sessions, bridge._feed

        async def flood() -> None:
            # Bursts of observers' events beyond the bridge's queue, each in one turn of
            # the loop (far faster than any broker takes them), as the host dies.
            for _ in range(3):
                for i in range(bridge.queue_size + 1):
                    daemon.hub.publish("warning", {"detail": f"flood {i}", "source": "test"})
                await asyncio.sleep(0.5)  # the loop's other work between bursts

        state = daemon.jobs.job("ring4")
        flooding = asyncio.create_task(flood())
        try:
            # Judged from the daemon's state: a subscriber of the hub's (as a drill's own
            # watch of the failover events) overflows in the flood as the bridge's does.
            await rig.backdoor.kill_host("h3")
            await wait_for(daemon.hub, lambda: "s1.nic0" in state.members
                           and state.status == "running", within(60), "h3 replaced by s1")
        finally:
            await flooding
        assert daemon.hosts.hosts["h3"].status == "lost"
        assert state.members == ["h0.nic0", "h1.nic0", "h2.nic0", "s1.nic0"]
        assert bridge.overflows >= 2
        # The same session and the same feed connection throughout.
        assert bridge.sessions == sessions and bridge._feed is feed
        assert bridge.connected.is_set()
        said = [r.getMessage() for r in caplog.records if "came faster" in r.getMessage()]
        assert len(said) == 1, said


class _Hub:
    def __init__(self) -> None:
        self.published: list[dict[str, object]] = []

    def publish(self, kind: str, data: dict[str, object]) -> None:
        self.published.append(data)


class _Hosts:
    def __init__(self, n: int) -> None:
        self.hosts = {f"h{i:05d}": None for i in range(n)}


class _Services:
    def __init__(self, n: int) -> None:
        self.hub = _Hub()
        self.hosts = _Hosts(n)


def test_complaints_remember_every_host_of_a_large_fleet() -> None:
    """Past 4,096 senders each host is still told once per period (no sender forgotten and
    told again at once), and the overall budget bounds the warnings whatever the fleet."""
    services = _Services(8192)
    complain = Complaints(services)  # type: ignore[arg-type]
    for _ in range(3):  # three rounds of a refusal from every host within the period
        for sender in services.hosts.hosts:
            complain(f"host {sender}", f"status message for host {sender} refused")
    assert complain.count == 3 * 8192
    assert len(services.hub.published) == complain.repeats.overall
    assert complain.held == 3 * 8192 - complain.repeats.overall
    assert complain.repeats.max_keys > 8192  # a key for every host: none forgotten early


def sent(state: HostState) -> int:
    """The stamp of the host's last heartbeat handled, on its own clock."""
    assert state.last_sent_ns is not None and state.offset_ns is not None
    return state.last_sent_ns - state.offset_ns


def test_a_backlog_works_off_each_hosts_newest_heartbeat_only(tmp_path: Path) -> None:
    """A daemon a heartbeat interval behind handles each host's newest heartbeat and passes
    over the older ones waiting beside it; events and statuses are all handled, in order."""
    key = new_key()
    parts = (endpoint("h1.nic0"), host("h1", emulate=False))
    with background_rig(tmp_path, "backlog", *parts) as bg:
        bridge = MqttBridge(bg.daemon.services, BusSettings(MQTT).with_keys(hosts={"h1": key}))
        sealer = Sealer("h1", key)
        status = f"{bridge.prefix}/hosts/h1/status"
        beat = f"{bridge.prefix}/hosts/h1/heartbeat"

        def heartbeat(sent_ns: int) -> tuple[str, bytes, bool]:
            body = json.dumps({"gpus": [], "interval_s": 5, "sent_ns": sent_ns})
            return beat, sealer.seal(beat, body), False

        async def feed(messages: list[tuple[str, bytes | None, bool]]) -> None:
            bridge._take(messages)
            async with asyncio.timeout(10):
                await bridge.drained.wait()

        backlog = [(status, sealer.seal(status, b"online"), False),
                   heartbeat(1), heartbeat(2), heartbeat(3)]
        bg.run(lambda _: feed(backlog))
        assert (bridge.taken, bridge.passed_over) == (2, 2)
        assert sent(bg.daemon.hosts.hosts["h1"]) == 3
        assert bridge.complain.count == 0
        # Caught up: the next heartbeat is handled as it comes.
        bg.run(lambda _: feed([heartbeat(4)]))
        assert (bridge.taken, bridge.passed_over) == (3, 2)
        assert sent(bg.daemon.hosts.hosts["h1"]) == 4
