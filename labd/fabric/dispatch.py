"""What the engine sends a switch: a planned change, timed from the wire, and its undoing.

After a command that failed, the switch is read back, so that a half-applied change is
reported rather than silently kept as intended.
"""

from __future__ import annotations

from collections.abc import Mapping

from instruments.errors import InstrumentError
from instruments.events import Drift
from instruments.exchange import NOTHING, Exchange
from instruments.switch import OpticalSwitch, Pair
from labd.events import EventHub
from labd.fabric.planning import Change

__all__ = ["read_back", "send", "timed", "undo"]


async def send(change: Change) -> Exchange:
    """The change's driver calls: a replace, or a break then a make. Its wire times are the
    first operation's first command out and first that moved the light, and the reply to the
    last operation's last that moved it."""
    switch = change.switch
    if change.target is not None:
        return await switch.replace(change.whole if change.whole is not None
                                    else change.target)
    wire: Exchange = NOTHING
    if change.brk:
        wire = await switch.disconnect([a for a, _ in change.brk])
    if change.make:
        assert change.asked is not None
        made = await switch.connect(change.asked.only(change.make))
        wire = wire.then(made) if change.brk else made
    return wire


def timed(wire: Exchange, dispatched: int, acknowledged: int, done_on_reply: bool
          ) -> tuple[int, int, int]:
    """(dispatched, activated, acknowledged) of a change sent at ``dispatched`` whose call
    returned at ``acknowledged``, both the event loop's stamps: where the wire has its own,
    the device's time, from the command leaving to the reply to the one that moved the light
    arriving, not counting the event loop's turns around them (nor a two-phase switch's
    tidying up after it)."""
    sent, moved, answered = wire.sent_ns, wire.activated_ns, wire.acknowledged_ns
    if sent is not None and moved is not None and answered is not None and done_on_reply:
        dispatched = max(dispatched, sent)
        return dispatched, max(dispatched, moved), answered
    return dispatched, dispatched, acknowledged


async def undo(switch: OpticalSwitch, intended: dict[int, int], make: list[Pair],
               brk: list[Pair], whole: bool) -> None:
    """Put a switch back to ``intended`` after a change of ``make`` and ``brk`` (or, for
    ``whole``, a whole-map replacement)."""
    if whole:
        await switch.replace(intended)
    else:
        if make:
            await switch.disconnect([a for a, _ in make])
        if brk:
            await switch.connect(brk)


async def read_back(name: str, switch: OpticalSwitch,
                    intended: Mapping[str, dict[int, int]], hub: EventHub) -> str:
    """After a failed command, what switch ``name`` now holds, as words for the error: a
    difference from its intended state (as it is once the switch answered) is also
    announced as drift."""
    try:
        observed = await switch.cross_connects()
    except InstrumentError:
        return " (the switch could not be read back; it will be compared on reconnect)"
    drift = Drift.between(intended[name], observed)
    if not drift:
        return " (the switch is unchanged)"
    hub.publish("drift", {"switch": name,
                          "missing": [[a, b] for a, b in drift.missing.items()],
                          "unexpected": [[a, b] for a, b in drift.unexpected.items()]})
    return (f" (the switch now differs from the intended state: missing "
            f"{sorted(drift.missing.items())}, unexpected {sorted(drift.unexpected.items())})")
