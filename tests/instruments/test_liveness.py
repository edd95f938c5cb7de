"""The liveness watch (an idle link gets one cheap query) and tolerant identification,
against the emulators over real TCP and a real pty, and scripted devices for the refusals
and restarts the emulators do not make."""

import asyncio
import re
from typing import Any

import pytest

from emulators import EmulatedLab
from instruments import qontrol
from instruments.calient import CalientTl1
from instruments.connection import Backoff
from instruments.errors import DeviceRestarted
from instruments.events import EventQueue, InstrumentEvent, LinkState
from instruments.instrument import Instrument
from instruments.link import Link, LinkSettings
from instruments.polatis_scpi import PolatisScpi
from instruments.polatis_tl1 import PolatisTl1
from instruments.switch import OpticalSwitch
from instruments.thorlabs import ThorlabsPM100
from labd import deadlines
from tests.scripted import ScriptedDevice, tl1_block

FAST = Backoff(initial=0.01, maximum=0.05)
WATCH = 0.05
"""Seconds idle before a probe, in these tests."""


def watched(lab: EmulatedLab, kind: str, **options: Any) -> OpticalSwitch:
    settings = LinkSettings(timeout=1.0, write_termination="\r\n" if "tl1" in kind else "\n")
    common: dict[str, Any] = {"backoff": FAST, "settings": settings,
                              "watch_interval_s": WATCH, **options}
    if kind == "polatis-scpi":
        return PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1", **common)
    if kind == "polatis-pty":
        return PolatisScpi(lab.endpoints["ocspty"]["scpi"] + "?baud=38400", name="ocspty",
                           **common)
    if kind == "polatis-tl1":
        return PolatisTl1(lab.endpoints["ocs1"]["tl1"], name="ocs1", user="admin",
                          password="root", **common)
    return CalientTl1(lab.endpoints["cal"]["tl1"], name="cal", user="admin",
                      password="secret", **common)


async def next_state(events: EventQueue, state: LinkState) -> InstrumentEvent:
    limit = deadlines.current().times(15)
    async with asyncio.timeout(limit):  # one deadline for them all: states keep coming
        while (event := await events.next("state", timeout=limit)).state is not state:
            pass
    return event


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "calient-tl1", "polatis-pty"])
async def test_an_idle_switch_power_cycled_is_offline_at_once_and_back_after(
        lab: EmulatedLab, kind: str) -> None:
    """Nobody sends a command: the link the device closed is dropped as it closes (TCP,
    or a pty's hang-up), the driver reconnects when the power is back, and a switch that
    came back empty says it restarted."""
    sw = watched(lab, kind, watch_interval_s=0)  # not the watch: the closed link itself
    async with sw:
        low, high = (1, 2) if kind == "calient-tl1" else (1, 17 if kind != "polatis-pty" else 9)
        await sw.connect([(low, high)])
        events = EventQueue(sw)
        await lab.power(sw.name, on=False)
        down = await next_state(events, LinkState.BACKOFF)
        assert re.search("closed|connection lost|hung up", down.detail), down.detail
        await lab.power(sw.name, on=True)
        resync = await events.next("resync", timeout=deadlines.current().times(15))
        await next_state(events, LinkState.ONLINE)
        if kind == "calient-tl1":  # its connection database survives the power cycle
            assert not resync.drift and "restarted" not in resync.data
            assert sw.expected == {low: high}
        else:  # a dark boot loses every cross-connect
            assert resync.drift is not None and resync.drift.missing == {low: high}
            assert "emptied" in resync.data["restarted"]
            assert sw.expected == {}


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "polatis-pty"])
async def test_an_idle_link_that_stops_answering_is_found_by_the_watch(
        lab: EmulatedLab, kind: str) -> None:
    """A device gone without closing the link (its power cut, a cable pulled: no FIN, no
    hang-up) is found by the watch's probe within one interval plus the timeout."""
    sw = watched(lab, kind)
    async with sw:
        events = EventQueue(sw)
        probes = sw.connection.probes
        lab.inject(sw.name, {"kind": "stall"})  # it swallows what it is sent, from now on
        down = await next_state(events, LinkState.BACKOFF)
        assert sw.connection.probes > probes  # found by a probe, not by a command
        assert "within" in down.detail, down.detail  # a timeout, said as one
        lab.clear_faults(sw.name)
        await next_state(events, LinkState.ONLINE)  # and back once it answers again


async def test_without_a_watch_interval_nothing_is_probed(lab: EmulatedLab) -> None:
    sw = watched(lab, "polatis-scpi", watch_interval_s=0)
    async with sw:
        await sw.connect([(1, 17)])
        assert sw.connection._watcher is None
        assert sw.connection.probes == 0


async def test_the_probe_waits_for_a_command_and_never_interleaves(lab: EmulatedLab) -> None:
    """Commands and probes share one lock: a burst of commands with the watch on gets every
    reply right, and the map the driver keeps is the device's."""
    sw = watched(lab, "polatis-scpi", watch_interval_s=0.001)
    async with sw:
        for i in range(1, 9):
            await sw.connect([(i, 16 + i)])
            assert await sw.cross_connects() == {p: 16 + p for p in range(1, i + 1)}
        assert sw.state is LinkState.ONLINE
    assert lab.device("ocs1").model.connections == {p: 16 + p for p in range(1, 9)}  # type: ignore[attr-defined]


TL1_LOGIN = (b"ACT-USER::admin:1::root;\r\n", tl1_block(1))


async def test_a_refused_optional_identity_query_is_a_warning_not_a_failure() -> None:
    """Some TL1 firmware denies optional retrieve commands (RTRV-NETYPE: DENY IICM); the
    switch still comes online with what the other queries told."""
    script = [TL1_LOGIN,
              (b"RTRV-NETYPE:::2:;\r\n", tl1_block(2, deny=("IICM", "Invalid command"))),
              (b"RTRV-INV::OCS:3:;\r\n", tl1_block(3, ["OCS:SN=002414,PN=x"])),
              (b"RTRV-EQPT::SYSTEM:4:::PARAMETER=SIZE;\r\n", tl1_block(4, ["SYSTEM:SIZE=16x16"])),
              (b"RTRV-PATCH:::5:;\r\n", tl1_block(5, ["1,17"]))]
    async with ScriptedDevice([script]) as dev:
        sw = PolatisTl1(dev.address, name="ocs", backoff=FAST, user="admin", password="root",
                        settings=LinkSettings(write_termination="\r\n", timeout=2))
        events = EventQueue(sw)
        async with sw:
            warning = await events.next("warning")
            assert "RTRV-NETYPE refused (IICM" in warning.detail
            assert sw.state is LinkState.ONLINE
            assert sw.info is not None and (sw.info.serial, sw.info.size) == ("002414", "16x16")
            assert sw.expected == {1: 17}
    assert not dev.mismatches


async def test_the_size_query_is_optional_only_where_the_lab_file_gives_the_size() -> None:
    refused = (b"RTRV-EQPT::SYSTEM:4:::PARAMETER=SIZE;\r\n",
               tl1_block(4, deny=("IICM", "Invalid command")))
    start = [TL1_LOGIN,
             (b"RTRV-NETYPE:::2:;\r\n", tl1_block(2, ["Polatis,N-OST-16x16-LA1,OCS,6.5.2"])),
             (b"RTRV-INV::OCS:3:;\r\n", tl1_block(3, ["OCS:SN=002414,PN=x"])), refused]
    async with ScriptedDevice([[*start, (b"RTRV-PATCH:::5:;\r\n", tl1_block(5))]]) as dev:
        sw = PolatisTl1(dev.address, name="ocs", backoff=FAST, user="admin", password="root",
                        size="16x16", settings=LinkSettings(write_termination="\r\n", timeout=2))
        async with sw:
            assert sw.info is not None and sw.info.size == "16x16"
    assert not dev.mismatches
    async with ScriptedDevice([start]) as dev:
        sw = PolatisTl1(dev.address, name="ocs", backoff=FAST, user="admin", password="root",
                        settings=LinkSettings(write_termination="\r\n", timeout=2))
        with pytest.raises(Exception, match="IICM"):
            await sw.open()
        await sw.close()


@pytest.mark.parametrize(("reply", "restarted"), [
    (b"E90:00\nQ8iv-01A0\n", "powered up (E90)"),
    (b"Q8iv-0BEE\n", "now answers 'Q8iv-0BEE'"),
    (b"OK\nQ8iv-01A0\n", None),
])
async def test_a_board_that_says_it_powered_up_has_restarted(reply: bytes,
                                                             restarted: str | None) -> None:
    """A board on a serial line restarts without the line dropping: the probe knows it by
    its "powered up" notice (E90) or another id, and says so."""
    async with ScriptedDevice([[(b"id?\n", reply)]]) as dev:
        link = Link(dev.address, LinkSettings(timeout=2))
        await link.open()
        try:
            if restarted is None:
                await qontrol.probe(link, "Q8iv-01A0")
            else:
                with pytest.raises(DeviceRestarted, match=re.escape(restarted)):
                    await qontrol.probe(link, "Q8iv-01A0")
        finally:
            await link.close()
    assert not dev.mismatches


async def test_a_meter_that_answers_as_another_device_is_reconnected() -> None:
    async with ScriptedDevice([[
        (b"*IDN?\n", b"THORLABS,PM100USB,P0012345,1.6.0\n"),
        (b":SYST:SENS:IDN?\n", b"S144C,1\n"),
        (b":SENS:AVER:COUN?\n", b"1\n"),
        (b":SENS:POW:UNIT?\n", b"W\n"),
        (b"*IDN?\n", b"THORLABS,PM100USB,P0099999,1.6.0\n"),
    ]]) as dev:
        meter: Instrument = ThorlabsPM100(dev.address, name="pm", backoff=Backoff(10, 10),
                                          watch_interval_s=WATCH)
        events = EventQueue(meter)
        async with meter:
            down = await next_state(events, LinkState.BACKOFF)
            assert "P0099999" in down.detail and "restarted or was replaced" in down.detail
    assert not dev.mismatches


async def test_the_watch_survives_a_probe_that_breaks(lab: EmulatedLab,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A driver bug in its probe is logged; the watch goes on and the link stays up."""
    sw = watched(lab, "polatis-scpi")
    calls = 0
    thrice = asyncio.Event()

    async def broken(link: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            thrice.set()
        raise RuntimeError("a bug")

    async with sw:
        sw.connection._probe = broken
        async with asyncio.timeout(deadlines.current().times(10)):
            await thrice.wait()
        assert sw.state is LinkState.ONLINE
    assert "probe failed" in caplog.text
