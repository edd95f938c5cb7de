"""The event stream: snapshot then sequence-numbered deltas; a slow subscriber is cut off
cleanly instead of slowing the daemon."""

import asyncio

from labd.events import EventHub


async def test_snapshot_then_deltas_in_order() -> None:
    hub = EventHub(lambda: {"state": "x"})
    hub.publish("a", {"n": 1})
    snapshot, sub = hub.subscribe()
    assert snapshot == {"seq": 1, "state": "x"}
    hub.publish("b", {"n": 2})
    hub.publish("c", {"n": 3})
    first, second = await sub.next(), await sub.next()
    assert first is not None and second is not None
    assert (first.seq, first.kind, second.seq) == (2, "b", 3)


async def test_a_subscriber_that_falls_behind_is_dropped_with_a_marker() -> None:
    hub = EventHub()
    _, slow = hub.subscribe(size=3)
    _, fast = hub.subscribe(size=100)
    for n in range(10):
        hub.publish("tick", {"n": n})
    assert slow.overflowed and await slow.next() is None
    events = [await fast.next() for _ in range(10)]
    assert [e.data["n"] for e in events if e is not None] == list(range(10))


async def test_closing_waits_for_the_readers_to_read_the_end() -> None:
    hub = EventHub()
    _, early = hub.subscribe()
    early.close()  # a reader that left before: nothing to wait for
    _, reader = hub.subscribe()
    hub.publish("x", {})
    read: list[str] = []

    async def read_to_the_end() -> None:
        while (event := await reader.next()) is not None:
            read.append(event.kind)
        read.append("end")
        reader.close()

    hub.close()
    reading = asyncio.ensure_future(read_to_the_end())
    async with asyncio.timeout(5):
        await hub.wait_ended(timeout=30)
    assert read == ["x", "end"]  # not before the reader had read the end and closed
    await reading
    # A reader that never closes holds the daemon's stop no longer than the timeout.
    stuck_hub = EventHub()
    stuck_hub.subscribe()
    stuck_hub.close()
    async with asyncio.timeout(5):
        await stuck_hub.wait_ended(timeout=0.01)
