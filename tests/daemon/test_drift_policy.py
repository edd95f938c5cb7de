"""A switch power-cycled while idle, on a running daemon: the liveness watch finds it gone,
the daemon marks it offline and, once it is back, deals with what it lost as the switch's
``on_drift`` says (restore, report, adopt). Real emulators over TCP, the real store."""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy

from instruments.events import LinkState
from labd.emulation.rig import Rig
from labd.events import Event, Subscription
from tests.labs import switch
from tests.rigs import AUTH, StartRig, next_event

CIRCUITS = [[2, 10], [3, 11]]


@contextlib.asynccontextmanager
async def cycled(start_rig: StartRig, tag: str, *, restore: bool = True, **fields: Any
                 ) -> AsyncIterator[tuple[Rig, Subscription, Event]]:
    """A daemon on one switch holding CIRCUITS (``fields``: its lab-file entry's), the
    switch powered off and on while nobody uses it; the rig, a subscription to its events
    from before the power cycle, and the daemon's drift event."""
    async with start_rig(tag, switch(size="8x8", watch_interval_s=0.1, **fields), token="t",
                         restore=restore) as rig:
        async with httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
            r = await http.post("/v1/switches/ocs1/connections",
                                json={"pairs": CIRCUITS, "verify_light": False})
            assert r.status_code == 200, r.text
        _, sub = rig.daemon.hub.subscribe()
        assert rig.emulated is not None
        await rig.emulated.power("ocs1", on=False)
        while (await next_event(sub, "instrument.state")).data["state"] != "backoff":
            pass  # no command was sent: the closed link, or the watch, told
        assert rig.daemon.drivers["ocs1"].state is not LinkState.ONLINE
        await rig.emulated.power("ocs1", on=True)
        yield rig, sub, await next_event(sub, "drift")


async def causes(rig: Rig) -> list[tuple[Any, ...]]:
    rows = await rig.daemon.store.read(lambda s: s.execute(sqlalchemy.text(
        "select cause, outcome from reconfigurations order by id")).all())
    return [tuple(r) for r in rows]


def held(rig: Rig) -> dict[int, int]:
    assert rig.emulated is not None
    return dict(rig.emulated.device("ocs1").model.connections)  # type: ignore[attr-defined]


@pytest.mark.parametrize("driver", ["polatis-scpi", "polatis-tl1"])
async def test_restore_puts_back_what_a_power_cycle_lost(start_rig: StartRig,
                                                         driver: str) -> None:
    options = {"user": "admin", "password": "root"} if driver == "polatis-tl1" else {}
    async with cycled(start_rig, "heal", driver=driver, **options) as (rig, sub, drift):
        assert drift.data["missing"] == CIRCUITS and drift.data["unexpected"] == []
        assert drift.data["policy"] == "restore" and drift.data["when"] == "reconnect"
        assert "emptied" in drift.data["restarted"]
        restored = await next_event(sub, "reconfiguration")
        assert restored.data["cause"] == "restore" and restored.data["outcome"] == "ok"
        assert restored.data["connected"] == CIRCUITS
        assert restored.data["phases"]["acknowledged"] is not None  # timed like any other
        assert held(rig) == {2: 10, 3: 11}
        assert rig.daemon.engine.intended["ocs1"] == {2: 10, 3: 11}
        assert await causes(rig) == [("api", "ok"), ("restore", "ok")]


async def test_report_names_the_missing_circuits_and_changes_nothing(
        start_rig: StartRig) -> None:
    async with cycled(start_rig, "report", on_drift="report") as (rig, _, drift):
        assert drift.data["missing"] == CIRCUITS and drift.data["policy"] == "report"
        async with httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
            r = await http.get("/v1/switches/ocs1")
            assert r.status_code == 200, r.text
        assert rig.daemon.engine.intended["ocs1"] == {2: 10, 3: 11}  # still what is wanted
        assert held(rig) == {}
        assert [c for c, *_ in await causes(rig)] == ["api"]


async def test_adopt_takes_the_switch_map_as_intended(start_rig: StartRig) -> None:
    async with cycled(start_rig, "adopt", on_drift="adopt") as (rig, sub, drift):
        assert drift.data["policy"] == "adopt"
        adopted = await next_event(sub, "reconfiguration")
        assert adopted.data["cause"] == "adopt" and adopted.data["disconnected"] == CIRCUITS
        assert rig.daemon.engine.intended["ocs1"] == {}
        assert rig.daemon.engine.plan("ocs1", connect=[(2, 10)]) == ([(2, 10)], [])
        assert [c for c, *_ in await causes(rig)] == ["api", "adopt"]
        assert await rig.daemon.store.intended() == {}


async def test_no_restore_overrides_every_switch(start_rig: StartRig) -> None:
    async with cycled(start_rig, "norestore", restore=False) as (rig, _, drift):
        assert rig.daemon.on_drift("ocs1") == "report"
        assert drift.data["policy"] == "report"
        assert [c for c, *_ in await causes(rig)] == ["api"]
