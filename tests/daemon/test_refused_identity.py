"""A switch that refuses an optional identity query comes online all the same: the
start-up line says what it did not tell and why, and the warning, published before any
client could subscribe, is in the event stream's snapshot."""

from __future__ import annotations

from instruments.link import LinkSettings
from instruments.polatis_tl1 import PolatisTl1
from labd.fabric.drift import identity_line, open_instruments
from tests.instruments.test_liveness import FAST, TL1_LOGIN
from tests.labs import instrument
from tests.rigs import StartRig
from tests.scripted import ScriptedDevice, tl1_block

REFUSED = [TL1_LOGIN,
           (b"RTRV-NETYPE:::2:;\r\n", tl1_block(2, deny=("IICM", "Invalid command"))),
           (b"RTRV-INV::OCS:3:;\r\n", tl1_block(3, deny=("IICM", "Invalid command"))),
           (b"RTRV-EQPT::SYSTEM:4:::PARAMETER=SIZE;\r\n", tl1_block(4, ["SYSTEM:SIZE=16x16"])),
           (b"RTRV-PATCH:::5:;\r\n", tl1_block(5))]
WHY = ("Polatis (no model, serial or firmware: RTRV-NETYPE refused (IICM Invalid command); "
       "identified without it; RTRV-INV refused (IICM Invalid command); identified without "
       "it)")


async def test_the_start_up_line_says_what_was_not_told_and_why() -> None:
    async with ScriptedDevice([REFUSED]) as dev:
        sw = PolatisTl1(dev.address, name="sb", backoff=FAST, user="admin", password="root",
                        settings=LinkSettings(write_termination="\r\n", timeout=2))
        try:
            report = await open_instruments({"sb": sw})
            assert report.connected == {"sb": WHY}
            assert identity_line(sw) == WHY
        finally:
            await sw.close()
    assert not dev.mismatches


async def test_the_refusal_is_in_the_event_stream_snapshot(start_rig: StartRig) -> None:
    async with ScriptedDevice([REFUSED]) as dev:
        entry = instrument("sb", "polatis-tl1", emulate=False, address=dev.address,
                           user="admin", password="root", watch_interval_s=0)
        async with start_rig("refused", entry, token="t") as rig:
            assert rig.daemon.report.connected == {"sb": WHY}
            snapshot, sub = rig.daemon.hub.subscribe()
            sub.close()
            (sb,) = snapshot["instruments"]
            assert sb["state"] == "online"
            assert sb["warnings"] == [
                "RTRV-NETYPE refused (IICM Invalid command); identified without it",
                "RTRV-INV refused (IICM Invalid command); identified without it"]
