"""The blocking facade, as a script uses it: plain calls, no event loop in the test."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from instruments.adapters.blocking import (
    BlockingMeter,
    BlockingSwitch,
    LoopThread,
    open_meter,
    open_switch,
)
from instruments.connection import Backoff
from instruments.errors import InstrumentClosed, InvalidRequest
from instruments.keysight import KeysightN77xx
from instruments.polatis_scpi import PolatisScpi
from instruments.switch import PortState
from tests.adapters.conftest import (
    DARK_BELOW_DBM,
    INTO_SWITCH_DB,
    LAUNCH,
    SWITCH_DB,
    ServedLab,
    through_switch,
)

TOLERANCE_DB = 0.02  # the meters add no noise on this bench


def loops() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("loop-")}


def test_a_script_makes_circuits_and_reads_light_through_them(served_lab: ServedLab) -> None:
    before = loops()
    with open_switch("polatis-scpi", served_lab.address("ocs1"), name="ocs1") as ocs, \
            open_meter("keysight-n77xx", served_lab.address("pm1"), name="pm1") as pm:
        assert loops() - before == {"loop-ocs1", "loop-pm1"}  # a loop each, in the background
        assert ocs.info is not None and ocs.info.size == "16x16"
        pm.call(lambda meter: meter.set_averaging_time(1, 0.001))  # a family's own call
        assert pm.window_s(1) == 0.001

        made = ocs.connect([(1, 17)])  # what it did, with its wire times, as the driver's
        assert made.sent_ns is not None and made.answered_ns is not None
        assert made.sent_ns < made.answered_ns
        assert ocs.cross_connects() == {1: 17} == served_lab.circuits("ocs1")
        assert pm.read_power(1) == pytest.approx(through_switch("laser0"), abs=TOLERANCE_DB)
        power = ocs.port_power([1, 17, 18])
        assert power[1] == pytest.approx(LAUNCH["laser0"] - INTO_SWITCH_DB, abs=TOLERANCE_DB)
        assert power[17] == pytest.approx(power[1] - SWITCH_DB, abs=TOLERANCE_DB)
        assert power[18] < DARK_BELOW_DBM  # no circuit: dark
        assert ocs.port_states([1, 17]) == {1: PortState.ENABLED, 17: PortState.ENABLED}

        # The driver's errors, raised in the caller's thread; nothing reached the switch.
        with pytest.raises(InvalidRequest, match="ingress port"):
            ocs.connect([(1, 2)])
        ocs.replace({2: 17})
        assert served_lab.circuits("ocs1") == {2: 17}
        assert pm.read_power(1) == pytest.approx(through_switch("laser1"), abs=TOLERANCE_DB)
        ocs.disconnect([17])
        assert ocs.expected == {} == served_lab.circuits("ocs1")
        assert pm.read_power(1) < DARK_BELOW_DBM
    assert loops() == before  # leaving the block stopped them


def test_instruments_share_a_loop_and_log_a_trace(served_lab: ServedLab) -> None:
    with LoopThread(name="loop-bench") as loop, \
            BlockingSwitch(PolatisScpi(served_lab.address("ocs1")), loop=loop) as ocs, \
            BlockingMeter(KeysightN77xx(served_lab.address("pm1")), loop=loop) as pm:
        assert "loop-bench" in loops() and len(loops()) == 1
        ocs.connect({1: 18})
        pm.start_logging([2], 50, 1e-4)
        pm.wait_logging(2)
        assert pm.logging_complete(2)
        trace = pm.fetch_log(2)
        assert trace.shape == (50,)
        assert np.allclose(trace, through_switch("laser0"), atol=TOLERANCE_DB)
        ocs.close()  # the loop is shared: closing one instrument leaves it running
        assert "loop-bench" in loops()
        assert pm.wavelength(2) == pytest.approx(1550.0)


def test_the_driver_recovers_in_the_background(served_lab: ServedLab) -> None:
    switch = PolatisScpi(served_lab.address("ocs1"), backoff=Backoff(0.01, 0.05))
    with BlockingSwitch(switch) as ocs:
        ocs.connect([(3, 19)])
        served_lab.call(lambda: served_lab.lab.inject("ocs1", {"kind": "drop"}))
        with pytest.raises(InstrumentClosed):
            ocs.cross_connects()
        # While the caller was away, the driver's own task reconnected and resynced.
        ocs.call(lambda driver: driver.connection.wait_online(10))
        assert ocs.cross_connects() == {3: 19}


def test_an_unknown_driver_is_refused_with_the_known_ones() -> None:
    with pytest.raises(InvalidRequest, match="keysight-n77xx, thorlabs-pm100"):
        open_meter("hp-8153", "tcp://127.0.0.1:9")
    with pytest.raises(InvalidRequest, match="polatis-scpi"):
        open_switch("polatis", "tcp://127.0.0.1:9")
