"""The emulator control endpoint over real HTTP."""

import asyncio

import httpx
import pytest

from emulators import EmulatedLab
from instruments.polatis_scpi import PolatisScpi


async def test_truth_faults_timing_reset(lab: EmulatedLab) -> None:
    async with httpx.AsyncClient(base_url=lab.control_url) as http:
        listing = (await http.get("/v1/emulators")).json()
        assert {e["id"] for e in listing} == {"ocs1", "cal", "ocspty"}
        assert set(listing[0]["endpoints"]) == {"scpi", "tl1"}

        r = await http.put("/v1/emulators/ocs1/timing", json={"switch_time_ms": 7,
                                                               "jitter_ms": 0})
        assert r.status_code == 200 and r.json()["switch_time_ms"] == 7

        async with PolatisScpi(lab.endpoints["ocs1"]["scpi"], name="ocs1") as sw:
            await sw.connect([(2, 18)])
        truth = (await http.get("/v1/emulators/ocs1/truth")).json()
        assert truth["state"]["connections"] == [[2, 18]]
        (change,) = truth["changes"]
        assert change["connected"] == [[2, 18]]
        assert change["settled_ns"] - change["arrived_ns"] >= 7_000_000
        assert (await http.get("/v1/emulators/ocs1/truth",
                               params={"since": change["seq"]})).json()["changes"] == []

        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "delay",
                                                               "delay_ms": 5})
        assert r.status_code == 200
        assert r.json()["faults"] == [{"kind": "delay", "remaining": None, "delay_ms": 5.0,
                                       "apply": False}]
        r = await http.delete("/v1/emulators/ocs1/faults")
        assert r.json()["faults"] == []

        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "fail_port", "port": 3})
        assert r.json()["state"]["ports"] == {"3": "F"}
        last = (await http.get("/v1/emulators/ocs1/truth",
                               params={"since": change["seq"]})).json()["changes"]
        assert [(c["op"], c["ports"], c["interface"]) for c in last] == [
            ("port-fail", [3], "control")]

        r = await http.post("/v1/emulators/ocs1/reset")
        assert r.json()["state"] == {"size": "16x16", "connections": [], "ports": {}}
        assert r.json()["timing"]["switch_time_ms"] == 2.0  # back to the configured model


async def test_bad_requests_are_clear_and_change_nothing(lab: EmulatedLab) -> None:
    async with httpx.AsyncClient(base_url=lab.control_url) as http:
        r = await http.get("/v1/emulators/nope/truth")
        assert r.status_code == 404 and "no emulator 'nope'" in r.json()["detail"]
        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "explode"})
        assert r.status_code == 422 and "fault kind 'explode' unknown" in r.json()["detail"]
        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "delay"})
        assert r.status_code == 422 and "delay_ms" in r.json()["detail"]
        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "fail_port"})
        assert r.status_code == 422 and "port" in r.json()["detail"]
        r = await http.post("/v1/emulators/ocs1/faults", json={"kind": "fail_port", "port": 99})
        assert r.status_code == 422 and "port 99 out of range" in r.json()["detail"]
        r = await http.put("/v1/emulators/ocs1/timing", json={"switch_time_ms": -1})
        assert r.status_code == 422
        r = await http.put("/v1/emulators/ocs1/timing", json={"speed": 3})
        assert r.status_code == 422
        described = (await http.get("/v1/emulators/ocs1")).json()
        assert described["faults"] == [] and described["state"]["ports"] == {}
        assert described["timing"]["switch_time_ms"] == 2.0


async def test_power_cycle_over_http(lab: EmulatedLab) -> None:
    address = lab.endpoints["ocs1"]["scpi"]
    host, port = address.removeprefix("tcp://").split(":")
    async with httpx.AsyncClient(base_url=lab.control_url) as http:
        r = await http.put("/v1/emulators/ocs1/power", json={"on": False})
        assert r.status_code == 200 and r.json()["powered"] is False
        with pytest.raises(OSError):
            await asyncio.open_connection(host, int(port))
        r = await http.put("/v1/emulators/ocs1/power", json={"on": True})
        assert r.json()["powered"] is True
        assert r.json()["endpoints"]["scpi"] == address
        _, writer = await asyncio.open_connection(host, int(port))
        writer.close()
        r = await http.put("/v1/emulators/ocs1/power", json={"on": "maybe"})
        assert r.status_code == 422
