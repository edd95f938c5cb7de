"""Two daemons on one lab, one PostgreSQL (``--ha``), in one process against one emulated
switch: the first leads; the second stands by, answers reads and refuses changes with 503
naming the leader; once the leader stops it takes over with the intended state intact; a
write fenced with a passed epoch is refused whole, on both of the store's write paths."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from labd import deadlines
from labd.daemon.core import Daemon
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.errors import LeaseError, StaleEpoch
from labd.ha.role import HaSettings
from labd.lab.loader import Lab, load_lab
from labd.store import Store
from labd.store.models import JobPool
from labd.store.writer import ReconfigurationRecord
from tests.databases import postgres_database
from tests.labs import switch, write_lab
from tests.rigs import next_event

TOKEN = "ha-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HA = dict(renew_s=0.1, ttl_s=0.5)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[tuple[Lab, dict[str, str]]]:
    _, path = write_lab(tmp_path, "ha", switch("ocs1", size="8x8"), name="ha")
    lab = load_lab(path)
    emulated, entries = emulated_lab(lab)
    async with emulated:
        yield lab, {e.id: endpoint_of(emulated, e) for e in entries}


def daemon(lab: tuple[Lab, dict[str, str]], url: str) -> Daemon:
    return Daemon(lab[0], db=url, addresses=lab[1], port=0, token=TOKEN,
                  ha=HaSettings(url, **HA))


async def health(d: Daemon) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=d.url, headers=AUTH) as http:
        answer: dict[str, Any] = (await http.get("/v1/health")).json()
        return answer


async def test_a_standby_refuses_changes_then_takes_over_with_the_intended_state(
        lab: tuple[Lab, dict[str, str]], url: str) -> None:
    first, second = daemon(lab, url), daemon(lab, url)
    async with first:
        assert (await health(first))["ha"]["role"] == "leader"
        async with httpx.AsyncClient(base_url=first.url, headers=AUTH) as http:
            made = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
            assert made.status_code == 200, made.text
        async with second:
            about = (await health(second))["ha"]
            assert about["role"] == "standby" and about["leader"] == first.url
            async with httpx.AsyncClient(base_url=second.url, headers=AUTH) as http:
                refused = await http.post("/v1/switches/ocs1/connections",
                                          json={"pairs": [[2, 10]]})
                assert refused.status_code == 503
                assert first.url in refused.json()["detail"]
                assert refused.headers["x-labd-leader"] == first.url
                # Reads are answered: the lab as the standby knows it.
                assert (await http.get("/v1/instruments")).status_code == 200
            # A standby holds no instrument session (some switches take only a few) and
            # has read nothing of the intended state yet.
            assert second.report.connected == {} and second.engine.intended["ocs1"] == {}
            _, events = second.hub.subscribe()
            await first.stop()  # a clean stop gives the lease up: no TTL to wait out
            leading = await next_event(events, "ha.leading", timeout=10)
            assert leading.data["epoch"] == 2 and second.role is not None
            assert second.role.name == "leader"
            assert second.engine.intended["ocs1"] == {1: 9}
            assert second.engine.switches["ocs1"].expected == {1: 9}
            async with httpx.AsyncClient(base_url=second.url, headers=AUTH) as http:
                made = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 10]]})
                assert made.status_code == 200, made.text
            assert (await health(second))["ha"]["role"] == "leader"


async def test_a_write_fenced_with_a_passed_epoch_is_refused_on_both_paths(
        lab: tuple[Lab, dict[str, str]], url: str) -> None:
    leader = daemon(lab, url)
    async with leader:
        assert leader.role is not None and leader.role.lease.epoch == 1
        late = Store(url)
        await late.open()
        try:
            late.fence = ("ha", 0)  # an epoch the lease has passed
            record = ReconfigurationRecord(
                switch="ocs1", cause="api", outcome="ok", error=None, connected=[(3, 11)],
                disconnected=[], requested_ns=1, dispatched_ns=1, activated_ns=1, acked_ns=2,
                light_ns=None, done_ns=2, intended={3: 11})
            with pytest.raises(StaleEpoch, match="epoch 0: the lease is at epoch 1"):
                await late.record(record)  # records alone: one pipeline on PostgreSQL
            with pytest.raises(StaleEpoch):
                await late.write(JobPool(job="x", members=[], spares=[],
                                         wall_time=datetime.now(UTC)))
            late.fence = ("ha", 1)
            await late.record(record)  # the current epoch writes
        finally:
            await late.close()
        assert (await leader.store.intended()).get("ocs1") == {3: 11}


def test_the_store_must_be_the_lease_database(lab: tuple[Lab, dict[str, str]],
                                              url: str, tmp_path: Path) -> None:
    with pytest.raises(LeaseError, match="the store is the lease's PostgreSQL"):
        Daemon(lab[0], db=str(tmp_path / "s.sqlite"), addresses=lab[1], ha=HaSettings(url))


async def test_the_tui_follows_the_leader(lab: tuple[Lab, dict[str, str]], url: str) -> None:
    from tui.app import LabApp

    first, second = daemon(lab, url), daemon(lab, url)
    async with first, second:
        app = LabApp(second.url, TOKEN)  # pointed at the standby
        async with app.run_test(size=(120, 40)):
            await asyncio.wait_for(app.synced.wait(), deadlines.current().times(10))
            assert app.client.url == first.url and app.daemons == [second.url, first.url]
            app.synced.clear()
            _, events = second.hub.subscribe()
            await first.stop()
            await next_event(events, "ha.leading", timeout=10)
            # The leader gone, the app tries the daemon it met before, which leads now.
            async with asyncio.timeout(deadlines.current().times(15)):
                while True:
                    await app.synced.wait()
                    if app.client.url == second.url and "live" in str(app.sub_title):
                        break
                    app.synced.clear()
