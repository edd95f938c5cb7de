"""A takeover opens its instruments without waiting out one that does not answer: a
device stalled at the takeover is reported still opening and left to come online by
itself (its open goes on), while the daemon leads. In memory, no socket."""

from __future__ import annotations

import asyncio

from instruments.events import LinkState
from instruments.polatis_scpi import PolatisScpi
from instruments.transports.memory import FarEnd, Script, served
from labd.fabric import drift
from labd.fabric.drift import open_instruments
from tests.instruments.test_drivers_scripted import FAST, IDN, STAT_EMPTY


async def stalled(end: FarEnd) -> None:
    """Takes every byte and answers none, as a device stalled by a fault does."""
    while await end.reader.read(4096):
        pass


async def test_a_takeover_does_not_wait_out_a_device_that_does_not_answer() -> None:
    with served(stalled) as silent, served(Script([[IDN, STAT_EMPTY]])) as fine:
        drivers = {"ocs1": PolatisScpi(fine, name="ocs1", backoff=FAST),
                   "ocs2": PolatisScpi(silent, name="ocs2", backoff=FAST)}
        held = set(drift._STILL_OPENING)
        try:
            # Long enough for the device that answers on a loaded machine; the stalled one
            # answers nothing, whatever the wait.
            report = await open_instruments(drivers, wait_s=2)
            assert report.connected == {"ocs1": "Polatis N-OST-16x16-LA1-DMHNS"}
            assert report.failed == {
                "ocs2": "still opening after 2 s; dealt with when it comes online"}
            assert drivers["ocs2"].state is LinkState.CONNECTING  # its open goes on
            assert len(drift._STILL_OPENING - held) == 1
        finally:
            for driver in drivers.values():
                await driver.close()
        # The open it was left to ends with its instrument.
        # (Its own done callback, added first, has run by the time the wait returns.)
        if left := drift._STILL_OPENING - held:
            await asyncio.wait(left, timeout=10)
        assert not drift._STILL_OPENING - held


async def test_without_a_bound_start_up_waits_for_every_answer() -> None:
    with served(Script([[IDN, STAT_EMPTY]])) as fine:
        driver = PolatisScpi(fine, name="ocs1", backoff=FAST)
        try:
            report = await open_instruments({"ocs1": driver})
        finally:
            await driver.close()
    assert list(report.connected) == ["ocs1"] and not report.failed
