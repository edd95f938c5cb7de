"""The optical model on its own: losses, taps, transients, crossings."""

import asyncio
import time

import numpy as np
import pytest

from emulators.physics.crossconnect import SwitchModel
from emulators.physics.optics import EndpointSpec, FiberSpec, OpticalModel, to_dbm
from emulators.physics.timing import TimingModel


def model(technology: str = "beam-steering", switch_ms: float = 10
          ) -> tuple[OpticalModel, SwitchModel]:
    switch = SwitchModel("ocs", 4, 4, timing=TimingModel.for_technology(
        technology, switch_time_ms=switch_ms, jitter_ms=0), loss_db=1.0)
    optics = OpticalModel(
        [EndpointSpec("tx", 3.0), EndpointSpec("rx")],
        [FiberSpec("tx", "ocs:1", 0.5), FiberSpec("ocs:5", "rx", 0.5, tap="pm:1",
                                                     tap_ratio=0.1),
         FiberSpec("ocs:6", "pm:2", 2.0)], threshold_dbm=-30)
    optics.attach(switch)
    optics.add_meter("pm", 2)
    switch.listeners.append(optics.on_change)
    return optics, switch


def now() -> np.ndarray:
    return np.array([time.monotonic_ns()])


async def test_losses_and_taps_add_up() -> None:
    optics, switch = model("ideal")
    connect, drop = switch.plan_connect([(1, 5)])
    await switch.change("test", "add", connect, drop, time.monotonic_ns())
    powers = optics.powers(now())
    assert to_dbm(powers["ocs:1"])[0] == pytest.approx(2.5)
    assert to_dbm(powers["ocs:5"])[0] == pytest.approx(1.5)  # 1 dB through the switch
    assert to_dbm(powers["pm:1"])[0] == pytest.approx(1.0 - 10.0)  # 10% tap
    assert to_dbm(powers["rx"])[0] == pytest.approx(1.0 + 10 * np.log10(0.9))
    assert "pm:2" not in powers  # nothing reaches it
    assert optics.dbm_now("pm:2") == pytest.approx(-90)


async def test_transient_and_its_ground_truth_crossings() -> None:
    optics, switch = model()
    connect, drop = switch.plan_connect([(1, 5)])
    first = await switch.change("test", "add", connect, drop, time.monotonic_ns())
    second = await switch.change("test", "move", [(1, 6)], [(1, 5)], time.monotonic_ns())
    assert first is not None and second is not None
    crossings = optics.crossings_since(0)
    assert [(c["node"], c["direction"]) for c in crossings] == [
        ("pm:1", "rise"), ("pm:1", "fall"), ("pm:2", "rise")]
    rise, fall, moved = (c["at_ns"] for c in crossings)
    # Beam steering: light lands in the last quarter of the 10 ms move and leaves within
    # its first tenth (each move ends at its settled_ns).
    assert first.settled_ns - 2_500_000 < rise < first.settled_ns
    assert second.settled_ns - 10_000_000 < fall < second.settled_ns - 9_000_000
    assert second.settled_ns - 2_500_000 < moved < second.settled_ns
    # The trace agrees with the crossings it implies.
    times = np.array([fall - 1000, fall + 1000], dtype=np.int64)
    assert list(optics.dbm("pm:1", times) >= -30) == [True, False]
    assert optics.crossings_since(crossings[-1]["seq"]) == []


async def test_failed_port_goes_dark_from_the_moment_it_failed() -> None:
    optics, switch = model("ideal")
    connect, drop = switch.plan_connect([(1, 5)])
    await switch.change("test", "add", connect, drop, time.monotonic_ns())
    before = time.monotonic_ns()
    switch.set_port_state(5, "F")
    after = time.monotonic_ns()
    levels = optics.dbm("pm:1", np.array([before - 1, after + 1], dtype=np.int64))
    assert levels[0] == pytest.approx(-9.0) and levels[1] == pytest.approx(-90)


async def test_a_nodes_power_alone_is_what_the_whole_lab_gives_it() -> None:
    """A meter's reading follows only the light that can reach it: on the demo lab, with
    circuits on every switch, before, during and after their transients, each watched
    node's power worked out alone equals its power in the whole lab's."""
    from labd.emulation.emulators import emulated_lab
    from labd.lab.loader import load_lab

    emulated, _ = emulated_lab(load_lab("demo"))
    async with emulated:
        optics = emulated.optics
        assert optics is not None
        began = time.monotonic_ns()
        for name, pairs in (("ocs1", [(1, 18), (2, 17)]), ("ocs2", [(1, 33), (3, 35)]),
                            ("ocs3", [(1, 2)])):
            emulated.set_timing(name, {"switch_time_ms": 4, "jitter_ms": 0})
            model = emulated.device(name).model  # type: ignore[attr-defined]
            connect, drop = model.plan_connect(pairs)
            await model.change("test", "add", connect, drop, time.monotonic_ns())
        times = np.arange(began - 1_000_000, time.monotonic_ns(), 250_000)
        whole = optics.powers(times)
        lit = [node for node in optics.watched if node in whole and whole[node].max() > 1e-4]
        assert len(lit) >= 3
        for node in sorted(optics.watched):
            alone = optics.powers(times, to=node).get(node)
            if node not in whole:
                assert alone is None
            else:
                assert alone is not None and np.allclose(alone, whole[node], rtol=1e-12)


async def test_power_now_follows_every_change_while_it_is_kept_between_them() -> None:
    """dbm_now keeps its answer while nothing moves (NICs poll it every few ms): each kind
    of change must still show at once."""
    optics, switch = model()
    assert optics.dbm_now("rx") == pytest.approx(-90)
    connect, drop = switch.plan_connect([(1, 5)])
    await switch.change("test", "add", connect, drop, time.monotonic_ns())
    lit = optics.dbm_now("rx")
    assert lit > -10
    assert optics._steady["rx"] == ((switch.revision,), lit)  # kept once settled
    assert optics.dbm_now("rx") == lit
    switch.set_port_state(5, "D")  # a closed shutter shows at once
    assert optics.dbm_now("rx") == pytest.approx(-90)
    switch.set_port_state(5, "E")
    assert optics.dbm_now("rx") == pytest.approx(lit)
    switch.reset()  # a power cycle forgets every circuit
    assert optics.dbm_now("rx") == pytest.approx(-90)


async def test_power_now_is_never_kept_mid_transient() -> None:
    optics, switch = model(switch_ms=60_000)  # a move that cannot end during the test
    connect, drop = switch.plan_connect([(1, 5)])
    moving = asyncio.create_task(switch.change("test", "add", connect, drop,
                                               time.monotonic_ns()))
    try:
        await asyncio.sleep(0)  # one turn: the change sets its circuit before it waits
        assert switch.revision == 1
        assert optics.dbm_now("rx") == pytest.approx(-90)  # the beam is on its way
        kept = optics._steady.get("rx")
        assert kept is None or kept[0] != (switch.revision,)
    finally:
        moving.cancel()
