"""Drivers against the emulators over real TCP and a real pty, faults included."""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from emulators import EmulatedLab, EmulatorSpec
from instruments import DeviceError, InstrumentTimeout, ProtocolError
from instruments.calient import CalientTl1
from instruments.connection import Backoff
from instruments.errors import InstrumentClosed
from instruments.events import EventQueue, LinkState
from instruments.link import LinkSettings
from instruments.polatis_scpi import PolatisScpi
from instruments.polatis_tl1 import PolatisTl1
from instruments.switch import OpticalSwitch, PortState

FAST = Backoff(initial=0.01, maximum=0.05)


@asynccontextmanager
async def driver(lab: EmulatedLab, kind: str, timeout: float = 1.0) -> AsyncIterator[OpticalSwitch]:
    settings = {"timeout": timeout}
    if kind == "polatis-scpi":
        sw: OpticalSwitch = PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1",
                                        backoff=FAST, settings=LinkSettings(**settings))
    elif kind == "polatis-pty":
        sw = PolatisScpi(lab.endpoints["ocspty"]["scpi"] + "?baud=38400", name="ocspty",
                         backoff=FAST, settings=LinkSettings(**settings))
    elif kind == "polatis-tl1":
        sw = PolatisTl1(lab.endpoints["ocs1"]["tl1"], name="ocs1", backoff=FAST, user="admin",
                        password="root",
                        settings=LinkSettings(write_termination="\r\n", **settings))
    else:
        sw = CalientTl1(lab.endpoints["cal"]["tl1"], name="cal", backoff=FAST, user="admin",
                        password="secret",
                        settings=LinkSettings(write_termination="\r\n", **settings))
    async with sw:
        yield sw


def ports(sw: OpticalSwitch) -> tuple[int, int]:
    assert sw.info is not None
    return (sw.info.ingress, sw.info.ingress + 1) if sw.info.egress else (1, 2)


def emulator_of(sw: OpticalSwitch) -> str:
    return sw.name


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "calient-tl1", "polatis-pty"])
async def test_capability_round_trip(lab: EmulatedLab, kind: str) -> None:
    async with driver(lab, kind) as sw:
        info = sw.info
        assert info is not None
        n = info.ingress
        a = [(1, n + 1), (2, n + 2)] if info.egress else [(1, 40), (2, 41)]
        b = [(3, n + 3)] if info.egress else [(3, 42)]
        await sw.connect(a)
        assert await sw.cross_connects() == dict(a)
        await sw.connect(b)
        await sw.disconnect([a[0][1]])
        expected = {**dict(a[1:]), **dict(b)}
        assert await sw.cross_connects() == expected
        assert lab.device(emulator_of(sw)).model.connections == expected
        # replace keeps what stays the same: only the changed pairs move
        before = len(lab.truth(emulator_of(sw))["changes"])
        target = {**dict(b), **({4: n + 4} if info.egress else {4: 43})}
        await sw.replace(target)
        assert await sw.cross_connects() == target
        changes = lab.truth(emulator_of(sw))["changes"][before:]
        moved = {tuple(p) for c in changes for p in c["connected"] + c["disconnected"]}
        assert tuple(b[0]) not in moved
        states = await sw.port_states([1, 2])
        assert set(states.values()) == {PortState.ENABLED}
        await sw.replace({})
        assert await sw.cross_connects() == {}


async def test_ground_truth_brackets_what_the_driver_measured(lab: EmulatedLab) -> None:
    lab.set_timing("ocs1", {"switch_time_ms": 15, "jitter_ms": 0})
    async with driver(lab, "polatis-scpi") as sw:
        sent = time.monotonic_ns()
        await sw.connect([(5, 21)])
        acked = time.monotonic_ns()
    (change,) = lab.truth("ocs1")["changes"]
    assert sent <= change["arrived_ns"] <= change["settled_ns"] <= acked
    # Mirrors start moving once the command is parsed, a little after its last byte arrived.
    assert change["settled_ns"] - change["arrived_ns"] >= 15_000_000
    assert change["connected"] == [[5, 21]]


async def test_a_two_phase_switch_says_which_command_moved_the_light(
        lab: EmulatedLab) -> None:
    async with driver(lab, "calient-tl1") as cal, driver(lab, "polatis-scpi") as ocs:
        made = await cal.connect([(7, 40)])  # ENT-CRS, then ACT-CRS moves the mirrors
        sent, answered = made.sent_ns, made.answered_ns
        activated, acknowledged = made.activated_ns, made.acknowledged_ns
        assert None not in (sent, answered, activated, acknowledged)
        (act,) = lab.truth("cal")["changes"][-1:]
        assert act["op"] == "act-crs"
        assert sent < activated <= act["arrived_ns"] <= act["settled_ns"] <= acknowledged
        assert acknowledged == answered
        broken = await cal.disconnect([7])  # CANC-CRS moves them, DLT-CRS only forgets it
        canc = next(c for c in lab.truth("cal")["changes"] if c["op"] == "canc-crs")
        sent, answered = broken.sent_ns, broken.answered_ns
        activated, acknowledged = broken.activated_ns, broken.acknowledged_ns
        assert sent == activated <= canc["arrived_ns"] <= canc["settled_ns"] <= acknowledged
        assert acknowledged < answered  # the DLT-CRS exchange came after
        one = await ocs.connect([(6, 22)])  # one command: it is the one that moves the light
        assert one.sent_ns is not None and one.answered_ns is not None
        assert (one.activated_ns, one.acknowledged_ns) == (one.sent_ns, one.answered_ns)
    async with driver(lab, "polatis-tl1") as tl1:
        replaced = await tl1.replace({3: 19})  # RTRV-PATCH to plan it, then ENT-PATCH
        sent, activated = replaced.sent_ns, replaced.activated_ns
        acknowledged = replaced.acknowledged_ns
        assert sent is not None and activated is not None and acknowledged is not None
        (ent,) = lab.truth("ocs1")["changes"][-1:]
        assert sent < activated <= ent["arrived_ns"] <= ent["settled_ns"] <= acknowledged


async def test_many_callers_one_command_on_the_wire(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-scpi") as sw:
        await asyncio.gather(*(sw.connect([(i, 16 + i)]) for i in range(1, 17)),
                             *(sw.port_states() for _ in range(8)))
        assert await sw.cross_connects() == {i: 16 + i for i in range(1, 17)}
    # Every change arrived after the previous one settled: nothing overlapped on the link.
    changes = lab.truth("ocs1")["changes"]
    assert len(changes) == 16
    for prev, nxt in itertools.pairwise(changes):
        assert nxt["arrived_ns"] >= prev["settled_ns"]


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "calient-tl1"])
async def test_cut_mid_command_reconnects_resyncs_and_reports_drift(lab: EmulatedLab,
                                                                    kind: str) -> None:
    async with driver(lab, kind) as sw:
        p, q = ports(sw)
        events = EventQueue(sw)
        lab.inject(emulator_of(sw), {"kind": "drop", "apply": True})
        with pytest.raises(InstrumentClosed):
            await sw.connect([(p, q)])
        resync = await events.next("resync")
        assert resync.drift is not None
        # The device did what it was told before the cut; the driver did not hear it.
        if kind == "calient-tl1":
            # ENT-CRS ran, the cut came on it: provisioned, no light, so no drift in light.
            assert not resync.drift
            assert isinstance(sw, CalientTl1)
            assert await sw.provisioned() == [(p, q)]
        else:
            assert resync.drift.unexpected == {p: q}
            assert sw.expected == {p: q}
        assert sw.state is LinkState.ONLINE


async def test_stall_times_out_then_recovers(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-scpi", timeout=0.3) as sw:
        events = EventQueue(sw)
        lab.inject("ocs1", {"kind": "stall", "count": 1})
        with pytest.raises(InstrumentTimeout):
            await sw.connect([(1, 17)])
        await events.next("resync")
        await sw.connect([(1, 17)])
        assert await sw.cross_connects() == {1: 17}


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1"])
async def test_garbage_reply_is_a_protocol_error_then_recovers(lab: EmulatedLab,
                                                               kind: str) -> None:
    async with driver(lab, kind) as sw:
        events = EventQueue(sw)
        lab.inject("ocs1", {"kind": "garbage"})
        with pytest.raises(ProtocolError):
            await sw.connect([(2, 18)])
        resync = await events.next("resync")
        # The switch did carry the command out; only the reply was garbled.
        assert resync.drift is not None and resync.drift.unexpected == {2: 18}


async def test_delayed_replies_still_arrive_within_the_timeout(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-tl1", timeout=2.0) as sw:
        lab.inject("ocs1", {"kind": "delay", "delay_ms": 50, "count": 2})
        await sw.connect([(3, 19)])
        assert await sw.cross_connects() == {3: 19}
        assert lab.device("ocs1").faults.active == []


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "calient-tl1"])
async def test_failed_port_is_refused_by_the_device(lab: EmulatedLab, kind: str) -> None:
    async with driver(lab, kind) as sw:
        p, q = ports(sw)
        lab.inject(emulator_of(sw), {"kind": "fail_port", "port": q})
        states = await sw.port_states([q])
        assert states[q] is PortState.FAILED
        with pytest.raises(DeviceError):
            await sw.connect([(p, q)])
        assert sw.expected == {}
        lab.inject(emulator_of(sw), {"kind": "restore_port", "port": q})
        await sw.connect([(p, q)])


@pytest.mark.parametrize("kind", ["polatis-scpi", "polatis-tl1", "calient-tl1"])
async def test_busy_port_is_refused_and_nothing_changes(lab: EmulatedLab, kind: str) -> None:
    async with driver(lab, kind) as sw:
        p, q = ports(sw)
        await sw.connect([(p, q)])
        with pytest.raises(DeviceError):
            await sw.connect([(p - 1, q)] if p > 1 else [(p + 2, q)])
        assert await sw.cross_connects() == {p: q}


async def test_polatis_tl1_autonomous_alarm_surfaces_as_event(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-tl1") as sw:
        events = EventQueue(sw)
        lab.inject("ocs1", {"kind": "fail_port", "port": 5})
        await sw.cross_connects()  # the alarm block arrives ahead of this reply
        event = await events.next("autonomous")
        assert event.detail == "REPT ALM PORT"
        assert event.data["lines"] == ["5:CR,PORTFAIL,SA"]


async def test_polatis_power_follows_the_light(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-tl1") as sw:
        await sw.connect([(1, 17)])
        power = await sw.port_power([17, 18])
        assert power[17] > -10 and power[18] <= -60


async def test_reconnect_after_the_emulator_drops_every_connection(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-scpi") as sw:
        events = EventQueue(sw)
        lab.inject("ocs1", {"kind": "drop", "now": True})
        with pytest.raises((InstrumentClosed, InstrumentTimeout)):
            await sw.cross_connects()
        resync = await events.next("resync")
        assert not resync.drift
        assert await sw.cross_connects() == {}


async def test_disconnect_a_pair_someone_else_made(lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-scpi") as scpi_side, driver(lab, "polatis-tl1") as tl1_side:
        events = EventQueue(scpi_side)
        await tl1_side.connect([(6, 22)])
        await scpi_side.disconnect([22])  # an egress port the SCPI driver never saw connected
        drift = await events.next("drift")
        assert drift.drift is not None and drift.drift.unexpected == {6: 22}
        assert lab.device("ocs1").model.connections == {}
        assert scpi_side.expected == {}


async def test_calient_quirks_prompt_and_login_not_active(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="instruments.wire")
    options = {"ports": 16, "users": {"admin": "secret"}, "prompt": "agent> ",
               "login_settle_ms": 100}
    async with EmulatedLab([EmulatorSpec("cal", "calient", options, {"technology": "ideal"})],
                           control=False) as emulated:
        cal = CalientTl1(emulated.endpoints["cal"]["tl1"], name="cal", user="admin",
                         password="secret", login_retry_delay=0.15)
        async with cal:
            await cal.connect([(1, 2)])
            assert await cal.cross_connects() == {1: 2}
    # The first command after login was refused, and the driver waited and retried.
    assert "Login Not Active" in caplog.text
    assert "agent> " in caplog.text


async def test_password_never_reaches_the_wire_log(lab: EmulatedLab,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="instruments.wire")
    async with driver(lab, "calient-tl1"):
        pass
    assert "ACT-USER::admin:1::***;" in caplog.text
    assert "secret" not in caplog.text


async def test_power_cycle_reconnects_and_reports_what_a_dark_boot_lost(
        lab: EmulatedLab) -> None:
    async with driver(lab, "polatis-scpi") as sw:
        await sw.connect([(1, 17), (2, 18)])
        events = EventQueue(sw)
        await lab.power("ocs1", on=False)
        with pytest.raises(InstrumentClosed):
            await sw.cross_connects()
        # Reconnect attempts fail while the power is off; the driver keeps trying.
        while (await events.next("state")).state is not LinkState.CONNECTING:
            pass
        assert (await events.next("state")).state is LinkState.BACKOFF
        await lab.power("ocs1", on=True)
        resync = await events.next("resync")
        assert resync.drift is not None and resync.drift.missing == {1: 17, 2: 18}
        assert sw.state is LinkState.ONLINE and sw.expected == {}
