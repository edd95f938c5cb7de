"""Snapshot tests of the TUI's main screens (pytest-textual-snapshot: the SVGs under
``tests/tui/__snapshots__`` are the reference; ``pytest --snapshot-update`` rewrites them after a
deliberate change of looks, and a failing run writes an HTML report of the differences).

The daemon runs on an emulated lab in a thread of its own (tests/rigs.py; the snapshot
harness runs the app on its own event loop); only what is deterministic is on screen:
ports, partners, powers, circuits, mesh paths, hosts, the dialogs, and histories with set
times, not measured latencies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from labd.emulation.drill import hosts_ready, wait_for
from labd.emulation.rig import Rig
from labd.store.models import FailoverTimeline
from labd.store.store import ReconfigurationRecord
from tests.labs import ring_lab
from tests.rigs import background_rig
from tests.tui.test_tui import LAB
from tui.app import LabApp

SIZE = (110, 34)


def settled(*keys: str) -> Callable[[Pilot[None]], Coroutine[Any, Any, None]]:
    """Before the picture: the app has synced, the URL (a random port) is named plainly,
    then ``keys`` are pressed."""
    async def run_before(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, LabApp)
        async with asyncio.timeout(30):
            await app.synced.wait()
        app.sub_title = "http://127.0.0.1:8470 — live"
        if keys:
            await pilot.press(*keys)
        await pilot.pause()
    return run_before


async def _circuits(rig: Rig) -> None:
    engine = rig.daemon.engine
    await engine.connect_endpoints([("h0.nic0", "h1.nic0")])
    await engine.reconfigure("mesh1", connect=[(1, 6), (2, 5)])


def test_port_map_with_a_circuit_and_mesh_paths(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap1", LAB) as bg:
        bg.run(_circuits)
        app = LabApp(bg.rig.daemon.url, "t")
        assert snap_compare(app, terminal_size=SIZE, run_before=settled())


def test_help_and_the_circuit_dialog(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap2", LAB) as bg:
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("question_mark"))
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("c", *"h0.nic0", "enter", *"h1.nic0", "enter"))


def test_hosts_with_a_job_and_spares(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap3", ring_lab()) as bg:
        bg.run(lambda rig: wait_for(rig.daemon.hub, lambda: hosts_ready(rig.daemon), 30,
                                    "every host online"))
        app = LabApp(bg.rig.daemon.url, "t")
        assert snap_compare(app, terminal_size=SIZE, run_before=settled("2"))


async def _history(rig: Rig) -> None:
    """A made-up history with set times in the store, as the API serves it after a
    restart: twelve reconfigurations of ocs1 and one recovery."""
    store, t0, wall = rig.daemon.store, 10**12, datetime(2026, 11, 30, 12, tzinfo=UTC)
    ms = 1_000_000
    for i in range(12):
        start = t0 + i * 100 * ms
        acked = start + ms // 5 + 25 * ms + (i % 4) * ms // 4
        missing = i == 7
        await store.record(ReconfigurationRecord(
            switch="ocs1", cause="measurement", outcome="light-missing" if missing else "ok",
            error="light not present on channel 1" if missing else None,
            connected=[(1 + i % 4, 9 + i % 4)], disconnected=[], requested_ns=start,
            dispatched_ns=start + ms // 5, activated_ns=start + ms // 5, acked_ns=acked,
            light_ns=None if missing or i % 3 else acked - 2 * ms, done_ns=acked + ms // 2,
            wall_time=wall))
    steps = (0.0, 0.7, 3.8, 4.3, 32.5, 26.8, 30.6, 149.9, 217.2, 238.2)
    stages = ("failure", "reported", "detected", "spare_chosen", "switches_acked",
              "light_verified", "links_up", "job_restarted", "collectives_ready", "first_step")
    await store.write(FailoverTimeline(
        job="ring4", outcome="recovered", trigger="gpu-failed", wall_time=wall,
        stages={k: t0 + int(v * ms) for k, v in zip(stages, steps, strict=True)},
        detail={"member": "h1.nic0", "plan": {"spare": "s0.nic0"}}))


def test_failover_and_reconfiguration_tabs(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap4", LAB) as bg:
        bg.run(_history)
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("3"))
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("4"))
