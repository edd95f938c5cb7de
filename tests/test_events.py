"""The event stream: snapshot then sequence-numbered deltas; a slow subscriber is cut off
cleanly instead of slowing the daemon."""

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
