"""The daemon's one lifecycle: ``async with`` serves the lab and leaving it stops every
part in order; a background loop that fails ends the block; a start-up that fails leaves
nothing open; ``stop()`` ends it early, as a daemon that goes away."""

import asyncio
import gc
import socket
from pathlib import Path

import httpx
import pytest
import websockets

from instruments.events import LinkState
from labd import deadlines
from labd.daemon.core import Daemon
from labd.errors import StoreError
from labd.lab.loader import Lab, load_lab
from tests.labs import instrument, write_lab

TOKEN = "life-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    """A lab whose one switch is unreachable: it keeps reconnecting, so the daemon has a
    driver to open and close without any emulator."""
    _, path = write_lab(tmp_path, "life", instrument(
        "gone", "polatis-scpi", emulate=False, address="tcp://127.0.0.1:1"), name="life")
    return load_lab(path)


def daemon_for(lab: Lab, tmp_path: Path, port: int = 0) -> Daemon:
    return Daemon(lab, db=str(tmp_path / "s.sqlite"), port=port, token=TOKEN)


async def assert_stopped(daemon: Daemon) -> None:
    """Nothing of the daemon is left running: no server, no store writer, no driver."""
    async with httpx.AsyncClient(base_url=daemon.url) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/v1/health")
    with pytest.raises(StoreError, match="not open"):
        await daemon.store.write()
    assert all(d.state is LinkState.CLOSED for d in daemon.drivers.values())


async def test_the_block_serves_and_leaving_it_stops_everything_in_order(
        lab: Lab, tmp_path: Path) -> None:
    daemon = daemon_for(lab, tmp_path)
    assert daemon.url == "" and daemon.report.failed == {}  # nothing done yet
    async with daemon:
        assert set(daemon.report.failed) == {"gone"}
        # What start-up made is out of the collector's full passes while it serves.
        assert gc.get_freeze_count() > 0
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            assert (await http.get("/v1/health")).json()["lab"] == "life"
        ws = await websockets.connect(daemon.url.replace("http://", "ws://") + "/v1/events",
                                      additional_headers=AUTH)
        assert "snapshot" in await asyncio.wait_for(ws.recv(), 5)
    # The event stream was closed before the server exited, so the client was told why
    # (and the server did not have to wait for it), after the events it had not read (the
    # unreachable switch's reconnection attempts).
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001,
                                                                  "the daemon is stopping")
    await assert_stopped(daemon)
    assert gc.get_freeze_count() == 0  # and back in them once it stopped


async def test_an_error_in_the_block_is_raised_as_itself(lab: Lab, tmp_path: Path) -> None:
    daemon = daemon_for(lab, tmp_path)
    with pytest.raises(KeyError, match="mine"):
        async with daemon:
            raise KeyError("mine")
    await assert_stopped(daemon)


async def test_a_failing_background_loop_ends_the_block(lab: Lab, tmp_path: Path) -> None:
    daemon = daemon_for(lab, tmp_path)

    async def broken() -> None:
        raise RuntimeError("the watchdog broke")

    daemon.hosts.run = broken  # type: ignore[method-assign]
    # Raised as itself (a command reports it as a message), once everything has stopped.
    with pytest.raises(RuntimeError, match="the watchdog broke"):
        async with daemon:
            await asyncio.Event().wait()  # until the failure cancels the block
    await assert_stopped(daemon)


async def test_a_loop_that_goes_on_after_its_cancellation_is_cancelled_again(
        lab: Lab, tmp_path: Path) -> None:
    """As a loop does whose cancellation a library's wait_for swallowed (aiomqtt's on
    Python 3.11): the stop cancels it again rather than wait for it for ever."""
    daemon = daemon_for(lab, tmp_path)
    cancellations = 0
    running = asyncio.Event()

    async def stubborn() -> None:
        nonlocal cancellations
        running.set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations > 1:
                    raise

    daemon.hosts.run = stubborn  # type: ignore[method-assign]
    async with asyncio.timeout(deadlines.current().times(30)):
        async with daemon:
            await running.wait()
    assert cancellations == 2
    await assert_stopped(daemon)


async def test_a_failed_start_up_leaves_nothing_open(lab: Lab, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        daemon = daemon_for(lab, tmp_path, port=taken.getsockname()[1])
        with pytest.raises(OSError, match="in use"):
            async with daemon:
                raise AssertionError("the block must not run")
    with pytest.raises(StoreError, match="not open"):
        await daemon.store.write()
    assert all(d.state is LinkState.CLOSED for d in daemon.drivers.values())


async def test_stopped_before_the_block_ends(lab: Lab, tmp_path: Path) -> None:
    async with daemon_for(lab, tmp_path) as daemon:
        with pytest.raises(RuntimeError, match="already running"):
            await daemon.__aenter__()
        # Stopped from another task (as a daemon that goes away), then again: nothing more.
        await asyncio.create_task(daemon.stop())
        await assert_stopped(daemon)
        await daemon.stop()
    await assert_stopped(daemon)


async def test_drills_set_after_start_up_reach_the_api(lab: Lab, tmp_path: Path) -> None:
    class Drills:
        def __init__(self) -> None:
            self.asked: list[tuple[str | None, str | None, str]] = []

        def start(self, job: str | None, member: str | None, kind: str) -> dict[str, str]:
            self.asked.append((job, member, kind))
            return {"drill": "started"}

        async def close(self) -> None:
            pass

    drills = Drills()
    async with daemon_for(lab, tmp_path) as daemon, httpx.AsyncClient(
            base_url=daemon.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        assert (await http.post("/v1/drills/failover", json={})).status_code == 409
        daemon.drills = drills
        assert daemon.services.drills is drills
        r = await http.post("/v1/drills/failover", json={"job": "j", "kind": "host"})
        assert (r.status_code, r.json()) == (202, {"drill": "started"})
    assert drills.asked == [("j", None, "host")]
