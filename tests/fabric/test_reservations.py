"""Per-port reservations: overlapping requests take turns, disjoint ones run at once, and a
request cancelled while it waits leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from labd.fabric.reservations import Reservations


async def test_overlapping_holds_take_turns_and_disjoint_ones_do_not_wait() -> None:
    reservations = Reservations()
    order: list[str] = []
    first_in, release_first = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with reservations.hold({("s1", 1), ("s1", 17)}):
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def overlapping() -> None:
        async with reservations.hold({("s1", 17), ("s1", 2)}):
            order.append("overlapping in")

    async def disjoint() -> None:
        async with reservations.hold({("s1", 3), ("s2", 1)}):
            order.append("disjoint in")

    one = asyncio.create_task(first())
    await asyncio.wait_for(first_in.wait(), 5)
    two = asyncio.create_task(overlapping())
    await asyncio.wait_for(disjoint(), 5)  # not held up by the first's hold
    assert reservations.busy({("s1", 17)}) and not reservations.busy({("s1", 2)})
    assert "overlapping in" not in order
    release_first.set()
    await asyncio.wait_for(asyncio.gather(one, two), 5)
    assert order == ["first in", "disjoint in", "first out", "overlapping in"]
    assert not reservations.busy({("s1", 1), ("s1", 2), ("s1", 3), ("s1", 17), ("s2", 1)})


async def test_a_request_cancelled_while_it_waits_takes_nothing() -> None:
    reservations = Reservations()
    held = reservations.hold({1, 2})
    await held.__aenter__()
    # The waiting request's entry, stepped by hand: it runs up to its wait and yields the
    # future it waits on (no turn of the loop to guess at), then is cancelled there.
    entering = reservations.hold({2, 3}).__aenter__()
    waited = entering.send(None)
    assert reservations._waiting == [waited]
    with pytest.raises(asyncio.CancelledError):
        entering.throw(asyncio.CancelledError())
    assert reservations._waiting == [] and not reservations.busy({3})
    await held.__aexit__(None, None, None)
    assert not reservations.busy({1, 2, 3})
    async with reservations.hold({2, 3}):  # free for the next
        assert reservations.busy({2})
