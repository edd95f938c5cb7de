"""The map audit: a second client changes a switch's circuits behind the daemon's back,
over the emulator's own protocol port (a real socket), while the daemon is idle; the
audit (``audit_interval_s``) finds it and the switch's ``on_drift`` deals with it."""

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from labd.emulation.rig import Rig
from tests.labs import switch
from tests.rigs import AUTH, StartRig, next_event

CIRCUITS = [[2, 10], [3, 11]]


async def another_controller(rig: Rig, *commands: str) -> list[str]:
    """Send SCPI commands to the switch as another controller would (its own TCP
    connection to the device), each followed by ``*OPC?``; the answers."""
    where = urlsplit(rig.addresses["ocs1"])
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    answers = []
    try:
        for command in commands:
            writer.write(f"{command}\n*OPC?\n".encode())
            await writer.drain()
            answers.append((await asyncio.wait_for(reader.readline(), 10)).decode().strip())
    finally:
        writer.close()
        await writer.wait_closed()
    return answers


def held(rig: Rig) -> dict[int, int]:
    assert rig.emulated is not None
    return dict(rig.emulated.device("ocs1").model.connections)  # type: ignore[attr-defined]


async def with_circuits(rig: Rig) -> None:
    async with httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        r = await http.post("/v1/switches/ocs1/connections",
                            json={"pairs": CIRCUITS, "verify_light": False})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("policy", ["restore", "report", "adopt"])
async def test_the_audit_finds_a_change_made_by_another_controller(
        start_rig: StartRig, policy: str) -> None:
    async with start_rig(f"audit{policy}", switch(size="8x8", watch_interval_s=0,
                                                  audit_interval_s=0.1, on_drift=policy),
                         token="t") as rig:
        await with_circuits(rig)
        _, sub = rig.daemon.hub.subscribe()
        # Another controller drops 2-10 and makes 4-12, on its own connection, in one
        # command (two could be audited between them, and dealt with one at a time).
        assert await another_controller(rig, ":OXC:SWIT:CONN:ONLY (@3,4),(@11,12)") == ["1"]
        found = await next_event(sub, "instrument.drift")
        assert found.data["audit"] is True
        drift = await next_event(sub, "drift")
        assert drift.data["when"] == "audit" and drift.data["policy"] == policy
        assert drift.data["missing"] == [[2, 10]] and drift.data["unexpected"] == [[4, 12]]
        engine = rig.daemon.engine
        if policy == "restore":
            restored = await next_event(sub, "reconfiguration")
            assert restored.data["cause"] == "restore" and restored.data["outcome"] == "ok"
            assert held(rig) == {2: 10, 3: 11}
        elif policy == "adopt":
            adopted = await next_event(sub, "reconfiguration")
            assert adopted.data["cause"] == "adopt"
            assert engine.intended["ocs1"] == {3: 11, 4: 12}
        else:
            assert engine.intended["ocs1"] == {2: 10, 3: 11}
            assert held(rig) == {3: 11, 4: 12}
        assert rig.daemon.drivers["ocs1"].audits >= 1  # type: ignore[attr-defined]


async def test_without_an_audit_interval_the_watch_only_probes(start_rig: StartRig) -> None:
    """Off by default: the liveness watch sends its probe, never a map read."""
    async with start_rig("noaudit", switch(size="8x8", watch_interval_s=0.05),
                         token="t") as rig:
        driver: Any = rig.daemon.drivers["ocs1"]
        assert driver.audit_interval_s == 0
        probed = asyncio.Event()
        probes = 0
        probe = driver._probe

        async def counted(link: Any) -> None:
            nonlocal probes
            await probe(link)
            probes += 1
            if probes == 3:
                probed.set()

        driver._probe = counted
        await asyncio.wait_for(probed.wait(), 15)
        assert driver.audits == 0
