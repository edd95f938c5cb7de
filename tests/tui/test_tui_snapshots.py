"""Snapshot tests of the TUI's main screens (pytest-textual-snapshot: the SVGs under
``tests/tui/__snapshots__`` are the reference; ``pytest --snapshot-update`` rewrites them after a
deliberate change of looks, and a failing run writes an HTML report of the differences).

The daemon runs on an emulated lab in a thread of its own (tests/rigs.py; the snapshot
harness runs the app on its own event loop); only what is deterministic is on screen:
ports, partners, powers, circuits, mesh paths, hosts, the dialogs, and histories with set
times (shown in UTC here), not measured latencies. The dialogs and the help are taken at
80x24 and 200x50, and each is checked to show its text whole (tests/tui/screen.py): a
picture with cut text must not become the reference.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from labd.emulation.drill import hosts_ready, wait_for
from labd.emulation.rig import Rig
from labd.store.models import FailoverTimeline
from labd.store.writer import ReconfigurationRecord
from tests.labs import ring_lab
from tests.rigs import background_rig
from tests.tui.screen import dialog_lines, screen_lines, shows_whole
from tests.tui.test_tui import LAB, until
from tui.app import LabApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import KEYS
from tui.tabs.matrix import MatrixTab
from tui.tabs.ports import PortsTab

SIZE = (110, 34)
#: The smallest terminal the UI is made for, and a large one.
SMALL, LARGE = (80, 24), (200, 50)
#: The footer at 80 columns: every key it holds, whole.
FOOTER = "q Quit c Circuit x Break m Measure d Drill / Filter r Resync ? Help"
#: The lab's name in the title (a fixed one: the tests' labs are otherwise named apart).
NAME = "rack-a"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wall-clock times drawn in UTC, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def settled(*keys: str, whole: Sequence[str] = (), dialog: Sequence[str] = (),
            asks: bool = False) -> Callable[[Pilot[None]], Coroutine[Any, Any, None]]:
    """Before the picture: the app has synced, the URL (a random port) is named plainly,
    then ``keys`` are pressed (with ``asks``, until the UI asks: a circuit's plan comes
    from the daemon first); each text of ``whole`` must then be on screen uncut, and
    each of ``dialog`` uncut inside the dialog's border."""
    async def run_before(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, LabApp)
        async with asyncio.timeout(30):
            await app.synced.wait()
        app.sub_title = "http://127.0.0.1:8470 — live"
        if keys:
            await pilot.press(*keys)
        if asks:
            await until(app, lambda: isinstance(app.screen, ConfirmScreen), timeout=30)
        lines = screen_lines(await steady(pilot))
        inside = dialog_lines(lines)
        for text in whole:
            assert shows_whole(lines, text), f"not shown whole: {text!r} in\n" + \
                "\n".join(lines)
        for text in dialog:
            assert shows_whole(inside, text), f"not shown whole: {text!r} in\n" + \
                "\n".join(inside)
    return run_before


async def steady(pilot: Pilot[None]) -> str:
    """The screen once it has stopped changing (a table sizes its columns when idle after
    its rows came), with the fields' cursors still (they blink): the picture the snapshot
    takes next."""
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    last = ""
    async with asyncio.timeout(30):
        while True:
            await pilot.pause()
            narrow = [table for table in pilot.app.screen.query(DataTable)
                      if not sized(table)]
            for table in narrow:  # sized when idle: prompt it
                table.check_idle()
            shot = re.sub(r"terminal-\d+", "terminal", pilot.app.export_screenshot())
            if shot == last and not narrow:
                return shot
            last = shot


def sized(table: DataTable[Any]) -> bool:
    """Every column of ``table`` is as wide as its widest cell (a table measures its new
    rows when next idle: until then its columns are as wide as their headers)."""
    for at, column in enumerate(table.ordered_columns):
        if not column.auto_width:
            continue
        cells = [table.get_row_at(row)[at] for row in range(table.row_count)]
        if column.content_width < max(map(cell_width, cells), default=0):
            return False
    return True


def cell_width(cell: object) -> int:
    if isinstance(cell, Text):
        return cell.cell_len
    try:
        return Text.from_markup(str(cell)).cell_len
    except Exception:  # not markup after all: the table shows it as it is
        return Text(str(cell)).cell_len


async def _circuits(rig: Rig) -> None:
    engine = rig.daemon.engine
    await engine.connect_endpoints([("h0.nic0", "h1.nic0")])
    await engine.reconfigure("mesh1", connect=[(1, 6), (2, 5)])


def test_port_map_with_a_circuit_and_mesh_paths(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap1", LAB, name=NAME) as bg:
        bg.run(_circuits)
        app = LabApp(bg.rig.daemon.url, "t")
        assert snap_compare(app, terminal_size=SIZE, run_before=settled())


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x50"])
def test_help_and_the_circuit_dialog(snap_compare: Any, tmp_path: Path,
                                     size: tuple[int, int]) -> None:
    with background_rig(tmp_path, "snap2", LAB, name=NAME) as bg:
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=size,
                            run_before=settled("question_mark",
                                               dialog=[PortsTab.HELP, KEYS]))
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=size,
                            run_before=settled(
                                "c", *"h0.nic0", "enter", *"h1.nic0", "enter", asks=True,
                                dialog=["Make the circuit h0.nic0 → h1.nic0 (on every switch "
                                        "it crosses)?", "Cross-connects: ocs1 port 1 → port 9",
                                        "Displaces no circuit: every port on the way is free.",
                                        "y / Enter: yes n / Esc: no"]))


def test_the_matrix_and_its_help(snap_compare: Any, tmp_path: Path) -> None:
    """A switch as a matrix at 80x24, a circuit on it; and the matrix's help."""
    with background_rig(tmp_path, "snap5", LAB, name=NAME) as bg:
        bg.run(_circuits)
        # The port map's cursor is on the mesh (the first row): ] shows the next switch.
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SMALL,
                            run_before=settled("6", "right_square_bracket", whole=[
                                "ocs1 8x8 (2 of 2)", "ocs1 1 → 9: connected",
                                "● lit ◐ weak ○ dark ◇ no meter", FOOTER]))
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SMALL,
                            run_before=settled("6", "question_mark", whole=[FOOTER],
                                               dialog=[MatrixTab.HELP, KEYS]))


def test_the_first_screen_at_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """A mesh no meter reads is one row: the metered switch's ports are on the first
    screen of a small terminal."""
    with background_rig(tmp_path, "snap6", LAB, name=NAME) as bg:
        bg.run(_circuits)
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SMALL,
                            run_before=settled(whole=[
                                "1 Ports 2 Hosts 3 Failover 4 Reconfigurations 5 Events "
                                "6 Matrix",
                                "mesh1 1-8 8 ports - no meter, 2 pairs (Enter)",
                                "ocs1 1 9 enabled", "h0.nic0 → h1.nic0", FOOTER]))


def test_hosts_with_a_job_and_spares(snap_compare: Any, tmp_path: Path) -> None:
    with background_rig(tmp_path, "snap3", ring_lab(), name=NAME) as bg:
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
    with background_rig(tmp_path, "snap4", LAB, name=NAME) as bg:
        bg.run(_history)
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("3"))
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SIZE,
                            run_before=settled("4"))

#: Every tab and dialog at 80x24: (lab, what is done first, keys, the UI asks, texts shown
#: whole). Each picture also shows the footer whole.
AT_80X24: dict[str, tuple[str, Callable[[Rig], Coroutine[Any, Any, None]] | None,
                          tuple[str, ...], bool, tuple[str, ...]]] = {
    "hosts": ("ring", None, ("2",), False, ()),
    "failover": ("lab", _history, ("3",), False, ("light_verified",)),
    "reconfigurations": ("lab", _history, ("4",), False, ()),
    "events": ("lab", _history, ("5",), False, ("reconfiguration #12",)),
    "circuit-form": ("lab", None, ("c",), False, ("From endpoint (e.g. h0.nic0)",
                                                   "To endpoint (e.g. h1.nic0)")),
    "pair-form": ("lab", None, ("p",), False, ("Switch", "Other port")),
    "measure-form": ("lab", None, ("m",), False, (
        "Pattern: toggle, random, permutation or sweep",
        "Rounds: reconfigurations per batch size", "k: pairs per batch (random)")),
    "break-confirm": ("lab", _circuits, ("down", "x"), True, (
        "Break the circuit h0.nic0 → h1.nic0 (on every switch it crosses)?",)),
    "matrix-go-form": ("lab", _circuits, ("6", "right_square_bracket", "g"), False, (
        "Ingress port (now 1)",)),
    "matrix-pair-confirm": ("lab", None, ("6", "right_square_bracket", "enter"), True, (
        "Connect ocs1 port 1 to port 9 (a raw pair, no endpoints)?",)),
    "drill-confirm": ("ring", None, ("d",), True, ("Run a failover drill",)),
}


@pytest.mark.parametrize("view", list(AT_80X24))
def test_every_tab_and_dialog_at_80x24(snap_compare: Any, tmp_path: Path, view: str) -> None:
    lab, before, keys, asks, whole = AT_80X24[view]
    with background_rig(tmp_path, f"snap-{view}", ring_lab() if lab == "ring" else LAB,
                        name=NAME) as bg:
        if lab == "ring":
            bg.run(lambda rig: wait_for(rig.daemon.hub, lambda: hosts_ready(rig.daemon), 30,
                                        "every host online"))
        if before is not None:
            bg.run(before)
        assert snap_compare(LabApp(bg.rig.daemon.url, "t"), terminal_size=SMALL,
                            run_before=settled(*keys, asks=asks, whole=[*whole, FOOTER]))


def test_a_daemon_that_cannot_be_reached_at_80x24(snap_compare: Any) -> None:
    """Port 9 (discard): nothing listens there on a test machine."""
    url = "http://127.0.0.1:9"

    async def run_before(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, LabApp)
        async with asyncio.timeout(30):
            await app.stale.wait()
        lines = screen_lines(await steady(pilot))
        for text in (app.banner.text, FOOTER, "labd — daemon not reachable"):
            assert shows_whole(lines, text), "\n".join(lines)

    assert snap_compare(LabApp(url, "t"), terminal_size=SMALL, run_before=run_before)
