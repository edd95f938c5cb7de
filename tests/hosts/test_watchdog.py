"""Hosts on a loaded machine: silence the daemon could not hear (its process got no CPU) is
not the host's, a host that did stop is still declared lost, and a rank's reports stay in
order while the estimate of its host's clock gets better."""

import asyncio
import contextlib
import json
import time
from pathlib import Path

from labd.events import EventHub
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import MISSED, SETTLE_S, HostMonitor
from labd.lab.file import load_lab
from tests.labs import ring_lab, write_lab

INTERVAL_S = 0.2


def beat(monitor: HostMonitor, sent: int | None = None) -> int:
    """A heartbeat from host a, sent at ``sent`` (default now) and read now."""
    sent = time.monotonic_ns() if sent is None else sent
    problem = monitor.handle("a", "heartbeat", json.dumps({
        "gpus": [{"index": 0, "health": "healthy"}], "interval_s": INTERVAL_S,
        "sent_ns": sent}).encode())
    assert problem is None
    return sent


async def test_a_stalled_daemon_does_not_call_its_hosts_lost() -> None:
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    beat(monitor)
    watchdog = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0)  # the watchdog takes its first look and sets its timer
        # The process gets no CPU for more than the allowance (1.5 intervals); the host's
        # next heartbeat is on its way and is read just after the watchdog wakes.
        time.sleep(2 * MISSED * INTERVAL_S)  # noqa: ASYNC251 (the stall itself)
        late: list[int] = []
        asyncio.get_running_loop().call_later(SETTLE_S / 2, lambda: late.append(beat(monitor)))
        # Then the host really stops: the watchdog still says so, dating it from that beat.
        async with asyncio.timeout(30):
            while (event := await sub.next()) is not None and event.kind != "host.lost":
                pass
        assert event is not None and event.kind == "host.lost"
        assert late and event.data["last_sent_ns"] >= late[0]
        assert monitor.hosts["a"].status == "lost"
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog


async def test_heartbeats_a_busy_broker_delivers_late_do_not_lose_the_host() -> None:
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    beat(monitor)  # delivered at once: the clock offset is taken from it
    watchdog = asyncio.create_task(monitor.run())
    try:
        # Then the broker gets slow: heartbeats still leave every interval but arrive
        # 0.75 intervals late, past the allowance of 1.5 intervals counted from the last.
        lag = int(0.75 * INTERVAL_S * 1e9)
        last = beat(monitor, time.monotonic_ns() - lag)
        late: list[int] = []
        asyncio.get_running_loop().call_later(
            (last + INTERVAL_S * 1e9 + lag - time.monotonic_ns()) / 1e9,
            lambda: late.append(beat(monitor, last + int(INTERVAL_S * 1e9))))
        async with asyncio.timeout(30):
            while (event := await sub.next()) is not None and event.kind != "host.lost":
                pass
        assert event is not None and event.kind == "host.lost"
        assert late and event.data["last_sent_ns"] >= late[0]  # lost after the late beat
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog


def test_a_ranks_progress_stays_in_order_as_its_hosts_clock_offset_improves(
        tmp_path: Path) -> None:
    lab = load_lab(str(write_lab(tmp_path, "order", ring_lab())[1]))
    hub = EventHub()
    monitor = HostMonitor(hub, [h.id for h in lab.host])
    jobs = JobManager(lab, None, monitor, hub, None, None)  # type: ignore[arg-type]
    monitor.listen(jobs)
    state = jobs.job("ring4")
    state.epoch = 1
    now = time.monotonic_ns()

    def report(progress: str, at_ns: int, sent_ns: int) -> None:
        assert monitor.handle("h0", "events", json.dumps({
            "job": "ring4", "epoch": 1, "rank": 0, "progress": progress, "at_ns": at_ns,
            "sent_ns": sent_ns}).encode()) is None

    # The first report took 50 ms to arrive (the offset is taken as 50 ms), the next 1 ms:
    # "ready" 20 ms after "started" by the agent's clock would be dated 29 ms before it.
    started = now - 50_000_000
    report("started", started, started)
    report("ready", started + 20_000_000, now - 1_000_000)
    seen = state.progress[0]
    assert seen["started"] <= seen["ready"]
