"""``GET /v1/endpoints`` and ``GET /v1/circuits/plan`` on an emulated lab over a real
socket: a plan names the switches and ports the real ``POST /v1/circuits`` then
cross-connects, or why it would refuse and what is in the way; bad input is a 4xx that
names the field; and asking changes nothing."""

from pathlib import Path
from typing import Any

import httpx

from labd.lab.loader import load_lab
from tests.labs import endpoint, fiber, switch, write_lab
from tests.rigs import AUTH, StartRig

#: Two 8x8 switches in series: a and c enter ocs1, b and d leave ocs2, two fibres between.
LAB = (switch("ocs1", switch_ms=1), switch("ocs2", switch_ms=1),
       endpoint("a.nic0", launch_dbm=0), endpoint("c.nic0", launch_dbm=0),
       endpoint("b.nic0"), endpoint("d.nic0"),
       fiber("a.nic0", "ocs1:1"), fiber("c.nic0", "ocs1:2"),
       fiber("ocs1:9", "ocs2:1"), fiber("ocs1:10", "ocs2:2"),
       fiber("ocs2:9", "b.nic0"), fiber("ocs2:10", "d.nic0"))


async def plan(http: httpx.AsyncClient, src: str, dst: str) -> dict[str, Any]:
    r = await http.get("/v1/circuits/plan", params={"from": src, "to": dst})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def test_a_plan_is_what_the_connect_then_does(start_rig: StartRig) -> None:
    async with start_rig("plan", *LAB, token="t") as rig, httpx.AsyncClient(
            base_url=rig.daemon.url, headers=AUTH) as http:
        engine = rig.daemon.engine
        listed = (await http.get("/v1/endpoints")).json()
        assert [e["id"] for e in listed] == ["a.nic0", "c.nic0", "b.nic0", "d.nic0"]
        assert listed[0] == {"id": "a.nic0", "launch_dbm": 0.0, "wavelength_nm": 1310.0,
                             "host": None, "circuit": None}

        planned = await plan(http, "a.nic0", "b.nic0")
        assert planned["possible"] and planned["reason"] is None
        assert planned["in_the_way"] == [] and planned["existing"] is None
        assert planned["route"]["hops"] == [
            {"switch": "ocs1", "ingress": 1, "egress": 9},
            {"switch": "ocs2", "ingress": 1, "egress": 9}]
        # Asking touched nothing.
        assert not any(engine.intended.values())
        assert (await http.get("/v1/reconfigurations")).json() == []

        made = await http.post("/v1/circuits", json={"from": "a.nic0", "to": "b.nic0"})
        assert made.status_code == 200, made.text
        assert made.json()["route"] == planned["route"]
        assert engine.intended == {"ocs1": {1: 9}, "ocs2": {1: 9}}

        # The same again: already up, so refused; the plan says so before the connect does.
        again = await plan(http, "a.nic0", "b.nic0")
        assert not again["possible"] and again["reason"] == "the circuit is already up"
        assert again["existing"] == planned["route"] and again["route"] is None

        # c → b needs ocs2:9, which a → b holds: nothing is displaced, the plan names it.
        blocked = await plan(http, "c.nic0", "b.nic0")
        assert not blocked["possible"] and blocked["route"] is None
        assert "crosses ports already in circuits" in blocked["reason"]
        assert {"switch": "ocs2", "port": 9, "partner": 1,
                "circuit": planned["route"]} in blocked["in_the_way"]
        refused = await http.post("/v1/circuits", json={"from": "c.nic0", "to": "b.nic0"})
        assert refused.status_code == 409
        # c → d goes the other way round, over ocs1:10 and ocs2:2.
        other = await plan(http, "c.nic0", "d.nic0")
        assert other["possible"] and other["route"]["hops"] == [
            {"switch": "ocs1", "ingress": 2, "egress": 10},
            {"switch": "ocs2", "ingress": 2, "egress": 10}]

        # A raw pair in the way is named as one (no circuit between endpoints), beside the
        # circuit on the shortest cabled path's other taken ports.
        raw = await http.post("/v1/switches/ocs2/connections",
                              json={"pairs": [[2, 10]], "verify_light": False})
        assert raw.status_code == 200, raw.text
        held = await plan(http, "c.nic0", "d.nic0")
        assert not held["possible"]
        assert {"switch": "ocs2", "port": 10, "partner": 2, "circuit": None} in \
            held["in_the_way"]
        assert {"switch": "ocs1", "port": 9, "partner": 1, "circuit": planned["route"]} in \
            held["in_the_way"]
        assert (await http.post("/v1/circuits", json={"from": "c.nic0", "to": "d.nic0"})
                ).status_code == 409

        ends = {e["id"]: e["circuit"] for e in (await http.get("/v1/endpoints")).json()}
        assert ends["a.nic0"] == ends["b.nic0"] == planned["route"]
        assert ends["c.nic0"] is None and ends["d.nic0"] is None


async def test_bad_input_names_the_field_and_changes_nothing(start_rig: StartRig) -> None:
    async with start_rig("planbad", *LAB, token="t") as rig, httpx.AsyncClient(
            base_url=rig.daemon.url, headers=AUTH) as http:
        async def refused(params: dict[str, str], status: int) -> Any:
            r = await http.get("/v1/circuits/plan", params=params)
            assert r.status_code == status, (params, r.text)
            return r.json()["detail"]

        missing = await refused({"to": "b.nic0"}, 422)
        assert [e["loc"] for e in missing] == [["query", "from"]]
        shape = await refused({"from": "a.nic0", "to": "b nic0; drop"}, 422)
        assert [e["loc"] for e in shape] == [["query", "to"]]
        long = await refused({"from": "a" * 65, "to": "b.nic0"}, 422)
        assert [e["loc"] for e in long] == [["query", "from"]]
        unknown = await refused({"from": "nowhere", "to": "b.nic0"}, 404)
        assert unknown.startswith("from: no endpoint 'nowhere' in the lab") and "a.nic0" in \
            unknown
        assert (await refused({"from": "a.nic0", "to": "zz"}, 404)).startswith(
            "to: no endpoint 'zz'")
        same = await refused({"from": "a.nic0", "to": "a.nic0"}, 422)
        assert same[0]["loc"] == ["query", "to"] and "same endpoint" in same[0]["msg"]
        # Nothing was changed or recorded.
        assert not any(rig.daemon.engine.intended.values())
        assert (await http.get("/v1/reconfigurations")).json() == []


def test_a_plan_through_a_switch_that_is_not_online_says_so(tmp_path: Path) -> None:
    from labd.fabric.preview import plan_circuit

    _, path = write_lab(tmp_path, "planoff", *LAB)
    lab = load_lab(path)
    sizes = {"ocs1": (8, 8), "ocs2": (8, 8)}
    intended: dict[str, dict[int, int]] = {"ocs1": {}, "ocs2": {}}
    one = plan_circuit(lab, "a.nic0", "b.nic0", sizes, intended, {"ocs1"})
    assert one.route is not None and one.offline == ("ocs2",)
    assert one.reason == "ocs2 is not online"
    both = plan_circuit(lab, "a.nic0", "b.nic0", sizes, intended, set())
    assert both.offline == ("ocs1", "ocs2") and both.reason == "ocs1, ocs2 are not online"
    # A switch never identified (offline since start-up): its size is unknown, so no path
    # through it can be told, and the plan says which switch is not known yet.
    unknown = plan_circuit(lab, "a.nic0", "b.nic0", {"ocs1": (8, 8)}, intended, {"ocs1"},
                           {"ocs2"})
    assert unknown.route is None and unknown.offline == ("ocs2",)
    assert unknown.reason == ("no path from 'a.nic0' to 'b.nic0' in the lab's cabling over "
                              "the switches identified so far (not yet: ocs2)")
