"""The daemon on an emulated lab: API → engine → drivers → emulators, the record in the
store against the emulators' ground truth, events on the WebSocket, bad input refused."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
import websockets

from emulators.lab import EmulatedLab
from instruments.errors import InstrumentError
from labd.daemon.core import Daemon
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.lab.loader import Lab, load_lab
from tests.labs import endpoint, fiber, host, instrument, job, meter, metered, switch, write_lab
from tests.rigs import StartRig


def ocs1_with(**fields: Any) -> str:
    """The bench's Polatis (8 ± 1 ms), with ``fields`` besides."""
    return switch(switch_ms=8, jitter_ms=1, **fields)


OCS2 = switch("ocs2", driver="calient-tl1", size="16", user="admin", password="pw",
              switch_ms=12, jitter_ms=1)
PM1 = meter(emulator={"options": {"noise_db": 0.0}})
LAB = (ocs1_with(), OCS2, PM1, metered("a", "b", 1, 9, 1))
TOKEN = "test-token"
Running = tuple[Daemon, EmulatedLab]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    """The bench's lab, for a test that starts daemons on it itself."""
    return load_lab(write_lab(tmp_path, "bench", *LAB)[1])


@contextlib.asynccontextmanager
async def daemon_on(start_rig: StartRig, *parts: str, light_window_s: float | None = 0.05
                    ) -> AsyncIterator[Running]:
    """A daemon on a lab of ``parts`` in emulation; ``light_window_s`` None: the lab file's
    windows."""
    async with start_rig("bench", *parts, token=TOKEN, light_window_s=light_window_s) as rig:
        assert rig.emulated is not None
        yield rig.daemon, rig.emulated


@pytest.fixture
async def running(start_rig: StartRig) -> AsyncIterator[Running]:
    async with daemon_on(start_rig, *LAB) as both:
        yield both


async def test_each_switch_is_verified_over_its_own_light_window(start_rig: StartRig) -> None:
    async with daemon_on(start_rig, ocs1_with(light_window_ms=30), *LAB[1:],
                         light_window_s=None) as (daemon, _), \
            httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        ocs1, ocs2 = [(await http.get(f"/v1/switches/{s}")).json() for s in ("ocs1", "ocs2")]
        assert (ocs1["light_window_ms"], ocs1["metered_paths"]) == (30, 1)
        assert (ocs2["light_window_ms"], ocs2["metered_paths"]) == (100, 0)  # the lab's
        result = (await http.post("/v1/switches/ocs1/connections",
                                  json={"pairs": [[1, 9]]})).json()
        assert result["outcome"] == "ok" and result["phases"]["light"] is not None
        (trace,) = (await http.get(f"/v1/reconfigurations/{result['id']}/traces")).json()
        assert len(trace["dbm"]) == 300  # 30 ms logged at 100 µs


async def test_api_reconfigures_and_the_record_agrees_with_ground_truth(running: Running) -> None:
    daemon, emulated = running
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        assert r.status_code == 200, r.text
        result = r.json()
        assert result["outcome"] == "ok" and result["connected"] == [[1, 9]]
        traces = (await http.get(f"/v1/reconfigurations/{result['id']}/traces")).json()
        (trace,) = traces  # the light verification's log of pm1:1, kept with the record
        assert (trace["meter"], trace["channel"]) == ("pm1", 1)
        assert trace["dbm"][0] < -60 and trace["dbm"][-1] > -30  # dark, then lit
        r = await http.post("/v1/switches/ocs1/disconnect", json={"ports": [9]})
        assert r.json()["disconnected"] == [[1, 9]]
        for i in range(2, 6):
            r = await http.post("/v1/switches/ocs2/connections", json={"pairs": [[i, i + 8]]})
            assert r.json()["outcome"] == "ok"
        rows = (await http.get("/v1/reconfigurations")).json()
        stats = (await http.get("/v1/reconfigurations/stats")).json()
        only = (await http.get("/v1/reconfigurations",
                               params={"switch": "ocs1", "cause": "api"})).json()
        assert [r["switch"] for r in only] == ["ocs1", "ocs1"]
        future = (await http.get("/v1/reconfigurations",
                                 params={"since": "2999-01-01T00:00:00Z"})).json()
        past = (await http.get("/v1/reconfigurations",
                               params={"since": "2000-01-01T00:00:00+02:00"})).json()
        assert future == [] and len(past) == 6
        window = (await http.get("/v1/reconfigurations", params={
            "since_ns": rows[1]["phases"]["requested"],
            "until_ns": rows[0]["phases"]["requested"]})).json()
        assert [r["id"] for r in window] == [rows[0]["id"], rows[1]["id"]]
    assert [r["switch"] for r in rows] == ["ocs2"] * 4 + ["ocs1"] * 2
    truth = {name: emulated.truth(name)["changes"] for name in ("ocs1", "ocs2")}
    light = emulated.light()
    for row, change in [(rows[-1], truth["ocs1"][0]), (rows[-2], truth["ocs1"][1]),
                        *zip(rows[:4][::-1], [c for c in truth["ocs2"]], strict=True)]:
        p = row["phases"]
        assert p["requested"] <= p["dispatched"] <= p["acknowledged"] <= p["done"]
        # The device's truth sits inside what labd recorded, from the command that moved
        # the light: the Polatis's only one, the CALIENT's ACT-CRS after ENT-CRS.
        assert p["dispatched"] <= p["activated"] <= change["arrived_ns"] <= change["settled_ns"]
        assert (p["activated"] == p["dispatched"]) == (row["switch"] == "ocs1")
        assert change["settled_ns"] <= p["acknowledged"]
    made = rows[-1]["phases"]
    (arrived,) = [c for c in light if c["direction"] == "rise" and c["node"] == "pm1:1"]
    assert made["light"] is not None and abs(made["light"] - arrived["at_ns"]) < 1_000_000
    assert stats["ocs1"]["count"] == 2 and stats["ocs2"]["count"] == 4
    assert stats["ocs2"]["device"]["p50_ms"] >= 11  # the emulated 12 ± 1 ms


async def test_events_arrive_on_the_websocket(running: Running) -> None:
    daemon, _ = running
    ws_url = daemon.url.replace("http://", "ws://") + "/v1/events"
    async with websockets.connect(ws_url, additional_headers=AUTH) as ws:
        snapshot = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert snapshot["kind"] == "snapshot" and {i["id"] for i in snapshot["instruments"]} \
            == {"ocs1", "ocs2", "pm1"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            await http.post("/v1/switches/ocs2/connections", json={"pairs": [[1, 2]]})
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            if event["kind"] == "reconfiguration":
                break
        assert event["seq"] > snapshot["seq"]
        assert event["data"]["switch"] == "ocs2" and event["data"]["connected"] == [[1, 2]]


async def test_bad_requests_are_refused_and_change_nothing(running: Running) -> None:
    daemon, emulated = running
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        before = emulated.truth("ocs1")["changes"]
        cases = [
            (http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 99]]}), 404,
             "port 99 is not on this 8x8"),
            (http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 9]]}), 409,
             "port 9 is already in circuit 1-9"),
            (http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 3]]}), 422,
             "must join an ingress port"),
            (http.post("/v1/switches/nope/connections", json={"pairs": [[1, 9]]}), 404,
             "no switch 'nope'"),
            (http.post("/v1/switches/ocs1/connections", json={"pairs": "1-9"}), 422, "pairs"),
            (http.post("/v1/switches/ocs1/connections", json={"pair": [[1, 9]]}), 422, "pair"),
            (http.post("/v1/switches/ocs1/connections", content=b"{not json",
                       headers={"Content-Type": "application/json"}), 422, ""),
            (http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 10]]},
                       headers={"Authorization": "Bearer wrong"}), 401, "bearer token"),
            (http.post("/v1/circuits", json={"from": "a", "to": "zzz"}), 404, "no path from"),
            (http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 10]],
                                                              "cause": "recovery"}), 422,
             "cause"),  # the daemon's own cause is not the API's to claim
            (http.post("/v1/drills/failover", json={}), 409, "GPU hosts emulated"),
            (http.post("/v1/drills/failover", json={"kind": "psu"}), 422, "kind"),
        ]
        for call, status, words in cases:
            r = await call
            assert r.status_code == status, (r.status_code, r.text)
            assert words in r.text
        rows = (await http.get("/v1/reconfigurations")).json()
    assert len(rows) == 1  # only the first, good request
    assert emulated.truth("ocs1")["changes"] == before
    assert daemon.engine.intended["ocs1"] == {1: 9}


async def test_restart_restores_the_intended_state(lab: Lab, tmp_path: Path) -> None:
    emulated, entries = emulated_lab(lab)
    async with emulated:
        addresses = {e.id: endpoint_of(emulated, e) for e in entries}
        db = str(tmp_path / "store.sqlite")
        async with Daemon(lab, db=db, port=0, token=TOKEN, addresses=addresses) as daemon, \
                httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            await http.post("/v1/switches/ocs1/connections",
                            json={"pairs": [[2, 10], [3, 11]], "verify_light": False})
        emulated.reset("ocs1")  # the switch lost its circuits while labd was down
        async with Daemon(lab, db=db, port=0, token=TOKEN, addresses=addresses) as again:
            report = again.report
            assert report.drift["ocs1"].missing == {2: 10, 3: 11}
            assert report.restored == ["ocs1"]
            assert emulated.device("ocs1").model.connections == {2: 10, 3: 11}  # type: ignore[attr-defined]
            rows = await again.store.read(lambda s: s.execute(
                sqlalchemy.text("select cause from reconfigurations")).all())
            assert [r[0] for r in rows] == ["api", "restore"]


async def test_an_offline_switch_is_a_clear_503(running: Running) -> None:
    daemon, emulated = running
    await emulated.power("ocs1", on=False)
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        with pytest.raises(InstrumentError):  # the first request finds the link gone ...
            await daemon.engine.switches["ocs1"].cross_connects()
        r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        assert r.status_code == 503  # ... then every request is refused at once
        assert "ocs1 is backoff" in r.json()["detail"] or "ocs1 is connecting" in r.json()[
            "detail"]
        instruments = {i["id"]: i for i in (await http.get("/v1/instruments")).json()}
        assert instruments["ocs1"]["state"] in ("backoff", "connecting")
        assert instruments["ocs1"]["last_error"]


#: Every NIC sends into the leaf; the leaf's egress 5-7 go up to the spine's ports 1-3; the
#: spine's ports 4-6 come down to the NICs. h0 (a host of real agents) is no endpoint.
TWO_HOPS = (
    switch("leaf", size="4x4", technology="ideal"),
    switch("spine", driver="calient-tl1", size="8", user="u", password="p",
           technology="ideal"),
    *(endpoint(g, launch_dbm=0) for g in ("g0", "g1", "g2")),
    host("h0", nics=["g0", "g1"], emulate=False),
    job("ring3", ["g0", "g1", "g2"]),
    *(fiber(f"g{i}", f"leaf:{i + 1}") for i in range(3)),
    *(fiber(f"leaf:{i + 5}", f"spine:{i + 1}") for i in range(3)),
    *(fiber(f"spine:{i + 4}", f"g{i}") for i in range(3)),
)


async def test_circuits_and_jobs_over_two_switches(start_rig: StartRig) -> None:
    async with start_rig("hops", *TWO_HOPS, token=TOKEN) as rig:
        daemon, emulated = rig.daemon, rig.emulated
        assert emulated is not None
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            r = await http.post("/v1/circuits", json={"from": "g0", "to": "g1"})
            assert r.status_code == 200, r.text
            hops = r.json()["route"]["hops"]
            assert [h["switch"] for h in hops] == ["leaf", "spine"]
            # g0 -> leaf:1 -> leaf:5 -> spine:1 -> spine:5 -> g1
            assert (hops[0]["ingress"], hops[1]["egress"]) == (1, 5)
            r = await http.post("/v1/jobs/ring3/circuits")
            assert r.status_code == 409, r.text  # g0's only way out is taken
            assert "crosses ports already in circuits (e.g. leaf:1" in r.text
            r = await http.post("/v1/circuits/disconnect", json={"from": "g0", "to": "g1"})
            assert r.status_code == 200, r.text
            assert [(h["switch"], h["ingress"]) for h in r.json()["route"]["hops"]] == [
                ("leaf", 1), ("spine", 1)]
            assert daemon.engine.intended == {"leaf": {}, "spine": {}}
            r = await http.post("/v1/circuits/disconnect", json={"from": "g0", "to": "g1"})
            assert r.status_code == 404 and "no circuit from 'g0' to 'g1'" in r.text
            r = await http.post("/v1/jobs/ring3/circuits")
            assert r.status_code == 200, r.text
            links = [(x["from"], x["to"]) for x in r.json()["routes"]]
            assert links == [("g0", "g1"), ("g1", "g2"), ("g2", "g0")]
            jobs = (await http.get("/v1/jobs")).json()
            assert jobs[0]["links"] == [["g0", "g1"], ["g1", "g2"], ["g2", "g0"]]
            r = await http.post("/v1/jobs/nope/circuits")
            assert r.status_code == 404 and "no job 'nope'" in r.text
            r = await http.post("/v1/circuits", json={"from": "g0", "to": "h0"})
            assert r.status_code == 404 and "no path from 'g0' to 'h0'" in r.text
        leaf = emulated.device("leaf").model.connections  # type: ignore[attr-defined]
        spine = emulated.device("spine").model.connections  # type: ignore[attr-defined]
        assert len(leaf) == 3 and len(spine) == 3


async def test_startup_report_names_every_instrument_that_failed(
        start_rig: StartRig) -> None:
    async with start_rig(
            "bench", *LAB,
            instrument("gone", "polatis-scpi", emulate=False, address="tcp://127.0.0.1:1"),
            instrument("nodev", "thorlabs-pm100", emulate=False,
                       address="serial:///dev/does-not-exist"),
            token=TOKEN) as rig:
        daemon = rig.daemon
        report = daemon.report
        assert set(report.connected) == {"ocs1", "ocs2", "pm1"}
        assert set(report.failed) == {"gone", "nodev"}
        assert "cannot connect to tcp://127.0.0.1:1" in report.failed["gone"]
        assert "/dev/does-not-exist" in report.failed["nodev"]
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
            states = {i["id"]: i for i in (await http.get("/v1/instruments")).json()}
            assert states["gone"]["state"] in ("backoff", "connecting")
            assert states["ocs1"]["state"] == "online"
            r = await http.post("/v1/switches/gone/connections", json={"pairs": [[1, 17]]})
            assert r.status_code == 503 and "gone is" in r.json()["detail"]
            r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
            assert r.status_code == 200  # the rest of the lab works


async def test_a_failed_request_is_recorded_and_the_state_reported(running: Running) -> None:
    daemon, emulated = running
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        emulated.inject("ocs1", {"kind": "fail_port", "port": 10})
        r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 10]]})
        assert r.status_code == 200
        result = r.json()
        assert result["outcome"] == "failed" and "port 10 has failed" in result["error"]
        assert "(the switch is unchanged)" in result["error"]
        assert daemon.engine.intended["ocs1"] == {1: 9}
        rows = (await http.get("/v1/reconfigurations", params={"switch": "ocs1"})).json()
        assert [r["outcome"] for r in rows] == ["failed", "ok"]


async def test_api_connections_send_small_writes_at_once(running: Running) -> None:
    """Nagle off on every API connection: a response written in two parts must not wait
    for the client's delayed ACK (asyncio's standard loop sets TCP_NODELAY only when the
    listening socket names IPPROTO_TCP)."""
    import socket

    daemon, _ = running
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as http:
        assert (await http.get("/v1/health")).status_code == 200
        server = daemon._server
        assert server is not None
        (connection,) = server.server_state.connections
        sock = connection.transport.get_extra_info("socket")  # type: ignore[attr-defined]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


async def test_a_change_on_several_metered_paths_is_watched_from_one_moment(
        start_rig: StartRig) -> None:
    """Every channel a change lights is logged from the same start, armed in one exchange
    with the meter: armed one after another, the first windows could end before the change
    was even sent."""
    paths = [metered(f"a{i}", f"b{i}", i, i + 8, i) for i in (1, 2, 3)]
    async with daemon_on(start_rig, *LAB[:3], *paths) as (daemon, _), httpx.AsyncClient(
            base_url=daemon.url, headers=AUTH) as http:
        r = await http.post("/v1/switches/ocs1/connections",
                            json={"pairs": [[1, 9], [2, 10], [3, 11]]})
        result = r.json()
        assert result["outcome"] == "ok", result
        traces = (await http.get(f"/v1/reconfigurations/{result['id']}/traces")).json()
    assert sorted(t["channel"] for t in traces) == [1, 2, 3]
    assert len({t["start_ns"] for t in traces}) == 1
    assert all(t["dbm"][0] < -60 and t["dbm"][-1] > -30 for t in traces)


async def test_a_mesh_disconnect_on_a_metered_path_is_not_checked_for_darkness(
        start_rig: StartRig) -> None:
    """A mesh's light always goes somewhere, and its disconnect changes nothing on the chip:
    it was refused as "light not gone" on every metered path (the demo's sweep: a quarter
    of its checks)."""
    mesh = switch("mesh1", driver="qontrol-mesh", size="4x4")
    parts = (mesh, PM1, metered("a", "b", 1, 5, 1, switch="mesh1"))
    async with daemon_on(start_rig, *parts) as (daemon, _), httpx.AsyncClient(
            base_url=daemon.url, headers=AUTH) as http:
        made = (await http.post("/v1/switches/mesh1/connections",
                                json={"pairs": [[1, 5]]})).json()
        assert made["outcome"] == "ok", made
        broken = (await http.post("/v1/switches/mesh1/disconnect", json={"ports": [1]})).json()
        assert broken["outcome"] == "ok", broken
        assert broken["error"] is None
