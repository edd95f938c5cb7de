"""The engine's main paths on emulated switches over the in-memory link (tests/memory_rig.py):
each phase against the emulator's ground truth, refusals that touch nothing, one switch
failing beside another that succeeds, someone else's change read back and put right, and a
change the store refuses undone. No socket, no daemon: the socket paths are
tests/fabric/test_engine.py's and tests/daemon's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from instruments.events import InstrumentEvent
from instruments.polatis_scpi import PolatisScpi
from labd.errors import PortBusy, RequestError, StoreUnavailable, UnknownPort, UnknownSwitch
from labd.store.models import Reconfiguration
from tests.labs import meter, metered, switch
from tests.memory_rig import MemoryBench, memory_engine
from tests.store.refusals import refusing


async def recorded(bench: MemoryBench) -> list[Reconfiguration]:
    return list(await bench.store.read(lambda s: s.scalars(
        select(Reconfiguration).order_by(Reconfiguration.id)).all()))


async def count(bench: MemoryBench) -> int:
    return int(await bench.store.read(lambda s: s.scalar(
        select(func.count()).select_from(Reconfiguration)) or 0))


def changes(bench: MemoryBench, name: str, since: int = 0) -> list[dict[str, Any]]:
    return list(bench.emulated.truth(name, since, light=False)["changes"])


async def test_a_change_is_timed_phase_by_phase_against_the_device(tmp_path: Path) -> None:
    async with memory_engine(tmp_path, switch(size="8x8", switch_ms=2)) as bench:
        engine = bench.engine
        _, heard = bench.hub.subscribe()
        acknowledged: list[tuple[str, int]] = []
        result = await engine.reconfigure("ocs1", connect=[(9, 1)], verify_light=False,
                                          on_acknowledged=lambda n, ns: acknowledged.append(
                                              (n, ns)))
        assert (result.outcome, result.connected, result.disconnected) == ("ok", [(1, 9)], [])
        (change,) = changes(bench, "ocs1")
        p = result.phases
        assert p["requested"] is not None and p["dispatched"] is not None
        assert p["activated"] is not None and p["acknowledged"] is not None
        assert p["done"] is not None and p["light"] is None
        # The command left after the request came and before the device had it; the device
        # settled before its reply arrived; one command, so it is the one that moved light.
        assert p["requested"] <= p["dispatched"] <= change["arrived_ns"]
        assert change["arrived_ns"] <= change["settled_ns"] <= p["acknowledged"] <= p["done"]
        assert p["activated"] == p["dispatched"]
        assert change["settled_ns"] - change["arrived_ns"] >= 2_000_000
        assert acknowledged == [("ocs1", p["acknowledged"])]
        assert engine.intended["ocs1"] == {1: 9} == bench.circuits("ocs1")
        (row,) = await recorded(bench)
        assert (row.dispatched_ns, row.acked_ns) == (p["dispatched"], p["acknowledged"])
        event = heard.queue.get_nowait()
        assert event is not None and event.kind == "reconfiguration"
        assert event.data["phases"] == p
        heard.close()

        # A break then a make: two commands, timed as one change from the first out to
        # the reply to the last.
        result = await engine.reconfigure("ocs1", connect=[(2, 10)], disconnect=[9],
                                          verify_light=False)
        assert (result.connected, result.disconnected) == ([(2, 10)], [(1, 9)])
        broke, made = changes(bench, "ocs1", change["seq"])
        assert broke["disconnected"] == [[1, 9]] and made["connected"] == [[2, 10]]
        p = result.phases
        assert p["dispatched"] is not None and p["acknowledged"] is not None
        assert p["dispatched"] <= broke["arrived_ns"] <= broke["settled_ns"]
        assert broke["settled_ns"] <= made["arrived_ns"]
        assert made["settled_ns"] <= p["acknowledged"]

        # A whole map: the circuits it keeps are not touched.
        result = await engine.reconfigure("ocs1", replace={2: 10, 3: 11}, verify_light=False)
        assert (result.connected, result.disconnected) == ([(3, 11)], [])
        assert engine.intended["ocs1"] == {2: 10, 3: 11} == bench.circuits("ocs1")
        assert await bench.store.intended() == {"ocs1": {2: 10, 3: 11}}


async def test_a_refused_request_touches_nothing(tmp_path: Path) -> None:
    async with memory_engine(tmp_path, switch(size="8x8")) as bench:
        engine = bench.engine
        await engine.reconfigure("ocs1", connect=[(1, 9)], verify_light=False)
        before = (await count(bench), len(changes(bench, "ocs1")))
        # The driver's checks, in the engine's terms, with the driver's words.
        refusals: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"connect": [(2, 99)]}, UnknownPort, "port 99 is not on this 8x8 switch"),
            ({"connect": [(2, 3)]}, RequestError, "must join an ingress port"),
            ({"connect": [(2, 10), (10, 3)]}, RequestError, "port 10 appears twice"),
            ({"connect": [(4, 4)]}, RequestError, "joins a port to itself"),
            ({"connect": [(1, 10)]}, PortBusy, "port 1 is already in circuit 1-9"),
            ({"disconnect": [0]}, UnknownPort, "port 0 is not on this 8x8 switch"),
            ({"replace": [(2, 10), (2, 11)]}, RequestError, "port 2 appears twice"),
        ]
        for request, kind, words in refusals:
            with pytest.raises(kind, match=words):
                await engine.reconfigure("ocs1", verify_light=False, **request)
        with pytest.raises(UnknownSwitch, match="no switch 'ocs9'; switches: ocs1"):
            await engine.reconfigure("ocs9", connect=[(1, 9)])
        assert engine.intended["ocs1"] == {1: 9} == bench.circuits("ocs1")
        assert engine.switches["ocs1"].expected == {1: 9}
        assert (await count(bench), len(changes(bench, "ocs1"))) == before
        # Every refusal let go of the ports it held.
        assert not engine.reservations.busy(("ocs1", p) for p in range(1, 17))


async def test_one_switch_failing_leaves_the_other_changed(tmp_path: Path) -> None:
    async with memory_engine(tmp_path, switch(size="8x8"), switch("ocs2", size="8x8")) as bench:
        engine = bench.engine
        bench.emulated.inject("ocs2", {"kind": "fail_port", "port": 3})
        ok, failed = await engine.reconfigure_many({"ocs1": {1: 9}, "ocs2": {2: 10, 3: 11}})
        assert (ok.switch, ok.outcome, ok.error) == ("ocs1", "ok", None)
        assert (failed.switch, failed.outcome) == ("ocs2", "failed")
        assert failed.error is not None and "port 3 has failed" in failed.error
        # Read back after the failure: the device refused the whole command.
        assert failed.error.endswith("(the switch is unchanged)")
        assert failed.phases["dispatched"] is not None and failed.phases["done"] is not None
        assert engine.intended == {"ocs1": {1: 9}, "ocs2": {}}
        assert (bench.circuits("ocs1"), bench.circuits("ocs2")) == ({1: 9}, {})
        rows = await recorded(bench)
        assert sorted((r.switch, r.outcome) for r in rows) == [("ocs1", "ok"),
                                                               ("ocs2", "failed")]
        assert await bench.store.intended() == {"ocs1": {1: 9}}


async def test_someone_elses_change_is_read_back_as_drift_and_restored(tmp_path: Path) -> None:
    async with memory_engine(tmp_path, switch(size="8x8")) as bench:
        engine, ocs1 = bench.engine, bench.engine.switches["ocs1"]
        await engine.reconfigure("ocs1", connect=[(1, 9), (2, 10)], verify_light=False)
        heard: list[InstrumentEvent] = []
        ocs1.add_listener(heard.append)
        # Another client of the same device (a second session, as someone at its console).
        async with PolatisScpi(bench.addresses["ocs1"], name="console") as console:
            await console.disconnect([2])
            await console.connect([(3, 11)])
        assert await ocs1.cross_connects() == {1: 9, 3: 11}
        (drift,) = [e for e in heard if e.kind == "drift"]
        assert drift.drift is not None
        assert (drift.drift.missing, drift.drift.unexpected) == ({2: 10}, {3: 11})
        assert engine.intended["ocs1"] == {1: 9, 2: 10}  # a read changes no intention

        result = await engine.restore("ocs1")
        assert (result.cause, result.outcome) == ("restore", "ok")
        assert (result.connected, result.disconnected) == ([(2, 10)], [(3, 11)])
        assert bench.circuits("ocs1") == {1: 9, 2: 10} == engine.intended["ocs1"]


async def test_a_change_the_store_refuses_is_undone_on_the_device(tmp_path: Path) -> None:
    async with memory_engine(tmp_path, switch(size="8x8")) as bench:
        engine = bench.engine
        await engine.reconfigure("ocs1", connect=[(1, 9)], verify_light=False)
        with refusing(bench.store, "read-only"):
            with pytest.raises(StoreUnavailable, match="put back") as refused:
                await engine.reconfigure("ocs1", connect=[(2, 10)], disconnect=[1],
                                         verify_light=False)
            assert str(refused.value).startswith("ocs1: the change is refused")
            assert engine.intended["ocs1"] == {1: 9} == bench.circuits("ocs1")
        assert await count(bench) == 1


async def test_light_verification_times_the_light_on_the_meter(tmp_path: Path) -> None:
    parts = (switch(size="8x8", switch_ms=2), meter(), metered("a", "b", 1, 9, 1))
    async with memory_engine(tmp_path, *parts, light_window_s=0.1) as bench:
        result = await bench.engine.reconfigure("ocs1", connect=[(1, 9)])
        assert result.outcome == "ok", result.error
        (change,) = changes(bench, "ocs1")
        p = result.phases
        assert p["light"] is not None and p["done"] is not None
        # The meter saw the light once the mirrors moved, and before the engine finished.
        assert change["arrived_ns"] <= p["light"] <= p["done"]
        (row,) = await recorded(bench)
        assert row.light_ns == p["light"]
