"""Hosts on a loaded machine: silence the daemon could not hear (its process got no CPU) is
not the host's, a host that did stop is still declared lost, and a rank's reports stay in
order while the estimate of its host's clock gets better."""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from labd.events import Event, EventHub, Subscription
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import MISSED, SETTLE_S, HostListener, HostMonitor, HostState
from labd.lab.loader import load_lab
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
    async with watching(monitor):
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


async def test_heartbeats_a_busy_broker_delivers_late_do_not_lose_the_host() -> None:
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    beat(monitor)  # delivered at once: the clock offset is taken from it
    async with watching(monitor):
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


class Fleet:
    """Hosts h0..h{n-1} beating every INTERVAL_S, spread over the interval, from a task of
    the test; ``silent`` hosts say nothing, ``deaf`` stops the daemon hearing anyone."""

    def __init__(self, monitor: HostMonitor, n: int) -> None:
        self.monitor, self.n = monitor, n
        self.silent: set[str] = set()
        self.deaf = False
        self.held: list[tuple[str, bytes]] = []
        """What was sent while the daemon heard nothing: delivered late, in order."""

    def body(self) -> bytes:
        return json.dumps({"gpus": [{"index": 0, "health": "healthy"}],
                           "interval_s": INTERVAL_S, "sent_ns": time.monotonic_ns()}).encode()

    async def run(self) -> None:
        step = INTERVAL_S / self.n
        while True:
            for i in range(self.n):
                host = f"h{i}"
                if host not in self.silent:
                    if self.deaf:
                        self.held.append((host, self.body()))
                    else:
                        assert self.monitor.handle(host, "heartbeat", self.body()) is None
                await asyncio.sleep(step)

    def deliver_late(self) -> None:
        self.deaf = False
        for host, body in self.held:
            assert self.monitor.handle(host, "heartbeat", body) is None
        self.held.clear()


async def events_until(sub: Subscription, done: Callable[[Event], bool],
                       timeout: float = 30) -> list[Event]:
    seen: list[Event] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await sub.next()
            assert event is not None
            seen.append(event)
            if done(event):
                return seen


@contextlib.asynccontextmanager
async def watching(monitor: HostMonitor, fleet: Fleet | None = None) -> AsyncIterator[None]:
    """The monitor's watchdog (and the fleet's heartbeats) running, for the block's time."""
    tasks = [asyncio.create_task(fleet.run())] if fleet is not None else []
    tasks.append(asyncio.create_task(monitor.run()))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def online(sub: Subscription, n: int) -> None:
    up: set[str] = set()
    await events_until(sub, lambda e: e.kind == "host.status" and e.data["status"] == "online"
                       and up.add(e.data["host"]) is None and len(up) == n)


async def test_a_daemon_that_hears_nobody_is_unsure_and_loses_no_host() -> None:
    """The broker stops delivering (or the daemon's reader stalls): every host looks silent
    at once. The daemon says it cannot tell and declares none lost; once the messages come
    (late, all of them), every host is still online and the daemon says it is sure again;
    a host that really stopped meanwhile is then found."""
    hub = EventHub()
    monitor = HostMonitor(hub, [f"h{i}" for i in range(6)])
    monitor.heard(0)  # the bridge's probe: it is the evidence, and it is not coming either
    _, sub = hub.subscribe()
    fleet = Fleet(monitor, 6)
    async with watching(monitor, fleet):
        await online(sub, 6)
        fleet.deaf = True
        fleet.silent.add("h3")  # and one host really stops meanwhile
        seen = await events_until(sub, lambda e: e.kind == "hosts.unsure")
        assert seen[-1].data["waiting"] is True and seen[-1].data["hosts"] >= 1
        assert "nothing sent since their time was up has been read" in seen[-1].data["detail"]
        assert not [e for e in seen if e.kind == "host.lost"]
        assert all(s.status == "online" for s in monitor.hosts.values())
        # Long past every host's allowance, still nothing declared.
        deadline = time.monotonic() + 3 * MISSED * INTERVAL_S
        while time.monotonic() < deadline:  # the watchdog keeps looking meanwhile
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    event = await sub.next()
                    assert event is not None and event.kind != "host.lost", event
        fleet.deliver_late()
        monitor.heard(time.monotonic_ns())  # the probe comes through again
        seen = await events_until(sub, lambda e: e.kind == "host.lost")
        assert seen[-1].data["host"] == "h3"
        assert [e.data["host"] for e in seen if e.kind == "host.lost"] == ["h3"]
        others = {h: s.status for h, s in monitor.hosts.items() if h != "h3"}
        assert set(others.values()) == {"online"}, others
        seen = await events_until(sub, lambda e: e.kind == "hosts.unsure")
        assert seen[-1].data["waiting"] is False


async def test_no_host_is_lost_while_its_messages_wait_to_be_read() -> None:
    """Messages that have arrived but wait in the bridge's batches (a backlog) may hold the
    heartbeat that keeps a host: nothing is declared until they are read."""
    hub = EventHub()
    monitor = HostMonitor(hub, [f"h{i}" for i in range(4)])
    waiting = [0]
    monitor.backlog(lambda: waiting[0])
    _, sub = hub.subscribe()
    fleet = Fleet(monitor, 4)
    async with watching(monitor, fleet):
        await online(sub, 4)
        waiting[0] = 5  # from now on, the bridge says messages wait
        fleet.silent.add("h1")
        seen = await events_until(sub, lambda e: e.kind == "hosts.unsure")
        assert "5 agent messages that have arrived are still to be read" in \
            seen[-1].data["detail"]
        assert monitor.hosts["h1"].status == "online"
        waiting[0] = 0  # read: h1's heartbeat was not among them
        seen = await events_until(sub, lambda e: e.kind == "host.lost")
        assert seen[-1].data["host"] == "h1"


async def test_many_hosts_going_silent_together_wait_one_more_interval() -> None:
    """A third of the fleet stops at once while the rest beat on: it looks like the
    daemon's trouble as much as theirs, so the daemon says it is unsure and waits for one
    more interval of evidence; they did stop, and each is then declared lost, none before
    the daemon heard from others an interval past its time."""
    hub = EventHub()
    n = 30
    monitor = HostMonitor(hub, [f"h{i}" for i in range(n)])
    _, sub = hub.subscribe()
    fleet = Fleet(monitor, n)
    checked: list[bool] = []

    class Evidence(HostListener):
        def host_status(self, host: HostState, was: str, at_ns: int) -> None:
            if host.status == "lost":
                assert host.last_sent_ns is not None
                base = host.last_sent_ns + MISSED * INTERVAL_S * 1e9
                checked.append(monitor.heard_ns >= base + INTERVAL_S * 1e9)

    monitor.listen(Evidence())
    async with watching(monitor, fleet):
        await online(sub, n)
        gone = {f"h{i}" for i in range(0, n, 3)}
        fleet.silent |= gone
        lost: set[str] = set()
        seen = await events_until(sub, lambda e: e.kind == "host.lost"
                                  and lost.add(e.data["host"]) is None and lost == gone)
        unsure = [e for e in seen if e.kind == "hosts.unsure"]
        assert unsure and unsure[0].data["waiting"] is True
        assert "hosts went silent together" in unsure[0].data["detail"]
        # Declared with the evidence of one more interval (the first few, before the
        # silence counted as many, on the ordinary evidence).
        assert sum(checked) >= len(gone) - 8, checked
        assert {h for h, s in monitor.hosts.items() if s.status == "lost"} == gone


async def test_a_host_whose_time_is_up_is_judged_on_a_probe_asked_for_then() -> None:
    """Where the bridge probes its path through the broker, a silent host's verdict waits
    for a probe sent after its time was up: the watchdog asks for one then, once, rather
    than waiting for the bridge's next round. No probe answers on its own here: the host
    is declared lost only on the one asked for."""
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    monitor.heard(0)  # the bridge probes: its probes are the evidence
    asked: list[int] = []

    def ask() -> None:  # the bridge: the probe leaves now and comes back at the next turn
        sent = time.monotonic_ns()
        asked.append(sent)
        asyncio.get_running_loop().call_soon(monitor.heard, sent)

    monitor.prober(ask)
    _, sub = hub.subscribe()
    beat(monitor)
    async with watching(monitor):
        seen = await events_until(sub, lambda e: e.kind == "host.lost")
        assert seen[-1].data["host"] == "a"
        # The heartbeat's send time on the daemon's clock, as the watchdog counts from it.
        deadline = seen[-1].data["last_sent_ns"] + MISSED * INTERVAL_S * 1e9
        assert len(asked) == 1, asked  # once for this host's time, not at every look
        assert asked[0] >= deadline and monitor.heard_ns == asked[0]


async def test_a_host_that_dies_as_the_daemon_takes_over_is_lost_within_intervals() -> None:
    """A takeover remakes only the daemon's own connection: the agents stayed on the broker
    and are heard within a heartbeat interval, so the daemon waits 1.5 intervals for them,
    not their time to reconnect (6 s). A host that died meanwhile is lost soon after."""
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    beat(monitor)
    async with watching(monitor):
        monitor.link_down("taking over", agents_connected=True)
        monitor.link_up()  # and host a is never heard again
        bound = monitor.reconnect_s  # what a broker outage would have made it wait, at least
        async with asyncio.timeout(bound):
            while (event := await sub.next()) is not None and event.kind != "host.lost":
                pass
        assert event is not None and monitor.hosts["a"].status == "lost"
