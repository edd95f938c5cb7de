"""The agent's outbox: an event whose send a lost link cut off goes out first on the next
link, not never; events past the bound during a long outage drop oldest first, counted.
(The links here are the agent's own link protocol in memory: what is tried is the agent's
bookkeeping around a send that fails, which a real broker fails at a moment no test picks.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from labd.agent import reporter as agent_module
from labd.agent.backends import EmulatedBackend
from labd.agent.reporter import Agent
from labd.errors import LinkDown
from labd.hostwire import JobProgress


class Link:
    """Takes events; ``fail_first``: the first send fails as a link lost in it does."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.fail_first = fail_first
        self.sent: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        if self.fail_first:
            self.fail_first = False
            raise LinkDown("MQTT: the connection was lost")
        self.sent.append(json.loads(payload))
        self.arrived.set()

    async def commands(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""


def agent() -> Agent:
    return Agent(lab="x", host="h1", mqtt="mqtt://127.0.0.1:1", backend=EmulatedBackend(1))


async def sent(a: Agent, count: int) -> Link:
    """A new link, once the agent has sent ``count`` events on it."""
    link = Link()
    sending = asyncio.create_task(a._send_events(link))
    try:
        async with asyncio.timeout(5):
            while len(link.sent) < count:
                link.arrived.clear()
                await link.arrived.wait()
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
    return link


async def test_an_event_cut_off_in_its_send_goes_first_on_the_next_link() -> None:
    a = agent()
    a.post(JobProgress(job="ring", epoch=1, rank=0, progress="started"))
    a.post(JobProgress(job="ring", epoch=1, rank=0, progress="exited"))
    with pytest.raises(LinkDown):
        await a._send_events(Link(fail_first=True))
    assert a.queued() == 2  # the one in the send is held, not gone
    second = await sent(a, 2)
    assert [e["progress"] for e in second.sent] == ["started", "exited"]
    assert a.queued() == 0
    async with asyncio.timeout(5):
        await a._outbox.join()  # every event counted done once, whatever it took


async def test_a_long_outage_keeps_the_newest_events_and_says_how_many_went(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(agent_module, "OUTBOX_MAX", 3)
    a = agent()
    for step in range(5):
        a.post(JobProgress(job="ring", epoch=1, rank=0, progress="step", step=step))
    assert a.queued() == 3
    link = await sent(a, 3)
    assert [e["step"] for e in link.sent] == [2, 3, 4]
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert said == ["host h1: 2 events were dropped while the daemon was out of reach"]


async def test_heartbeats_carry_the_jobs_while_they_may_be_news() -> None:
    """The jobs' runs ride on the first heartbeats of a link (what the last one sent may
    be lost), on those after a change, and on one in ``JOBS_EVERY`` besides; the others
    leave them out (a pod's daemon reads every heartbeat)."""
    a = Agent(lab="x", host="h1", mqtt="mqtt://127.0.0.1:1", backend=EmulatedBackend(1),
              interval=0.01)
    beats: list[dict[str, Any]] = []
    enough = asyncio.Event()
    wanted = [2 * agent_module.JOBS_EVERY]

    class Beats(Link):
        async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
            if kind == "heartbeat":
                beats.append(json.loads(payload))
                if len(beats) >= wanted[0]:
                    enough.set()

    a.jobs.runs["ring"] = {"job": "ring", "epoch": 1, "run": "r1",
                           "ranks": [{"rank": 0, "at": {"started": 5}, "code": None}]}
    reporting = asyncio.create_task(a._report(Beats()))
    try:
        async with asyncio.timeout(10):
            await enough.wait()
            carried = [i for i, b in enumerate(beats) if b["jobs"] is not None]
            news = agent_module.NEWS_BEATS
            assert carried[:news] == list(range(news))
            assert set(carried[news:]) <= {i for i in range(len(beats))
                                           if i % agent_module.JOBS_EVERY == 0}
            assert beats[0]["jobs"][0]["run"] == "r1"
            enough.clear()
            at = len(beats)
            wanted[0] = at + news + 1
            a.jobs.runs["ring"]["ranks"][0]["at"]["ready"] = 6
            a.jobs.version += 1
            await enough.wait()
        after = [b for b in beats[at:] if b["jobs"] is not None]
        assert len(after) >= news and after[0]["jobs"][0]["ranks"][0]["at"]["ready"] == 6
    finally:
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting
