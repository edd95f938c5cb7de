"""QCoDeS Instruments on the drivers, in a Station, against the emulators."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from qcodes.instrument import Instrument
from qcodes.station import Station
from qcodes.utils import NumpyJSONEncoder

from instruments.adapters.blocking import LoopThread
from instruments.adapters.qcodes import (
    MeshInstrument,
    OpticalSwitchInstrument,
    PowerMeterInstrument,
)
from instruments.errors import ConnectError, InvalidRequest
from instruments.keysight import KeysightN77xx
from instruments.mesh import MeshSwitch
from instruments.polatis_scpi import PolatisScpi
from instruments.thorlabs import ThorlabsPM100
from tests.adapters.conftest import (
    DARK_BELOW_DBM,
    INTO_SWITCH_DB,
    LAUNCH,
    SWITCH_DB,
    ServedLab,
    through_switch,
)

TOLERANCE_DB = 0.02  # the meters add no noise on this bench


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    """One loop for every instrument of a test, as a station would share it; whatever
    a failing test leaves open is closed with it."""
    with LoopThread() as shared:
        yield shared
        Instrument.close_all()


def test_parameters_set_circuits_and_read_power_through_them(served_lab: ServedLab,
                                                             loop: LoopThread) -> None:
    ocs = OpticalSwitchInstrument("ocs1", PolatisScpi(served_lab.address("ocs1")),
                                  loop=loop)
    pm = PowerMeterInstrument("pm1", KeysightN77xx(served_lab.address("pm1")), loop=loop)
    assert len(ocs.ports) == 32 and len(pm.channels) == 4  # a 16x16 and an N7744A
    for channel in pm.channels:
        channel.averaging_time(0.001)  # no noise to average away
        assert channel.averaging_time() == 0.001

    ocs.cross_connects({1: 17, 2: 18})
    assert served_lab.circuits("ocs1") == {1: 17, 2: 18}  # the switch holds them
    assert ocs.cross_connects() == {1: 17, 2: 18}
    assert pm.ch1.power() == pytest.approx(through_switch("laser0"), abs=TOLERANCE_DB)
    assert pm.ch2.power() == pytest.approx(through_switch("laser1"), abs=TOLERANCE_DB)
    assert ocs.port(17).power() == pytest.approx(
        LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB, abs=TOLERANCE_DB)
    assert ocs.port19.power() < DARK_BELOW_DBM  # no circuit (yet): dark

    ocs.disconnect([17])
    ocs.connect([(1, 19)])  # 19 is cabled to the mesh, 20 to nothing
    assert served_lab.circuits("ocs1") == {1: 19, 2: 18}
    assert pm.ch1.power() < DARK_BELOW_DBM
    assert ocs.port19.power() == pytest.approx(LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB,
                                              abs=TOLERANCE_DB)
    assert ocs.port5.enabled() is True

    # The driver's refusal reaches the caller before anything is sent.
    with pytest.raises(InvalidRequest, match="ingress port"):
        ocs.cross_connects({1: 2})
    assert served_lab.circuits("ocs1") == {1: 19, 2: 18}
    ocs.close()
    pm.close()


def test_a_station_snapshot_holds_every_family(served_lab: ServedLab,
                                               loop: LoopThread) -> None:
    ocs = OpticalSwitchInstrument("ocs1", PolatisScpi(served_lab.address("ocs1")),
                                  ports=[17, 18], loop=loop)
    mesh = MeshInstrument("mesh", MeshSwitch(served_lab.address("mesh"), size="8x8"),
                          ports=[1], loop=loop)
    pm = PowerMeterInstrument("pm1", KeysightN77xx(served_lab.address("pm1")), channels=[1],
                              loop=loop)
    pm2 = PowerMeterInstrument("pm2", ThorlabsPM100(served_lab.address("pm2")), loop=loop)
    pm.ch1.averaging_time(0.001)
    ocs.cross_connects({1: 17})
    mesh.cross_connects({1: 10})
    station = Station(ocs, mesh, pm, pm2)

    snapshot = station.snapshot(update=True)
    json.dumps(snapshot, cls=NumpyJSONEncoder)  # what a dataset stores: it must serialise
    instruments = snapshot["instruments"]
    assert set(instruments) == {"ocs1", "mesh", "pm1", "pm2"}

    switch = instruments["ocs1"]
    assert switch["parameters"]["cross_connects"]["value"] == {1: 17}
    assert switch["parameters"]["IDN"]["value"]["vendor"] == "Polatis"
    assert switch["parameters"]["IDN"]["value"]["model"].endswith("16x16")
    ports = switch["submodules"]
    # Each port once, as port<n>: the ports tuple is not snapshotted a second time.
    assert ports["ports"] == {"snapshotable": False,
                              "__class__": "qcodes.instrument.channel.ChannelTuple"}
    assert ports["port17"]["parameters"]["power"]["value"] == pytest.approx(
        LAUNCH["laser0"] - INTO_SWITCH_DB - SWITCH_DB, abs=TOLERANCE_DB)
    assert ports["port17"]["parameters"]["power"]["unit"] == "dBm"
    assert ports["port18"]["parameters"]["power"]["value"] < DARK_BELOW_DBM  # no circuit

    chip = instruments["mesh"]
    assert chip["parameters"]["cross_connects"]["value"] == {1: 10}
    states = chip["parameters"]["elements"]["value"]
    assert len(states) == 20 and set(states) <= {"bar", "cross"}
    assert "power" not in chip["submodules"]["port1"]["parameters"]  # a mesh has no monitors

    meter = instruments["pm1"]["submodules"]["ch1"]["parameters"]
    assert meter["power"]["value"] == pytest.approx(through_switch("laser0"), abs=TOLERANCE_DB)
    assert meter["wavelength"]["value"] == pytest.approx(1550.0)
    assert meter["averaging_time"]["value"] == 0.001
    thorlabs = instruments["pm2"]["submodules"]["ch1"]["parameters"]
    assert thorlabs["power"]["value"] < DARK_BELOW_DBM  # pm2 is cabled to nothing
    assert thorlabs["averages"]["value"] == 1
    assert "averaging_time" not in thorlabs
    for instrument in (ocs, mesh, pm, pm2):
        instrument.close()


def test_an_instrument_that_cannot_connect_leaves_its_name_free(loop: LoopThread) -> None:
    with pytest.raises(ConnectError):
        OpticalSwitchInstrument("nowhere", PolatisScpi("tcp://127.0.0.1:9"), loop=loop)
    # QCoDeS keeps instruments by name: a failed one must not hold the name.
    assert not Instrument.exist("nowhere")
