"""The leader's lease on a real PostgreSQL: one leader at a time, a takeover only once the
lease ran out (or was given up), each takeover a new epoch, and a write fenced with a
passed epoch refused with nothing written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy import create_engine, text

from labd import deadlines
from labd.errors import LeaseError, StaleEpoch
from labd.ha.lease import Lease, fence
from labd.store import Store
from tests.databases import postgres_database

TTL, RENEW = 0.6, 0.2


@pytest.fixture
async def url() -> AsyncIterator[str]:
    with postgres_database() as url:
        store = Store(url)  # its migrations make the leases table
        await store.open()
        await store.close()
        yield url


def pair(url: str) -> tuple[Lease, Lease]:
    return (Lease(url, "lab", api_url="http://a", renew_s=RENEW, ttl_s=TTL, holder="a"),
            Lease(url, "lab", api_url="http://b", renew_s=RENEW, ttl_s=TTL, holder="b"))


async def until_won(lease: Lease) -> int:
    """The lease's own loop, until it says ``lease`` leads; its epoch."""
    won = asyncio.Event()

    async def changed(leading: bool) -> None:
        if leading:
            won.set()

    loop = asyncio.create_task(lease.run(changed))
    try:
        await asyncio.wait_for(won.wait(), deadlines.current().times(10))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert lease.epoch is not None
    return lease.epoch


async def test_one_leads_and_a_takeover_is_a_new_epoch(url: str) -> None:
    a, b = pair(url)
    try:
        assert await a.acquire() == 1 and a.holds()
        assert await b.acquire() is None and not b.holds()
        leader = await b.leader()
        assert leader is not None and (leader.holder, leader.url, leader.epoch, leader.live) \
            == ("a", "http://a", 1, True)
        # a stops renewing (paused, dead): b takes over once the lease ran out.
        assert await until_won(b) == 2
        assert not a.holds()  # by its own clock, before b could win
        assert await a.renew() is False and a.epoch is None
        leader = await a.leader()
        assert leader is not None and (leader.holder, leader.epoch) == ("b", 2)
    finally:
        a.close()
        b.close()


async def test_a_write_from_a_passed_epoch_is_refused(url: str) -> None:
    a, b = pair(url)
    engine = create_engine(url)
    try:
        with engine.begin() as c:
            c.execute(text("CREATE TABLE probe (who text)"))
        assert await a.acquire() == 1
        with engine.begin() as c:
            fence(c, "lab", 1)
            c.execute(text("INSERT INTO probe VALUES ('a, leading')"))
        assert await until_won(b) == 2
        with pytest.raises(StaleEpoch, match="epoch 1: the lease is at epoch 2"), \
                engine.begin() as c:
            c.execute(text("INSERT INTO probe VALUES ('a, late')"))
            fence(c, "lab", 1)
        with engine.begin() as c:
            fence(c, "lab", 2)
            c.execute(text("INSERT INTO probe VALUES ('b')"))
        with engine.connect() as c:
            assert [r[0] for r in c.execute(text("SELECT who FROM probe"))] == [
                "a, leading", "b"]
    finally:
        engine.dispose()
        a.close()
        b.close()


async def test_a_lease_given_up_is_taken_at_once(url: str) -> None:
    a, b = Lease(url, "lab", ttl_s=60, renew_s=1, holder="a"), \
        Lease(url, "lab", ttl_s=60, renew_s=1, holder="b")
    try:
        assert await a.acquire() == 1
        await a.release()
        assert not a.holds()
        assert await b.acquire() == 2  # no minute's wait
    finally:
        a.close()
        b.close()


async def test_the_standby_leads_when_the_leader_stops_renewing(url: str) -> None:
    a, b = pair(url)
    states: dict[str, asyncio.Queue[bool]] = {"a": asyncio.Queue(), "b": asyncio.Queue()}

    def told(who: str) -> Callable[[bool], Awaitable[None]]:
        async def changed(leading: bool) -> None:
            states[who].put_nowait(leading)
        return changed

    within = deadlines.current().times(10)
    runs = [asyncio.create_task(a.run(told("a")))]
    try:
        assert await asyncio.wait_for(states["a"].get(), within) is True
        runs.append(asyncio.create_task(b.run(told("b"))))
        runs[0].cancel()  # a dies without giving the lease up
        await asyncio.gather(runs[0], return_exceptions=True)
        assert await asyncio.wait_for(states["b"].get(), within) is True
        assert b.epoch == 2 and states["a"].empty()
    finally:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        a.close()
        b.close()


@pytest.mark.parametrize(("url", "renew", "ttl", "said"), [
    ("postgresql://x/y", 1.0, 1.0, "at most half its time to live"),
    ("postgresql://x/y", 0.0, 2.0, "must be positive"),
    ("sqlite:///x.sqlite", 0.5, 2.0, "needs PostgreSQL shared by every daemon"),
])
def test_settings_that_cannot_work_are_refused(url: str, renew: float, ttl: float,
                                               said: str) -> None:
    with pytest.raises(LeaseError, match=said):
        Lease(url, "lab", renew_s=renew, ttl_s=ttl)
