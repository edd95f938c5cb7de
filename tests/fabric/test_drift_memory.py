"""The drift policy on emulated switches over the in-memory link (tests/memory_rig.py): a
switch found at start-up holding other circuits than the store intends, and one that comes
back from a power cycle, each dealt with as its ``on_drift`` says (restore, report, adopt;
``--no-restore`` makes every switch report), against the emulator's ground truth and the
events published; one heal at a time per switch; a restore the store refuses is a warning,
and the next reconnect tries again. No socket, no daemon: the daemon's own
path is tests/daemon/test_drift_policy.py's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from instruments.polatis_scpi import PolatisScpi
from labd.events import Event, Subscription
from tests.labs import switch
from tests.memory_rig import MemoryBench, MemoryLab, engine_on, memory_lab
from tests.rigs import next_event
from tests.store.refusals import refusing

CIRCUITS = [[2, 10], [3, 11]]


async def causes(bench: MemoryBench) -> list[tuple[Any, ...]]:
    rows = await bench.store.read(lambda s: s.execute(sqlalchemy.text(
        "select cause, outcome from reconfigurations order by id")).all())
    return [tuple(r) for r in rows]


def drifts(seen: list[Event]) -> list[dict[str, Any]]:
    return [e.data for e in seen if e.kind == "drift"]


async def changed_between_lives(memory: MemoryLab) -> None:
    """A daemon life leaves ocs1 holding CIRCUITS; while no daemon runs, someone at the
    switch's console takes 3-11 away and makes 4-12."""
    async with engine_on(memory) as first:
        result = await first.engine.reconfigure("ocs1", replace={2: 10, 3: 11},
                                                verify_light=False)
        assert result.outcome == "ok", result.error
    async with PolatisScpi(memory.addresses["ocs1"], name="console") as console:
        await console.disconnect([3])
        await console.connect([(4, 12)])
    assert memory.circuits("ocs1") == {2: 10, 4: 12}


@pytest.mark.parametrize("policy", ["restore", "report", "adopt"])
async def test_drift_found_at_start_up_is_dealt_with_as_on_drift_says(
        tmp_path: Path, policy: str) -> None:
    async with memory_lab(tmp_path, switch(size="8x8", on_drift=policy)) as memory:
        await changed_between_lives(memory)
        async with engine_on(memory) as bench:
            seen = bench.events
            (drift,) = drifts(seen)
            assert drift == {"switch": "ocs1", "missing": [[3, 11]], "unexpected": [[4, 12]],
                             "policy": policy, "restarted": None, "when": "start-up"}
            report = bench.report
            assert list(report.connected) == ["ocs1"] and not report.failed
            assert (report.drift["ocs1"].missing, report.drift["ocs1"].unexpected) == (
                {3: 11}, {4: 12})
            if policy == "restore":
                assert (report.restored, report.adopted) == (["ocs1"], [])
                assert bench.circuits("ocs1") == {2: 10, 3: 11} == bench.engine.intended["ocs1"]
                (restored,) = [e.data for e in seen if e.kind == "reconfiguration"]
                assert (restored["cause"], restored["outcome"]) == ("restore", "ok")
                assert (restored["connected"], restored["disconnected"]) == (
                    [[3, 11]], [[4, 12]])
                assert await causes(bench) == [("api", "ok"), ("restore", "ok")]
            elif policy == "report":
                assert (report.restored, report.adopted) == ([], [])
                assert bench.circuits("ocs1") == {2: 10, 4: 12}  # left as found
                assert bench.engine.intended["ocs1"] == {2: 10, 3: 11}  # still what is wanted
                assert await causes(bench) == [("api", "ok")]
            else:
                assert (report.restored, report.adopted) == ([], ["ocs1"])
                assert bench.circuits("ocs1") == {2: 10, 4: 12}  # nothing sent
                assert bench.engine.intended["ocs1"] == {2: 10, 4: 12}
                assert await bench.store.intended() == {"ocs1": {2: 10, 4: 12}}
                assert [c for c, _ in await causes(bench)] == ["api", "adopt"]


async def test_no_restore_makes_every_switch_report(tmp_path: Path) -> None:
    async with memory_lab(tmp_path, switch(size="8x8", on_drift="adopt")) as memory:
        await changed_between_lives(memory)
        async with engine_on(memory, restore=False) as bench:
            assert bench.drift.on_drift("ocs1") == "report"
            (drift,) = drifts(bench.events)
            assert drift["policy"] == "report"
            assert (bench.report.restored, bench.report.adopted) == ([], [])
            assert bench.circuits("ocs1") == {2: 10, 4: 12}
            assert bench.engine.intended["ocs1"] == {2: 10, 3: 11}
            assert await causes(bench) == [("api", "ok")]


@contextlib.asynccontextmanager
async def cycled(tmp_path: Path, observer: Callable[[MemoryBench, Event], None] | None = None,
                 **fields: Any) -> AsyncIterator[tuple[MemoryBench, Subscription, Event]]:
    """A daemon life on one switch holding CIRCUITS (``fields``: its lab-file entry's), the
    switch powered off and on while nobody uses it; the bench, a subscription to its events
    from before the power cycle, and the drift event. ``observer`` hears every event from
    the power cycle on, as it is published."""
    async with memory_lab(tmp_path, switch(size="8x8", **fields)) as memory, \
            engine_on(memory) as bench:
        result = await bench.engine.reconfigure("ocs1", connect=[(2, 10), (3, 11)],
                                                verify_light=False)
        assert result.outcome == "ok", result.error
        _, sub = bench.hub.subscribe()
        if observer is not None:
            bench.hub.observe(lambda event: observer(bench, event))
        memory.power_off("ocs1")
        while (await next_event(sub, "instrument.state", 5)).data["state"] != "backoff":
            pass  # the cut line told the driver
        memory.power_on("ocs1")  # a Polatis boots dark
        assert bench.circuits("ocs1") == {}
        try:
            yield bench, sub, await next_event(sub, "drift", 5)
        finally:
            sub.close()


async def test_restore_puts_back_what_a_power_cycle_lost(tmp_path: Path) -> None:
    async with cycled(tmp_path) as (bench, sub, drift):
        assert drift.data["missing"] == CIRCUITS and drift.data["unexpected"] == []
        assert drift.data["policy"] == "restore" and drift.data["when"] == "reconnect"
        assert "emptied" in drift.data["restarted"]
        restored = await next_event(sub, "reconfiguration", 5)
        assert restored.data["cause"] == "restore" and restored.data["outcome"] == "ok"
        assert restored.data["connected"] == CIRCUITS
        assert restored.data["phases"]["acknowledged"] is not None  # timed like any other
        assert bench.circuits("ocs1") == {2: 10, 3: 11} == bench.engine.intended["ocs1"]
        assert await causes(bench) == [("api", "ok"), ("restore", "ok")]


async def test_report_names_the_missing_circuits_and_changes_nothing(tmp_path: Path) -> None:
    async with cycled(tmp_path, on_drift="report") as (bench, _, drift):
        assert drift.data["missing"] == CIRCUITS and drift.data["policy"] == "report"
        assert "emptied" in drift.data["restarted"]
        for task in bench.drift.take_tasks():  # the heal, to its end
            await task
        assert bench.engine.intended["ocs1"] == {2: 10, 3: 11}  # still what is wanted
        assert bench.circuits("ocs1") == {}
        assert await causes(bench) == [("api", "ok")]


async def test_adopt_takes_the_switch_map_as_intended(tmp_path: Path) -> None:
    async with cycled(tmp_path, on_drift="adopt") as (bench, sub, drift):
        assert drift.data["policy"] == "adopt"
        adopted = await next_event(sub, "reconfiguration", 5)
        assert adopted.data["cause"] == "adopt" and adopted.data["disconnected"] == CIRCUITS
        assert bench.engine.intended["ocs1"] == {} == bench.circuits("ocs1")
        assert bench.engine.plan("ocs1", connect=[(2, 10)]) == ([(2, 10)], [])
        assert [c for c, _ in await causes(bench)] == ["api", "adopt"]
        assert await bench.store.intended() == {}


async def test_a_reconnect_during_a_heal_is_looked_at_when_it_ends(tmp_path: Path) -> None:
    """A second reconnect announced while the first one's heal runs starts no second heal
    beside it (that one would find the same drift and restore it again): the switch is
    looked at again once the first heal ends."""
    announced: list[int] = []

    def reconnect_again(bench: MemoryBench, event: Event) -> None:
        # As the daemon hears a reconnect: why it looks restarted, then online; here while
        # the first heal is between its drift event and its restore.
        if event.kind == "drift" and not announced:
            announced.append(event.at_ns)
            bench.drift.restarted["ocs1"] = "a second reconnect"
            bench.drift.came_online("ocs1")

    async with cycled(tmp_path, reconnect_again, switch_ms=5) as (bench, sub, _):
        restored = await next_event(sub, "reconfiguration", 5)
        assert restored.data["cause"] == "restore"
        (heal,) = bench.drift.take_tasks()
        await heal
        assert len(drifts(bench.events)) == 1  # one drift, dealt with once
        assert bench.circuits("ocs1") == {2: 10, 3: 11}
        assert await causes(bench) == [("api", "ok"), ("restore", "ok")]
        # The second reconnect was looked at (its note taken) after the first heal.
        assert "ocs1" not in bench.drift.restarted


async def power_cycle(memory: MemoryLab, sub: Subscription) -> None:
    memory.power_off("ocs1")
    while (await next_event(sub, "instrument.state", 5)).data["state"] != "backoff":
        pass
    memory.power_on("ocs1")


async def test_a_restore_the_store_refuses_is_a_warning_and_the_next_reconnect_retries(
        tmp_path: Path) -> None:
    async with memory_lab(tmp_path, switch(size="8x8")) as memory, \
            engine_on(memory) as bench:
        await bench.engine.reconfigure("ocs1", connect=[(2, 10), (3, 11)], verify_light=False)
        _, sub = bench.hub.subscribe()
        with refusing(bench.store, "read-only"):
            await power_cycle(memory, sub)
            # The engine's own warning (the refused change), then the policy's.
            while not (await next_event(sub, "warning", 5)).data["detail"].startswith(
                    "ocs1: the drift found on reconnecting was not dealt with: ocs1: the "
                    "change is refused"):
                pass
        assert bench.engine.intended["ocs1"] == {2: 10, 3: 11}
        assert await causes(bench) == [("api", "ok")]  # no restore kept
        await power_cycle(memory, sub)
        restored = await next_event(sub, "reconfiguration", 5)
        assert (restored.data["cause"], restored.data["outcome"]) == ("restore", "ok")
        assert bench.circuits("ocs1") == {2: 10, 3: 11}
        assert await causes(bench) == [("api", "ok"), ("restore", "ok")]
        sub.close()
