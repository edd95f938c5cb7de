"""ophyd-async Devices on the drivers, in a Bluesky RunEngine, against the emulators."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from bluesky import RunEngine
from bluesky import plan_stubs as bps
from bluesky import plans as bp
from bluesky.run_engine import call_in_bluesky_event_loop
from ophyd_async.core import init_devices

from instruments.adapters.ophyd import (
    CrossConnectTable,
    MeshDevice,
    MeterDevice,
    SwitchDevice,
)
from instruments.events import LinkState
from instruments.keysight import KeysightN77xx
from instruments.mesh import MeshSwitch
from instruments.polatis_scpi import PolatisScpi
from tests.adapters.conftest import (
    DARK_BELOW_DBM,
    INTO_MESH_DB,
    INTO_METER_DB,
    INTO_SWITCH_DB,
    LAUNCH,
    SWITCH_DB,
    ServedLab,
    through_switch,
)

#: The meter adds no noise on this bench: a reading is the optical model's to a rounding.
TOLERANCE_DB = 0.02


@pytest.fixture
def run_engine() -> Iterator[RunEngine]:
    # The RunEngine runs the loop in a thread of its own; given it ours, we can stop it
    # at the end (one made by the RunEngine would outlive the test).
    loop = asyncio.new_event_loop()
    RE = RunEngine({}, loop=loop, context_managers=[])
    yield RE
    loop.call_soon_threadsafe(loop.stop)
    RE._th.join()  # the RunEngine's thread: once it is done, the loop can be closed
    loop.close()


def events(RE: RunEngine, plan: Any) -> list[dict[str, Any]]:
    """Run ``plan``; the data of every event it emitted, in order."""
    seen: list[dict[str, Any]] = []
    token = RE.subscribe(lambda name, doc: seen.append(doc["data"]) if name == "event" else None)
    try:
        RE(plan)
    finally:
        RE.unsubscribe(token)
    return seen


def test_a_plan_sets_circuits_and_counts_power_through_them(
        served_lab: ServedLab, run_engine: RunEngine) -> None:
    RE = run_engine
    with init_devices():
        ocs = SwitchDevice(PolatisScpi(served_lab.address("ocs1")), ports=[17, 18],
                           name="ocs1")
        pm = MeterDevice(KeysightN77xx(served_lab.address("pm1")), channels=[1, 2],
                         name="pm1")
    try:
        # Readings average 0.1 s by default; a millisecond is plenty without noise.
        RE(bps.mv(pm.channels[1].averaging_time, 0.001, pm.channels[2].averaging_time, 0.001))
        steps = [CrossConnectTable.of({1: 17}),
                 CrossConnectTable.of({1: 18, 2: 17}),
                 CrossConnectTable.of({})]
        data = events(RE, bp.list_scan([pm, ocs], ocs.cross_connects, steps))
        assert len(data) == 3
        first, swapped, dark = data

        # laser0 through 1 -> 17 to pm1:1; nothing on 18 yet.
        assert first["pm1-channels-1-power"] == pytest.approx(through_switch("laser0"),
                                                               abs=TOLERANCE_DB)
        assert first["pm1-channels-2-power"] < DARK_BELOW_DBM
        # The switch's own monitor on 17: the launch less the fibre in and the switch.
        assert first["ocs1-ports-17-power"] == pytest.approx(
            LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB, abs=TOLERANCE_DB)
        assert first["ocs1-ports-18-power"] < DARK_BELOW_DBM  # a port without a circuit
        # Swapped: laser0 now on pm1:2, laser1 (3 dB weaker) on pm1:1.
        assert swapped["pm1-channels-1-power"] == pytest.approx(through_switch("laser1"),
                                                                 abs=TOLERANCE_DB)
        assert swapped["pm1-channels-2-power"] == pytest.approx(through_switch("laser0"),
                                                                 abs=TOLERANCE_DB)
        assert swapped["ocs1-ports-18-power"] == pytest.approx(
            LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB, abs=TOLERANCE_DB)
        assert swapped["ocs1-ports-17-power"] == pytest.approx(
            LAUNCH["laser1"] - INTO_SWITCH_DB - SWITCH_DB, abs=TOLERANCE_DB)
        assert dark["pm1-channels-1-power"] < DARK_BELOW_DBM
        assert dark["pm1-channels-2-power"] < DARK_BELOW_DBM
        assert dark["ocs1-ports-17-power"] < DARK_BELOW_DBM
        # Each event records the circuits read back from the switch, as the switch held them.
        recorded = [d["ocs1-cross_connects"].as_dict() for d in data]
        assert recorded == [{1: 17}, {1: 18, 2: 17}, {}]
        assert served_lab.circuits("ocs1") == {}
    finally:
        call_in_bluesky_event_loop(ocs.close())
        call_in_bluesky_event_loop(pm.close())


def test_a_mesh_routes_light_and_reads_its_elements(served_lab: ServedLab,
                                                     run_engine: RunEngine) -> None:
    RE = run_engine
    with init_devices():
        ocs = SwitchDevice(PolatisScpi(served_lab.address("ocs1")), name="ocs1")
        mesh = MeshDevice(MeshSwitch(served_lab.address("mesh"), size="8x8"), name="mesh")
        pm = MeterDevice(KeysightN77xx(served_lab.address("pm1")), channels=[3, 4],
                         name="pm1")
    try:
        RE(bps.mv(pm.channels[3].averaging_time, 0.001, pm.channels[4].averaging_time, 0.001,
                  ocs.cross_connects, CrossConnectTable.of({1: 19})))
        data = events(RE, bp.list_scan([pm, mesh], mesh.cross_connects,
                                       [CrossConnectTable.of({1: 9}),
                                        CrossConnectTable.of({1: 10})]))
        into_mesh = LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB - INTO_MESH_DB - INTO_METER_DB
        # Couplers a little off 50:50 leak some light to the other outputs: the mesh's own
        # loss on a route is below a tenth of a dB, its crosstalk below -20 dB.
        for step, (lit, other) in enumerate([(3, 4), (4, 3)]):
            assert data[step][f"pm1-channels-{lit}-power"] == pytest.approx(into_mesh,
                                                                             abs=0.1)
            assert data[step][f"pm1-channels-{other}-power"] < into_mesh - 20
        # Moving input 1 from output 9 to 10 changed elements; every one is bar or cross.
        first, second = (d["mesh-elements"] for d in data)
        assert len(first) == len(second) == 20  # a Beneš 8x8: 5 stages of 4 MZIs
        assert set(first) | set(second) <= {"bar", "cross"}
        assert first != second
        routes = served_lab.call(lambda: dict(served_lab.lab.device("mesh").mesh.routes))  # type: ignore[attr-defined]
        assert routes[1] == 10
    finally:
        for device in (ocs, mesh, pm):
            call_in_bluesky_event_loop(device.close())


def test_a_device_that_cannot_be_reached_says_so_when_connecting(
        run_engine: RunEngine) -> None:
    from ophyd_async.core import NotConnectedError

    # A port nothing listens on: the driver's ConnectError, named by the device that failed.
    ocs = SwitchDevice(PolatisScpi("tcp://127.0.0.1:9"), name="ocs9")
    with pytest.raises(NotConnectedError, match=r"ocs9: ConnectError: .*cannot connect"):
        call_in_bluesky_event_loop(ocs.connect(timeout=5))


def test_in_mock_mode_the_driver_is_never_opened(run_engine: RunEngine) -> None:
    switch = PolatisScpi("tcp://127.0.0.1:9")  # nothing listens: a real connect would fail
    with init_devices(mock=True):
        ocs = SwitchDevice(switch, ports=[17])
    assert ocs.ports[17].power.name == "ocs-ports-17-power"  # named after the variable
    run_engine(bps.mv(ocs.cross_connects, CrossConnectTable.of({1: 17})))
    held = call_in_bluesky_event_loop(ocs.cross_connects.get_value())
    assert held == CrossConnectTable.of({1: 17})
    assert switch.state is LinkState.OFFLINE
