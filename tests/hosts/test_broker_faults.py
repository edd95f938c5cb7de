"""A broker that restarts is a routine fault, not a failure of every host: on a real
Mosquitto of the test's own, stopped with SIGTERM (it delivers every client's last will as
it goes) or SIGKILL (a crash), for 1 s or 20 s, with a ring job running and the GPU hosts
in the daemon's process or in a ``labd emulate`` process of their own. Afterwards no host
was declared lost, the job runs, and nothing was logged at ERROR or with a traceback; a host
that really dies during the outage is declared lost only once the daemon hears again
(docs/daemon.md, "When a host is lost")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from labd import deadlines
from labd.daemon.core import Daemon
from labd.emulation.drill import hosts_ready, job_stepping, wait_for
from labd.emulation.rig import Rig, clear_retained
from labd.events import Event
from labd.lab.loader import load_lab
from labd.mqtt.credentials import BusSettings, Credentials
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import new_instance
from tests import labs
from tests.broker import Mosquitto
from tests.rigs import StartRig

# The longer outages run on one Python only (.ci/run): they hold the suite for a minute.
OUTAGES = [pytest.param(signal.SIGTERM, 1.0, id="SIGTERM-1s"),
           pytest.param(signal.SIGKILL, 1.0, id="SIGKILL-1s"),
           pytest.param(signal.SIGTERM, 20.0, id="SIGTERM-20s", marks=pytest.mark.outage),
           pytest.param(signal.SIGKILL, 20.0, id="SIGKILL-20s", marks=pytest.mark.outage)]


class Seen:
    """Every event the daemon publishes, in order, from the moment it is made."""

    def __init__(self, daemon: Daemon) -> None:
        self.events: list[Event] = []
        daemon.hub.observe(self.events.append)

    def kinds(self, kind: str, since: int = 0) -> list[Event]:
        return [e for e in self.events[since:] if e.kind == kind]


def heard_again(daemon: Daemon, seen: Seen, since: int) -> bool:
    """The unsure episode the outage began has ended, every host is online and the bridge
    is on the broker."""
    ended = [e for e in seen.kinds("hosts.unsure", since) if not e.data["waiting"]]
    return bool(ended) and daemon.hosts.unsure is None and hosts_ready(daemon) and (
        daemon.bus is not None and daemon.bus.connected.is_set())


@contextlib.asynccontextmanager
async def hosts_apart(tmp_path: Path, broker: Mosquitto) -> AsyncIterator[Daemon]:
    """The ring lab's instruments and hosts in a ``labd emulate`` process, the daemon in
    this one; the emulator process's output is checked for tracebacks and ERROR lines."""
    name, lab_file = labs.write_lab(tmp_path, "apart", labs.ring_lab())
    keys = tmp_path / "keys.toml"
    Credentials(hosts={h: new_key() for h, _ in labs.HOSTS}).write(keys)
    instance = new_instance()
    resolved = tmp_path / "resolved.toml"
    output = tmp_path / "emulate.log"
    with output.open("wb") as sink:
        emulator = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "labd", "emulate", str(lab_file), "--resolved",
            str(resolved), "--mqtt", broker.url, "--mqtt-credentials", str(keys),
            "--instance", instance, stdout=asyncio.subprocess.PIPE, stderr=sink,
            env=os.environ.copy())
    assert emulator.stdout is not None
    bus = BusSettings.load(broker.url, keys, instance)
    try:
        async with asyncio.timeout(deadlines.current().times(30)):
            while not json.loads(await emulator.stdout.readline()).get("ready"):
                pass
        async with Daemon(load_lab(resolved), db=str(tmp_path / "s.sqlite"), port=0,
                          mqtt=bus) as daemon:
            yield daemon
            daemon.hosts.unlisten(daemon.jobs)  # the hosts' goodbyes are no failures
    finally:
        emulator.terminate()
        await emulator.communicate()  # to the end of its output: the pipe is closed
        await clear_retained(bus, name, [h for h, _ in labs.HOSTS])
    said = output.read_text(errors="replace")
    assert "Traceback" not in said and " ERROR " not in said, said


def quiet(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged at ERROR or with a traceback."""
    return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info]


async def running_job(daemon: Daemon) -> None:
    await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online", "every host online")
    await daemon.jobs.start_job("ring4")
    await wait_for(daemon.hub, lambda: job_stepping(daemon, "ring4"), "first_step",
                   "the ring job's first step")


async def outage(broker: Mosquitto, sig: signal.Signals, seconds: float) -> None:
    await broker.stop(sig)
    await asyncio.sleep(seconds)  # the fault's length, not a wait for anything
    await broker.start()


async def after_outage(daemon: Daemon, seen: Seen, since: int, seconds: float) -> None:
    await wait_for(daemon.hub, lambda: heard_again(daemon, seen, since),
                   deadlines.current().times(30 + seconds),
                   lambda: f"the daemon hearing its hosts again (hosts: "
                           f"{[(h.id, h.status) for h in daemon.hosts.hosts.values()]}, "
                           f"unsure: {daemon.hosts.unsure})")


def assert_nothing_lost(daemon: Daemon, seen: Seen, since: int) -> None:
    assert seen.kinds("host.lost", since) == []
    assert [e.data for e in seen.kinds("failover", since)] == []
    assert daemon.jobs.job("ring4").status == "running"
    unsure = seen.kinds("hosts.unsure", since)
    assert unsure[0].data["waiting"] is True and "MQTT broker" in unsure[0].data["detail"]
    assert unsure[-1].data["waiting"] is False and unsure[-1].data["lost"] == 0


@pytest.mark.parametrize(("sig", "seconds"), OUTAGES)
async def test_a_broker_restart_loses_no_host_in_process(
        tmp_path: Path, start_rig: StartRig, caplog: pytest.LogCaptureFixture,
        sig: signal.Signals, seconds: float) -> None:
    caplog.set_level(logging.WARNING)
    async with Mosquitto(tmp_path / "broker") as broker, \
            start_rig("restart", labs.ring_lab(), mqtt=broker.url) as rig:
        seen = Seen(rig.daemon)
        await running_job(rig.daemon)
        since = len(seen.events)
        await outage(broker, sig, seconds)
        await after_outage(rig.daemon, seen, since, seconds)
        assert_nothing_lost(rig.daemon, seen, since)
    assert quiet(caplog) == []


@pytest.mark.parametrize(("sig", "seconds"), OUTAGES)
async def test_a_broker_restart_loses_no_host_apart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, sig: signal.Signals,
        seconds: float) -> None:
    caplog.set_level(logging.WARNING)
    async with Mosquitto(tmp_path / "broker") as broker, \
            hosts_apart(tmp_path, broker) as daemon:
        seen = Seen(daemon)
        await running_job(daemon)
        since = len(seen.events)
        await outage(broker, sig, seconds)
        await after_outage(daemon, seen, since, seconds)
        assert_nothing_lost(daemon, seen, since)
    assert quiet(caplog) == []


@contextlib.asynccontextmanager
async def job_in_outage(tmp_path: Path, start_rig: StartRig, tag: str
                        ) -> AsyncIterator[tuple[Rig, Mosquitto, Seen, int]]:
    """ring4 running on a broker of the test's own, then the broker killed: the rig, the
    broker (to start again), the events seen and where the outage's begin among them."""
    async with Mosquitto(tmp_path / "broker") as broker, \
            start_rig(tag, labs.ring_lab(), mqtt=broker.url) as rig:
        seen = Seen(rig.daemon)
        await running_job(rig.daemon)
        since = len(seen.events)
        await broker.stop(signal.SIGKILL)
        yield rig, broker, seen, since


async def first_outcome(rig: Rig, seen: Seen, since: int, within_s: float) -> Any:
    """The first failover since ``since`` to end (whatever its outcome)."""
    def ended() -> Any:
        return next((e.data for e in seen.kinds("failover", since)
                     if e.data["outcome"] != "in-progress"), None)
    return await wait_for(rig.daemon.hub, ended, deadlines.current().times(within_s),
                          "a recovery's outcome")


async def test_a_host_that_dies_in_the_outage_is_lost_once_the_daemon_hears_again(
        tmp_path: Path, start_rig: StartRig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with job_in_outage(tmp_path, start_rig, "dies") as (rig, broker, seen, since):
        await next(h for h in rig.hosts if h.id == "h1").kill()  # never heard again
        await broker.start()
        found = await first_outcome(rig, seen, since, 40)
        kinds = [(e.kind, e.data.get("host"), e.data.get("waiting"))
                 for e in seen.events[since:] if e.kind in ("hosts.unsure", "host.lost")]
        # The order is the rule: unsure from the broker's loss until the daemon hears
        # again (the agents' time to reconnect run out), then the one lost host.
        assert kinds == [("hosts.unsure", None, True), ("hosts.unsure", None, False),
                         ("host.lost", "h1", None)], kinds
        assert found["trigger"] == "host-lost" and found["host"] == "h1"
        assert found["outcome"] == "recovered"
    assert quiet(caplog) == []


async def test_a_gpu_that_fails_in_the_outage_is_recovered_once_the_daemon_hears_again(
        tmp_path: Path, start_rig: StartRig, caplog: pytest.LogCaptureFixture) -> None:
    """The failure is reported as its agent comes back, before the other agents are: the
    restart waits until they are back too (sent earlier, a rank not yet back never heard
    of it, and the recovery timed out)."""
    caplog.set_level(logging.WARNING)
    async with job_in_outage(tmp_path, start_rig, "gpu-out") as (rig, broker, seen, since):
        next(h for h in rig.hosts if h.id == "h1").fail(0, "xid79")
        await asyncio.sleep(5.0)  # the fault's length, not a wait for anything
        await broker.start()
        found = await first_outcome(rig, seen, since, 60)
        assert found["trigger"] == "gpu-failed" and found["host"] == "h1"
        assert found["outcome"] == "recovered", found
        assert rig.daemon.jobs.job("ring4").status == "running"
        assert seen.kinds("host.lost", since) == []
    assert quiet(caplog) == []


@contextlib.contextmanager
def broker_dies_with(rig: Rig, broker: Mosquitto, lost: Callable[[str, str, bytes], bool],
                     down_s: float) -> Iterator[list[tuple[str, bytes]]]:
    """The broker acknowledges the first message that ``lost`` picks (``lost(host, kind,
    payload)``: an agent's message to the daemon, or ``job``, the daemon's command to the
    agent) and dies (SIGKILL) before delivering it, and every such message until it is
    down, as a Mosquitto without persistence does; it comes back after ``down_s``. Yields
    the messages lost."""
    monitor, commands = rig.daemon.hosts, rig.daemon.jobs.commands
    handle, send = monitor.handle, commands.sender()
    dropped: list[tuple[str, bytes]] = []
    crash: list[asyncio.Task[None]] = []
    sending = asyncio.Condition()
    inflight = [0]

    async def die() -> None:
        async with sending:  # the command's other sends acknowledged first
            await sending.wait_for(lambda: inflight[0] == 0)
        await broker.stop(signal.SIGKILL)
        await asyncio.sleep(down_s)  # the fault's length, not a wait for anything
        await broker.start()

    def dies(host: str, kind: str, payload: bytes) -> bool:
        if lost(host, kind, payload) and (not crash or not crash[0].done()):
            dropped.append((host, payload))
            if not crash:
                crash.append(asyncio.create_task(die()))
            return True
        return False

    def lossy(host: str, kind: str, payload: bytes) -> str | None:
        return None if dies(host, kind, payload) else handle(host, kind, payload)

    async def lossy_send(host: str, message: dict[str, Any]) -> None:
        if dies(host, "job", json.dumps(message).encode()):
            return  # "acknowledged"
        inflight[0] += 1
        try:
            await send(host, message)
        finally:
            inflight[0] -= 1
            async with sending:
                sending.notify_all()

    monitor.handle = lossy  # type: ignore[method-assign]
    commands.send = lossy_send
    try:
        yield dropped
    finally:
        monitor.handle = handle  # type: ignore[method-assign]
        commands.send = send
        for task in crash:
            task.cancel()


@pytest.mark.parametrize("what", ["progress", "links", "command"])
async def test_a_recovery_ends_when_the_broker_dies_with_what_it_waits_for(
        tmp_path: Path, start_rig: StartRig, caplog: pytest.LogCaptureFixture,
        what: str) -> None:
    """The soak's drill that never ended: a recovery's restart waits for every rank's
    progress (or, before it, for the new circuits' NIC links); the broker acknowledged
    those events (or the restart command itself) and was killed before delivering them.
    The agents' heartbeats carry what the events announced and the run each host runs
    (docs/agent.md), so the daemon learns it once the broker is back, or sends the start
    again to a host that did not get it, and the recovery ends recovered (before, it
    waited out ``start_timeout_s``)."""
    caplog.set_level(logging.WARNING)
    async with Mosquitto(tmp_path / "broker") as broker, \
            start_rig(f"lost-{what}", labs.ring_lab(), mqtt=broker.url) as rig:
        seen = Seen(rig.daemon)
        await running_job(rig.daemon)
        state = rig.daemon.jobs.job("ring4")
        first_run = state.run
        since = len(seen.events)

        def lost(host: str, kind: str, payload: bytes) -> bool:
            compact = payload.replace(b" ", b"")
            if what == "links":
                return kind == "events" and b'"nic"' in compact and b'"up":true' in compact
            restarted = state.run != first_run and f'"{state.run}"'.encode() in compact
            if what == "command":
                return kind == "job" and host == "h2" and restarted
            return kind == "events" and restarted

        with broker_dies_with(rig, broker, lost, 2.0) as dropped:
            next(h for h in rig.hosts if h.id == "h1").fail(0, "xid79")
            found = await first_outcome(rig, seen, since, 60)
        assert dropped, f"no {what} message was lost: the test did not test"
        assert found["trigger"] == "gpu-failed" and found["host"] == "h1"
        assert found["outcome"] == "recovered", found
        if what == "command":
            again = [r for r in caplog.records if "sending it again" in r.getMessage()]
            assert again and "h2" in again[0].getMessage()
        else:
            learnt = [e for e in seen.events[since:] if e.data.get("source") == "heartbeat"
                      and e.kind in ("job.progress", "nic.link")]
            assert learnt, "nothing was learnt from a heartbeat"
        assert rig.daemon.jobs.job("ring4").status == "running"
        assert seen.kinds("host.lost", since) == []
    assert quiet(caplog) == []
