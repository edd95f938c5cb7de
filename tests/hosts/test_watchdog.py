"""The lost-host watchdog on a loaded machine: silence the daemon could not hear (its
process got no CPU) is not the host's, and a host that did stop is still declared lost."""

import asyncio
import contextlib
import json
import time

from labd.events import EventHub
from labd.hosts.monitor import MISSED, SETTLE_S, HostMonitor

INTERVAL_S = 0.2


def beat(monitor: HostMonitor) -> int:
    sent = time.monotonic_ns()
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
