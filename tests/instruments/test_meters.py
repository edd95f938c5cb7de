"""Power meters: emulators against pyvisa, drivers against emulators, faults, and light
verification against the optical model's ground truth."""

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pyvisa

from emulators.lab import EmulatedLab, EmulatorSpec, OpticsSpec
from emulators.physics.optics import EndpointSpec, FiberSpec
from instruments.errors import DeviceError, InstrumentTimeout
from instruments.keysight import KeysightN77xx
from instruments.light import LightTimeout, LightWatch
from instruments.polatis_scpi import PolatisScpi
from instruments.thorlabs import ThorlabsPM100

WIRING = OpticsSpec(
    [EndpointSpec("gpu0", 0.0), EndpointSpec("gpu1", -3.0), EndpointSpec("rx0")],
    [FiberSpec("gpu0", "ocs1:1", 0.5), FiberSpec("gpu1", "ocs1:2", 0.5),
     FiberSpec("ocs1:17", "rx0", 0.3, tap="pm1:1", tap_ratio=0.1),
     FiberSpec("ocs1:18", "pm1:2", 0.3), FiberSpec("ocs1:19", "pm2:1", 0.3)])


@pytest.fixture
async def lab() -> AsyncIterator[EmulatedLab]:
    specs = [EmulatorSpec("ocs1", "polatis", {}, {"switch_time_ms": 10, "jitter_ms": 1}),
             EmulatorSpec("pm1", "keysight", {"model": "N7745A", "noise_db": 0.0}),
             EmulatorSpec("pm2", "thorlabs", {"noise_db": 0.0})]
    async with EmulatedLab(specs, optics=WIRING) as emulated:
        yield emulated


def resource(address: str) -> Any:
    host, port = address.removeprefix("tcp://").split(":")
    res = pyvisa.ResourceManager("@py").open_resource(f"TCPIP::{host}::{port}::SOCKET")
    res.read_termination = "\n"
    res.write_termination = "\n"
    res.timeout = 5000
    return res


def keysight_with_pyvisa(address: str) -> dict[str, Any]:
    res = resource(address)
    try:
        out: dict[str, Any] = {"idn": res.query("*IDN?")}
        res.write(":SENS1:POW:ATIM 1MS")
        out["atime"] = res.query(":SENS1:POW:ATIM?")
        out["wav"] = res.query(":SENS1:POW:WAV?")
        out["dbm"] = float(res.query(":READ1:POW?"))
        res.write(":SENS1:POW:UNIT 1")
        out["watts"] = float(res.query(":READ1:POW?"))
        res.write(":SENS1:POW:UNIT 0")
        res.write(":SENS1:FUNC:STAT LOGG,STOP")
        res.write(":SENS1:FUNC:PAR:LOGG 50,0.0001S")
        out["par"] = res.query(":SENS1:FUNC:PAR:LOGG?")
        res.write(":SENS1:FUNC:STAT LOGG,STAR")
        out["log"] = res.query_binary_values(":SENS1:FUNC:RES?", datatype="f",
                                             is_big_endian=False, header_fmt="ieee")
        out["state"] = res.query(":SENS1:FUNC:STAT?")
        res.write(":SENS9:POW:ATIM 1MS")
        out["err"] = res.query(":SYST:ERR?")
        out["noerr"] = res.query(":SYST:ERR?")
        return out
    finally:
        res.close()


def thorlabs_with_pyvisa(address: str) -> dict[str, Any]:
    res = resource(address)
    try:
        return {"idn": res.query("*IDN?"), "sensor": res.query("SYST:SENS:IDN?"),
                "min": res.query("SENS:CORR:WAV? MIN"), "max": res.query("SENS:CORR:WAV? MAX"),
                "power": float(res.query("MEAS:POW?")), "unit": res.query("SENS:POW:UNIT?")}
    finally:
        res.close()


async def test_pyvisa_reads_both_meters(lab: EmulatedLab) -> None:
    async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw:
        await sw.connect([(1, 17), (2, 19)])
    k = await asyncio.to_thread(keysight_with_pyvisa, lab.endpoints["pm1"]["scpi"])
    assert k["idn"] == "Keysight Technologies,N7745A,MY12345678,1.220"
    assert float(k["atime"]) == pytest.approx(1e-3)
    assert float(k["wav"]) == pytest.approx(1.55e-6)
    # 0 dBm launched, 0.5 dB fibre, 1.2 dB switch, 0.3 dB fibre, 10% tap (-10 dB)
    assert k["dbm"] == pytest.approx(-12.0, abs=0.01)
    assert k["watts"] == pytest.approx(10 ** (-12.0 / 10) / 1000, rel=0.01)
    assert k["par"] == "50,1.000000E-04"
    assert len(k["log"]) == 50 and all(v == pytest.approx(-12.0, abs=0.01) for v in k["log"])
    assert k["state"] == "LOGGING_STABILITY,COMPLETE"
    assert k["err"].startswith("-114,") and k["noerr"] == '+0,"No error"'
    t = await asyncio.to_thread(thorlabs_with_pyvisa, lab.endpoints["pm2"]["scpi"])
    assert t["idn"] == "Thorlabs,PM100D,P0012345,2.8.0"
    assert t["sensor"].startswith("S122C,")
    assert float(t["min"]) == 700 and float(t["max"]) == 1800
    # -3 dBm launched, 0.5 + 1.2 + 0.3 dB of loss
    assert t["power"] == pytest.approx(10 ** (-5.0 / 10) / 1000, rel=0.01) and t["unit"] == "W"


async def test_logging_trace_shows_the_transient(lab: EmulatedLab) -> None:
    lab.set_timing("ocs1", {"switch_time_ms": 20, "jitter_ms": 0})
    async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw, \
            KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        await sw.connect([(1, 17)])
        start = await pm.start_logging([1, 2], 400, 1e-4)  # 40 ms at 100 us
        await sw.replace({1: 18})  # the light leaves pm1:1 and arrives on pm1:2
        await pm.wait_logging(1)
        old, new = await pm.fetch_log(1), await pm.fetch_log(2)
    change = lab.truth("ocs1")["changes"][-1]
    command = (change["arrived_ns"] - start) / 100_000  # in samples since the log began
    assert old[0] == pytest.approx(-12.0, abs=0.05) and old[-1] < -60  # lit, then dark
    assert new[0] < -60 and new[-1] == pytest.approx(-2.0, abs=0.05)
    gone, arrived = np.flatnonzero(old < -30)[0], np.flatnonzero(new > -30)[0]
    # Beam steering: the beam leaves the old fibre in the first tenth of the 20 ms move and
    # lands on the new one in its last quarter.
    assert command <= gone <= command + 25
    assert command + 145 <= arrived <= command + 185


async def test_one_watch_sees_light_leave_one_channel_and_arrive_on_another(
        lab: EmulatedLab) -> None:
    lab.set_timing("ocs1", {"switch_time_ms": 10, "jitter_ms": 0})
    async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw, \
            KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        await sw.connect([(1, 17)])
        seen = len(lab.light())
        watch = await LightWatch.start(pm, [1, 2], present={1: False, 2: True}, window_s=0.05)
        await sw.replace({1: 18})
        found = await watch.result()
        truth = {c["node"]: c for c in lab.light()[seen:]}
        assert truth["pm1:1"]["direction"] == "fall" and truth["pm1:2"]["direction"] == "rise"
        for channel in (1, 2):
            assert abs(found[channel] - truth[f"pm1:{channel}"]["at_ns"]) < 2_000_000
        # Asked the other way round, neither channel does what the watch awaits.
        watch = await LightWatch.start(pm, [1, 2], present={1: True, 2: False}, window_s=0.02)
        with pytest.raises(LightTimeout, match=r"not present on channel 1 .*; "
                                               r"not gone on channel 2 "):
            await watch.result()


async def test_a_long_log_leaves_the_emulators_loop_free_while_it_is_worked_out(
        lab: EmulatedLab) -> None:
    from emulators.devices.keysight import LOG_SLICE, KeysightSession

    session = KeysightSession(lab.device("pm1"))
    turns = 0
    stop = asyncio.Event()

    async def other_device() -> None:  # what another device's reply would need: turns
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(other_device())
    points, start = 20 * LOG_SLICE, time.monotonic_ns() - 1_000_000_000
    log = await session._log_windows(1, start, 1e-5, points)
    stop.set()
    await beside
    assert turns >= 19  # between every two slices
    # Slice by slice, the same log as worked out at once (this meter has no noise).
    assert np.array_equal(log, lab.device("pm1").meter.windows_dbm(1, start, 1e-5, points))


async def test_a_log_that_never_completes_is_a_timeout(lab: EmulatedLab) -> None:
    async with KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        await pm.start_logging([1], 100_000, 1e-3)  # 100 s of log
        with pytest.raises(InstrumentTimeout, match=r"did not complete within 0\.2 s"):
            await pm.wait_logging(1, timeout_s=0.2)


async def test_driver_units_wavelength_and_faults(lab: EmulatedLab) -> None:
    async with KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        assert pm.info is not None and pm.info.channels == 8
        await pm.set_averaging_time(3, 1e-3)
        assert await pm.read_power(3) < -80  # nothing wired to channel 3: dark
        await pm.set_wavelength(3, 1310)
        assert await pm.wavelength(3) == pytest.approx(1310)
        await pm.set_unit(3, "W")  # readings still come back in dBm
        assert await pm.read_power(3) < -80
        with pytest.raises(DeviceError) as refused:
            await pm.set_wavelength(3, 900)
        assert refused.value.code == -222
        lab.inject("pm1", {"kind": "saturation", "channel": 3})
        assert await pm.read_power(3) == math.inf
        lab.inject("pm1", {"kind": "no_sensor", "channel": 3})
        with pytest.raises(DeviceError, match="no sensor"):
            await pm.read_power(3)
        lab.clear_faults("pm1")
        assert await pm.read_power(3) < -80
    async with ThorlabsPM100(lab.endpoints["pm2"]["scpi"], name="pm2") as pm2:
        assert await pm2.sensor() == "S122C"
        assert await pm2.wavelength_range() == (700.0, 1800.0)
        await pm2.set_averages(2)
        first = await pm2.read_power()
        lab.inject("pm2", {"kind": "stuck"})
        async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw:
            await sw.connect([(2, 19)])  # light arrives, the stuck meter does not see it
        assert await pm2.read_power() == pytest.approx(first)
        lab.inject("pm2", {"kind": "no_sensor"})
        assert await pm2.sensor() == "no sensor"
        with pytest.raises(DeviceError):
            await pm2.read_power()


def placed(meter: str, found: int, truth: int, answered: int) -> None:
    """The right event, placed where it can be (scripts/bench_light.py measures how
    closely). A logging meter's samples carry the device's own times: within 2 ms of the
    truth. A polling meter averages over ~3 ms windows and is read in turns: a crossing no
    earlier than the truth less one window, and no later than the reading that saw it,
    which came before the watch answered (how late depends on the machine's load)."""
    if meter == "pm1":
        assert abs(found - truth) < 2_000_000
    else:
        assert truth - 3_000_000 <= found <= answered


@pytest.mark.parametrize("meter", ["pm1", "pm2"])
async def test_light_verification_agrees_with_ground_truth(lab: EmulatedLab,
                                                           meter: str) -> None:
    channel, ingress, egress = (1, 1, 17) if meter == "pm1" else (1, 2, 19)
    cls = KeysightN77xx if meter == "pm1" else ThorlabsPM100
    async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw, \
            cls(lab.endpoints[meter]["scpi"], name=meter) as pm:
        seen = len(lab.light())
        watch = await LightWatch.start(pm, [channel], present=True, window_s=0.05)
        await sw.connect([(ingress, egress)])
        arrived = (await watch.result())[channel]
        answered = time.monotonic_ns()
        (truth,) = [c for c in lab.light()[seen:] if c["node"] == f"{meter}:{channel}"]
        assert truth["direction"] == "rise"
        placed(meter, arrived, truth["at_ns"], answered)
        watch = await LightWatch.start(pm, [channel], present=False, window_s=0.05)
        await sw.disconnect([ingress])
        gone = (await watch.result())[channel]
        answered = time.monotonic_ns()
        (truth,) = [c for c in lab.light()[seen + 1:] if c["node"] == f"{meter}:{channel}"]
        assert truth["direction"] == "fall"
        placed(meter, gone, truth["at_ns"], answered)
        # Nothing ever lights this channel: a clear timeout naming it and its level.
        dark = 2 if meter == "pm1" else 1
        if meter == "pm2":
            await sw.disconnect([2])
        with pytest.raises(LightTimeout, match=rf"light not present on channel {dark} \(last"):
            await (await LightWatch.start(pm, [dark], window_s=0.02)).result()


async def test_a_refused_logging_fetch_is_an_error_not_a_timeout(lab: EmulatedLab) -> None:
    async with KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        with pytest.raises(DeviceError) as refused:
            await pm.fetch_log(4)  # no log was ever started on channel 4
        assert refused.value.code == -230
        await pm.start_logging([4], 10, 1e-4)
        lab.inject("pm1", {"kind": "no_sensor", "channel": 4})
        with pytest.raises(DeviceError, match="no sensor"):
            await pm.fetch_log(4)
        assert await pm.read_power(1) < -80  # the link is still in step


async def test_light_ground_truth_over_http(lab: EmulatedLab) -> None:
    import httpx

    async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw:
        await sw.connect([(2, 18)])
    async with httpx.AsyncClient(base_url=lab.control_url) as http:
        (crossing,) = (await http.get("/v1/light")).json()
        assert (crossing["node"], crossing["direction"], crossing["device"]) == (
            "pm1:2", "rise", "ocs1")
        truth = (await http.get("/v1/emulators/ocs1/truth")).json()
        (change,) = truth["changes"]
        assert change["arrived_ns"] < crossing["at_ns"] <= change["settled_ns"]
        assert crossing["change_seq"] == change["seq"]
        assert (await http.get("/v1/light", params={"since": crossing["seq"]})).json() == []
        seen = (await http.get("/v1/emulators/pm1/truth")).json()["crossings"]
        assert seen == [crossing]


@pytest.mark.parametrize(("answer", "watts"), [(b"+1", True), (b"1", True), (b"+0", False),
                                               (b"W", True), (b"DBM", False)])
async def test_a_keysight_unit_reply_is_read_as_a_number(answer: bytes, watts: bool) -> None:
    """The programming guide's examples answer ``:SENS1:POW:UNIT?`` with ``+1`` (W): read
    as a number, not compared with ``1`` as text."""
    from tests.scripted import ScriptedDevice

    script: list[tuple[bytes, object]] = [
        (b"*IDN?\n", b"Keysight Technologies,N7744A,MY00000001,1.0\n"),
        *((f":SENS{c}:POW:ATIM?\n".encode(), b"+1.00000000E-001\n") for c in range(1, 5)),
        *((f":SENS{c}:POW:UNIT?\n".encode(), answer + b"\n") for c in range(1, 5))]
    async with ScriptedDevice([script]) as dev, KeysightN77xx(dev.address, name="pm") as meter:
        assert meter._watts == {c: watts for c in range(1, 5)}
    assert not dev.mismatches
