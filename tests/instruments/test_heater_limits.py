"""Heater limits on a Qontrol-style board: programmed into the board at connect, checked on
reconnect, every value beyond one refused before a byte is sent, and the board's own
alarm when a channel is driven past its current limit."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.lab import EmulatedLab, EmulatorSpec, ServeSpec
from instruments.connection import Backoff
from instruments.errors import ConnectError, DeviceError, InvalidRequest
from instruments.events import EventQueue, LinkState
from instruments.mesh import MeshSwitch
from instruments.qontrol import QontrolBoard

LIMITS = {"vmax": 6.0, "imax": 20.0, "channel_limits": {3: {"vmax": 4.0, "imax": 10.0},
                                                        9: {"vmax": 2.5, "imax": None}}}


def board_lab(ports: int = 8, **options: object) -> EmulatedLab:
    return EmulatedLab([EmulatorSpec("mesh", "mesh", {"ports": ports, **options}, {},
                                     serve={"serial": ServeSpec(serve="pty")})])


@pytest.fixture
async def lab8() -> AsyncIterator[EmulatedLab]:
    async with board_lab() as lab:
        yield lab


def address(lab: EmulatedLab) -> str:
    return lab.endpoints["mesh"]["serial"]


async def test_the_board_is_given_its_limits_at_connect(lab8: EmulatedLab) -> None:
    device = lab8.device("mesh")
    async with QontrolBoard(address(lab8), name="board", **LIMITS):
        vmax, imax = device.vmax, device.imax  # type: ignore[attr-defined]
        assert vmax[3] == 4.0 and vmax[9] == 2.5 and imax[3] == 10.0
        assert all(vmax[ch] == 6.0 for ch in range(24) if ch not in (3, 9))
        assert all(imax[ch] == 20.0 for ch in range(24) if ch != 3)
        programmed = [w for w in device.writes if w[0] in ("VMAX", "IMAX")]  # type: ignore[attr-defined]
        assert len(programmed) == 48  # every channel once, both limits


async def test_a_value_beyond_a_limit_is_refused_with_nothing_sent(lab8: EmulatedLab) -> None:
    device = lab8.device("mesh")
    async with QontrolBoard(address(lab8), name="board", **LIMITS) as board:
        writes = len(device.writes)  # type: ignore[attr-defined]
        sent = board.connection.link.bytes_out
        with pytest.raises(InvalidRequest, match=r"4\.5 V on channel 3 is beyond channel "
                                                 r"3's vmax of 4 V; nothing was sent"):
            await board.set_volts({0: 1.0, 3: 4.5})
        with pytest.raises(InvalidRequest, match=r"the board's vmax of 6 V"):
            await board.set_volts({5: 6.5})
        with pytest.raises(InvalidRequest, match=r"channel 3's imax of 10 mA"):
            await board.set_currents({3: 12.0})
        assert len(device.writes) == writes  # type: ignore[attr-defined]
        assert board.connection.link.bytes_out == sent
        assert device.volts[0] == 0.0  # type: ignore[attr-defined]
        await board.set_volts({3: 4.0, 9: 2.5})  # at the limit is allowed
        assert device.volts[3] == 4.0  # type: ignore[attr-defined]


async def test_limits_lost_in_a_power_cycle_are_set_again_on_reconnect(
        lab8: EmulatedLab) -> None:
    """A board keeps no settings through a power cycle: its limits are back at full scale
    when the liveness watch finds it restarted, and labd sets them again and says so."""
    device = lab8.device("mesh")
    async with QontrolBoard(address(lab8), name="board", backoff=Backoff(0.01, 0.05),
                            watch_interval_s=0.05, **LIMITS) as board:
        events = EventQueue(board)
        await lab8.power("mesh", False)
        while (await events.next("state", timeout=10)).state is not LinkState.BACKOFF:
            pass  # the watch found the board gone
        await lab8.power("mesh", True)
        assert device.vmax[3] == 12.0  # type: ignore[attr-defined]
        warning = await events.next("warning", timeout=10)
        assert "vmax3 12 → 4" in warning.detail and "and 40 more; set again" in warning.detail
        assert device.vmax[3] == 4.0 and device.imax[7] == 20.0  # type: ignore[attr-defined]


async def test_a_limit_beyond_full_scale_or_the_board_is_refused_at_connect(
        lab8: EmulatedLab) -> None:
    board = QontrolBoard(address(lab8), name="board", vmax=15.0)
    with pytest.raises(ConnectError, match=r"vmax 15 V for channel 0 is beyond the board's "
                                           r"full scale of 12 V"):
        await board.connection.open()
    await board.close()
    board = QontrolBoard(address(lab8), name="board",
                         channel_limits={40: {"vmax": 3.0}})
    with pytest.raises(ConnectError, match=r"channel 40, but the board drives channels "
                                           r"0\.\.23"):
        await board.connection.open()
    await board.close()


async def test_a_channel_driven_past_its_current_limit_is_an_alarm_the_driver_reads(
        lab8: EmulatedLab) -> None:
    """500 Ω heaters: 6 V draws 12 mA, past channel 3's 10 mA; the board holds the current
    at its limit and says so, the driver raises it as the board's error."""
    device = lab8.device("mesh")
    async with QontrolBoard(address(lab8), name="board", imax=10.0) as board:
        with pytest.raises(DeviceError) as alarm:
            await board.set_volts({3: 6.0})
        assert alarm.value.code == 2 and "over-current on channel 3" in str(alarm.value)
        assert device.alarms == {3: "over-current"}  # type: ignore[attr-defined]
        assert (await board.currents())[3] == 10.0
        assert (await board.volts())[3] == 5.0


async def test_a_calibration_beyond_the_heaters_limit_is_refused_before_connecting() -> None:
    with pytest.raises(InvalidRequest, match=r"heater 0 needs 5 V for the bar state \(its "
                                             r"calibration\) but the board's vmax of 4 V"):
        MeshSwitch("serial:///dev/null", name="mesh", size="8x8", vmax=4.0)
    with pytest.raises(InvalidRequest, match=r"heater 2 needs 5 V .* channel 2's vmax of 3 V"):
        MeshSwitch("serial:///dev/null", name="mesh", size="8x8", vmax=8.0,
                   channel_limits={2: {"vmax": 3.0}})


async def test_the_mesh_programs_its_heaters_limits_and_routes_within_them(
        lab8: EmulatedLab) -> None:
    device = lab8.device("mesh")
    async with MeshSwitch(address(lab8), name="mesh", size="8x8", vmax=5.5,
                          channel_limits={4: {"vmax": 5.0}}) as mesh:
        assert device.vmax[0] == 5.5 and device.vmax[4] == 5.0  # type: ignore[attr-defined]
        await mesh.replace({1: 16, 2: 15, 3: 14, 4: 13, 5: 12, 6: 11, 7: 10, 8: 9})
        assert max(device.volts) <= 5.5  # type: ignore[attr-defined]


@st.composite
def requests(draw: st.DrawFn) -> list[tuple[str, dict[int, float]]]:
    calls = []
    for _ in range(draw(st.integers(1, 6))):
        word = draw(st.sampled_from(["v", "i"]))
        top = 14.0 if word == "v" else 26.0
        values = draw(st.dictionaries(st.integers(0, 23),
                                      st.floats(0, top, allow_nan=False), min_size=1,
                                      max_size=5))
        calls.append((word, values))
    return calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_no_sequence_of_set_calls_sends_a_value_past_a_limit(
        calls: list[tuple[str, dict[int, float]]]) -> None:
    """Whatever is asked, in whatever order, the board never receives a value past the
    channel's limit (its log of every set command received says so), and each call is
    either refused whole or sent whole."""
    limits = LIMITS["channel_limits"]

    def limit(ch: int, word: str) -> float:
        own = limits.get(ch, {}).get("vmax" if word == "v" else "imax")  # type: ignore[attr-defined]
        return own if own is not None else (6.0 if word == "v" else 20.0)

    async def scenario() -> None:
        async with board_lab(heater_ohms=1000.0) as lab, \
                QontrolBoard(address(lab), name="board", **LIMITS) as board:
            device = lab.device("mesh")
            start = len(device.writes)  # type: ignore[attr-defined]
            for word, values in calls:
                beyond = any(v > limit(ch, word) for ch, v in values.items())
                before = len(device.writes)  # type: ignore[attr-defined]
                try:
                    await (board.set_volts if word == "v" else board.set_currents)(values)
                except InvalidRequest:
                    assert beyond
                    assert len(device.writes) == before  # type: ignore[attr-defined]
                else:
                    assert not beyond
            for word, first, values in list(device.writes)[start:]:  # type: ignore[attr-defined]
                kind = "v" if word in ("V", "VVEC") else "i"
                for offset, value in enumerate(values):
                    assert value <= limit(first + offset, kind)

    asyncio.run(scenario())
