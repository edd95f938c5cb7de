"""The takeover's order, on callables alone: the store fenced first, the resync run as the
takeover (changes refused to everyone else meanwhile), then leading, then the event. No
daemon and no database: the lease is given its epoch as a won acquire would."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import pytest

from labd import deadlines
from labd.ha.leadership import Leadership, Takeover
from labd.ha.lease import Lease
from labd.ha.role import Role


def won(name: str, epoch: int) -> Role:
    lease = Lease("postgresql://nobody@127.0.0.1/none", name)
    lease.api_url = "http://127.0.0.1:1"
    lease.epoch, lease._valid_until = epoch, time.monotonic() + 3600  # as acquire() sets
    return Role(lease)


async def test_a_takeover_fences_resyncs_then_leads_and_says_so() -> None:
    role = won("lab-a", 7)
    steps: list[Any] = []

    async def resync() -> Iterable[str]:
        # The takeover's own work may change the lab; nobody else's may yet.
        steps.append(("resync", role.holds(), role.ready))
        return ["pm1", "ocs2"]

    def spawn(work: Coroutine[Any, Any, None], name: str) -> None:
        work.close()
        steps.append(("spawn", name))

    def lead() -> int:
        steps.append(("lead", role.ready))
        return 2

    leadership = Leadership(role, Takeover(
        fence=lambda name, epoch: steps.append(("fence", name, epoch)), resync=resync,
        lead=lead,
        publish=lambda kind, data: steps.append((kind, data)), spawn=spawn))
    await leadership.take_over()
    assert steps[:3] == [("fence", "lab-a", 7), ("resync", True, False), ("lead", True)]
    kind, data = steps[3]
    assert kind == "ha.leading" and data["epoch"] == 7 and data["recoveries"] == 2
    assert data["failed"] == ["ocs2", "pm1"] and data["url"] == "http://127.0.0.1:1"
    assert role.ready and role.holds() and role.took_over_ms is not None
    assert role.name == "leader"


async def test_a_lease_that_cannot_be_given_up_is_left_to_run_out(
        caplog: pytest.LogCaptureFixture) -> None:
    role = won("lab-b", 1)  # on a database where nothing listens (port 1)
    role.lease.url = "postgresql://nobody@127.0.0.1:1/none"

    async def resync() -> Iterable[str]:
        return []

    leadership = Leadership(role, Takeover(
        fence=lambda *_: None, resync=resync, lead=lambda: 0, publish=lambda *_: None,
        spawn=lambda *_: None))
    with caplog.at_level(logging.WARNING, logger="labd.ha.leadership"):
        await leadership.step_down(deadlines.current().times(5))
    assert "the lease was not given up" in caplog.text
    assert not role.lease.holds()  # released locally all the same


async def test_a_release_that_times_out_is_said_and_the_step_down_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    """A SIGTERMed leader whose database did not answer the release in time: a TimeoutError
    says nothing, and its empty message once ended the step-down with an IndexError (a
    traceback, exit status 1, in the soak)."""
    role = won("lab-c", 1)
    never = asyncio.Event()

    async def release() -> None:
        await never.wait()
    role.lease.release = release  # type: ignore[method-assign]
    leadership = Leadership(role, Takeover(
        fence=lambda *_: None, resync=lambda: asyncio.sleep(0, []), lead=lambda: 0,
        publish=lambda *_: None, spawn=lambda *_: None))
    with caplog.at_level(logging.WARNING, logger="labd.ha.leadership"):
        await leadership.step_down(0.01)
    assert "the lease was not given up (TimeoutError)" in caplog.text
