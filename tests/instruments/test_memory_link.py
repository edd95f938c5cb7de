"""Drivers over the in-memory link (instruments/transports/memory.py): a script or an
emulator's protocol interface in this process, no socket; what a change returns (its own
wire times, however calls overlap); pairs checked once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from emulators import EmulatedLab, EmulatorSpec
from instruments.errors import ConnectError, InstrumentClosed, NoSuchPort
from instruments.events import EventQueue, LinkState
from instruments.exchange import NOTHING, Exchange
from instruments.polatis_scpi import PolatisScpi
from instruments.switch import CheckedPairs
from instruments.transports.memory import CLOSE, Script, served, sessions
from tests.instruments.test_drivers_scripted import FAST, IDN, STAT_EMPTY


@contextmanager
def emulated(size: str = "16x16", switch_ms: float = 1) -> Iterator[tuple[EmulatedLab, str]]:
    """A Polatis emulator, never started (nothing listens), its SCPI interface served in
    memory: (the emulated lab, for its ground truth; the driver's address)."""
    lab = EmulatedLab([EmulatorSpec("ocs1", "polatis", {"size": size},
                                    {"switch_time_ms": switch_ms, "jitter_ms": 0})],
                      control=False)
    with served(sessions(lab.device("ocs1").interfaces()["scpi"])) as address:
        yield lab, address


async def test_a_script_plays_over_memory_as_over_a_socket() -> None:
    script = Script([[IDN, STAT_EMPTY,
                      (b":OXC:SWIT:CONN:ADD (@1),(@17);*OPC?;:SYST:ERR?\n",
                       b'1;0, "No error"\r\n')]])
    with served(script) as address:
        assert address.startswith("memory://")
        async with PolatisScpi(address, name="ocs", backoff=FAST) as ocs:
            made = await ocs.connect([(17, 1)])
            assert made.sent_ns is not None and made.answered_ns is not None
            assert made.sent_ns < made.answered_ns
            assert await ocs.connect([]) is NOTHING  # nothing to send, nothing sent
    assert not script.mismatches
    assert script.done.is_set()


async def test_nothing_served_is_a_connect_error_and_a_closed_line_is_seen() -> None:
    with pytest.raises(ConnectError, match="nothing served there"):
        await PolatisScpi("memory://nobody", name="ocs").open()
    # The device closes the line instead of answering: the command fails, the driver
    # goes into backoff and comes back by itself on the next connection.
    script = Script([[IDN, STAT_EMPTY, (STAT_EMPTY[0], CLOSE)], [IDN, STAT_EMPTY]])
    with served(script) as address:
        ocs = PolatisScpi(address, name="ocs", backoff=FAST)
        events = EventQueue(ocs)
        async with ocs, asyncio.timeout(5):
            with pytest.raises(InstrumentClosed):
                await ocs.cross_connects()
            states: list[LinkState | None] = []
            while LinkState.BACKOFF not in states or states[-1] is not LinkState.ONLINE:
                states.append((await events.next("state")).state)
            assert states[:2] == [LinkState.CONNECTING, LinkState.ONLINE]  # the first open
            assert states[2:] == [LinkState.BACKOFF, LinkState.CONNECTING, LinkState.ONLINE]
        events.close()
    assert not script.mismatches


async def test_overlapping_changes_each_return_their_own_wire_times() -> None:
    with emulated(switch_ms=3) as (lab, address):
        async with PolatisScpi(address, name="ocs1", backoff=FAST) as ocs:
            first, second = await asyncio.gather(ocs.connect([(1, 17)]),
                                                 ocs.connect([(2, 18)]))
    truth = {tuple(c["connected"][0]): c for c in lab.truth("ocs1", light=False)["changes"]}
    for exchange, pair in ((first, (1, 17)), (second, (2, 18))):
        change = truth[pair]
        assert exchange.sent_ns is not None and exchange.acknowledged_ns is not None
        # Each value brackets its own change on the device, not the other's.
        assert exchange.sent_ns <= change["arrived_ns"] <= change["settled_ns"]
        assert change["settled_ns"] <= exchange.acknowledged_ns
    # One command on the wire at a time: one change's reply came before the other left.
    one, other = sorted((first, second), key=lambda e: e.sent_ns or 0)
    assert one.answered_ns is not None and other.sent_ns is not None
    assert one.answered_ns <= other.sent_ns
    assert one.then(other) == Exchange(one.sent_ns, other.answered_ns, one.activated_ns,
                                       other.acknowledged_ns)


async def test_pairs_are_checked_once_by_the_switch_that_takes_them() -> None:
    with emulated("16x16") as (_, big), emulated("8x8") as (lab, small):
        async with PolatisScpi(big, name="big", backoff=FAST) as wide, \
                PolatisScpi(small, name="small", backoff=FAST) as narrow:
            checked = wide.check_pairs([(20, 3)])
            assert checked.pairs == ((3, 20),)
            assert wide.check_pairs(checked) is checked  # taken back as it is
            assert checked.only([(3, 20), (4, 21)]).pairs == ((3, 20),)
            assert checked.only([(4, 21)]).pairs == ()
            # Checked by another switch: checked again, and refused in its own words.
            with pytest.raises(NoSuchPort, match="port 20 is not on this 8x8 switch"):
                await narrow.connect(checked)
            assert lab.truth("ocs1", light=False)["changes"] == []
            again = narrow.check_pairs({1: 9})
            assert isinstance(again, CheckedPairs)
            await narrow.connect(again)
            assert narrow.expected == {1: 9}
            # A reconnect makes the switch a new identity: what it checked before is
            # checked again (the device may have come back another size).
            await narrow.close()
            await narrow.open()
            assert narrow.check_pairs(again) is not again
