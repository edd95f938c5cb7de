"""A hold outlives its leader: taken on the leader of an ``--ha`` pair, it is refused on the
daemon that takes over, which read it from the store (PostgreSQL, the lease's database)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from labd.daemon.core import Daemon
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.ha.role import HaSettings
from labd.lab.loader import Lab, load_lab
from tests.databases import postgres_database
from tests.labs import switch, write_lab
from tests.rigs import next_event

TOKEN = "ha-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A lease that a loaded machine does not lose meanwhile: the test stops the leader itself.
HA = dict(renew_s=0.2, ttl_s=3.0)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[tuple[Lab, dict[str, str]]]:
    _, path = write_lab(tmp_path, "ha", switch("ocs1", size="8x8"), name="haholds")
    lab = load_lab(path)
    emulated, entries = emulated_lab(lab)
    async with emulated:
        yield lab, {e.id: endpoint_of(emulated, e) for e in entries}


def daemon(lab: tuple[Lab, dict[str, str]], url: str) -> Daemon:
    return Daemon(lab[0], db=url, addresses=lab[1], port=0, token=TOKEN,
                  ha=HaSettings(url, **HA))


async def test_the_new_leader_refuses_what_the_old_one_held(
        lab: tuple[Lab, dict[str, str]], url: str) -> None:
    first, second = daemon(lab, url), daemon(lab, url)
    async with first:
        async with httpx.AsyncClient(base_url=first.url, headers=AUTH) as http:
            taken = await http.post("/v1/holds", json={"switch": "ocs1", "ports": [1, 9],
                                                       "holder": "scan 42", "ttl_s": 60})
            assert taken.status_code == 201, taken.text
            hold = taken.json()["id"]
        async with second:
            async with httpx.AsyncClient(base_url=second.url, headers=AUTH) as http:
                # Read on the standby before it leads: what it knows is read again then.
                assert (await http.get("/v1/holds")).json()[0]["id"] == hold
            async with httpx.AsyncClient(base_url=first.url, headers=AUTH) as http:
                later = await http.post("/v1/holds", json={
                    "switch": "ocs1", "ports": [2], "holder": "sweep 7", "ttl_s": 60})
                assert later.status_code == 201, later.text
            _, events = second.hub.subscribe()
            await first.stop()
            await next_event(events, "ha.leading", timeout=10)
            async with httpx.AsyncClient(base_url=second.url, headers=AUTH) as http:
                refused = await http.post("/v1/switches/ocs1/connections",
                                          json={"pairs": [[1, 9]]})
                assert refused.status_code == 409, refused.text
                assert "held by 'scan 42'" in refused.json()["detail"]
                refused = await http.post("/v1/switches/ocs1/disconnect", json={"ports": [2]})
                assert refused.status_code == 409 and "'sweep 7'" in refused.json()["detail"]
                made = await http.post("/v1/switches/ocs1/connections",
                                       json={"pairs": [[1, 9]], "hold": hold})
                assert made.status_code == 200 and made.json()["outcome"] == "ok", made.text
                assert (await http.put(f"/v1/holds/{hold}")).status_code == 200
