"""Holds (``/v1/holds``): ports held by one client under a lease it renews; others' changes
to them refused with the holder named, the holder's own let through, the hold gone when it
is released or no longer renewed, and kept in the store for the next daemon."""

import asyncio

import pytest

from labd.client.api import DaemonClient
from labd.errors import DaemonError
from tests.labs import endpoint, fiber, switch
from tests.rigs import StartRig

LAB = (switch(switch_ms=1, size="8x8"),)


async def test_a_hold_refuses_others_and_lets_its_holder_through(start_rig: StartRig
                                                                 ) -> None:
    async with start_rig("holds", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            hold = await client.hold("ocs1", [1, 9], "alice's scan", ttl_s=30)
            assert hold["ports"] == [1, 9] and hold["holder"] == "alice's scan"
            for method, path, body in [
                    ("POST", "/v1/switches/ocs1/connections", {"pairs": [[1, 10]]}),
                    ("PUT", "/v1/switches/ocs1/connections", {"pairs": [[2, 9]]}),
                    ("POST", "/v1/switches/ocs1/disconnect", {"ports": [9]})]:
                with pytest.raises(DaemonError, match=r"409 ocs1 port.* held by \"alice's "
                                                      rf"scan\" \(hold {hold['id']}"):
                    await client.request(method, path, body)
            with pytest.raises(DaemonError, match=r"409 .*held by"):
                await client.hold("ocs1", [9, 10], "bob")
            made = await client.post("/v1/switches/ocs1/connections",
                                     {"pairs": [[1, 9]], "hold": hold["id"]})
            assert made["outcome"] == "ok"

            # Ports nobody holds change as ever.
            other = await client.post("/v1/switches/ocs1/connections", {"pairs": [[2, 10]]})
            assert other["outcome"] == "ok"
            listed = await client.get("/v1/holds")
            assert [h["id"] for h in listed] == [hold["id"]]
            assert (await client.renew_hold(hold["id"]))["expires_in_s"] > 29
            await client.release_hold(hold["id"])
            assert await client.get("/v1/holds") == []
            assert (await client.put("/v1/switches/ocs1/connections", {"pairs": []})
                    )["outcome"] == "ok"
            with pytest.raises(DaemonError, match="404 no hold"):
                await client.renew_hold(hold["id"])
        finally:
            await client.close()


async def test_a_hold_not_renewed_ends(start_rig: StartRig) -> None:
    async with start_rig("holds", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            await client.hold("ocs1", [1], "a plan that died", ttl_s=0.5)
            async with asyncio.timeout(10):
                while await client.get("/v1/holds"):  # noqa: ASYNC110 - the lease's own time
                    await asyncio.sleep(0.1)
            made = await client.post("/v1/switches/ocs1/connections", {"pairs": [[1, 9]]})
            assert made["outcome"] == "ok"
        finally:
            await client.close()


async def test_the_next_daemon_on_the_store_keeps_the_hold(start_rig: StartRig) -> None:
    async with start_rig("holds", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        hold = await client.hold("ocs1", [3], "a long measurement", ttl_s=120)
        await client.close()
    async with start_rig("holds", *LAB, token="t") as rig:  # the same store
        client = DaemonClient(rig.daemon.url, "t")
        try:
            with pytest.raises(DaemonError, match="held by 'a long measurement'"):
                await client.post("/v1/switches/ocs1/connections", {"pairs": [[3, 11]]})
            assert [h["id"] for h in await client.get("/v1/holds")] == [hold["id"]]
        finally:
            await client.close()


@pytest.mark.parametrize(("body", "says"), [
    ({"switch": "ocs1", "ports": [], "holder": "x"}, "ports"),
    ({"switch": "ocs1", "ports": [1], "holder": ""}, "holder"),
    ({"switch": "ocs1", "ports": [1], "holder": "x", "ttl_s": 0}, "ttl_s"),
    ({"switch": "ocs1", "ports": ["1"], "holder": "x"}, "ports"),
    ({"switch": "ocsX", "ports": [1], "holder": "x"}, "ocsX"),
])
async def test_bad_holds_are_refused(start_rig: StartRig, body: dict[str, object],
                                     says: str) -> None:
    async with start_rig("holds", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            with pytest.raises(DaemonError, match=says):
                await client.post("/v1/holds", body)
            assert await client.get("/v1/holds") == []
        finally:
            await client.close()


async def test_a_circuit_across_a_held_port_is_refused(start_rig: StartRig) -> None:
    parts = (*LAB, endpoint("a", launch_dbm=0), endpoint("b"), fiber("a", "ocs1:1"),
             fiber("ocs1:9", "b"))
    async with start_rig("holds", *parts, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            hold = await client.hold("ocs1", [9], "bob", ttl_s=30)
            with pytest.raises(DaemonError, match="409 ocs1 port 9 held by 'bob'"):
                await client.post("/v1/circuits", {"from": "a", "to": "b"})
            made = await client.post("/v1/circuits", {"from": "a", "to": "b",
                                                      "hold": hold["id"]})
            assert [r["outcome"] for r in made["reconfigurations"]] == ["ok"]
            # Freeing port 1, held by nobody, frees its partner 9 as well: refused.
            with pytest.raises(DaemonError, match="409 ocs1 port 9 held by 'bob'"):
                await client.post("/v1/switches/ocs1/disconnect", {"ports": [1]})
            with pytest.raises(DaemonError, match="409 ocs1 port 9 held by 'bob'"):
                await client.post("/v1/circuits/disconnect", {"from": "a", "to": "b"})
            await client.release_hold(hold["id"])
            await client.post("/v1/circuits/disconnect", {"from": "a", "to": "b"})
            assert await client.get("/v1/circuits") == []
        finally:
            await client.close()
