"""The terminal UI driven by Textual's pilot against a daemon on an emulated lab (real
sockets, the real API and event stream)."""

import asyncio
from collections.abc import Callable
from pathlib import Path

from textual.widgets import DataTable, Input, Label, TabbedContent

from labd.drill import emulated_rig
from labd.labfile import load_lab
from tests.broker import unique_lab
from tui.app import LabApp

LAB = """
[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
emulate = true
size = "8x8"
[instrument.emulator]
switch_time_ms = 2
jitter_ms = 0
[[endpoint]]
id = "h0.nic0"
launch_dbm = 0
[[endpoint]]
id = "h1.nic0"
launch_dbm = 0
[[fiber]]
from = "h0.nic0"
to = "ocs1:1"
[[fiber]]
from = "ocs1:9"
to = "h1.nic0"
"""


async def until(app: LabApp, check: Callable[[], bool], timeout: float = 15) -> None:
    """Wait until ``check()`` holds, looking again after each event the app applies."""
    async with asyncio.timeout(timeout), app.applied:
        while not check():
            await app.applied.wait()


def cell(table: DataTable, row: str, column: int) -> str:  # type: ignore[type-arg]
    return str(table.get_row(row)[column])


async def test_port_map_follows_the_daemon_and_makes_circuits(tmp_path: Path) -> None:
    _, path = unique_lab(tmp_path, "tui", LAB)
    lab = load_lab(path)
    async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), mqtt=None, token="t") as rig:
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(120, 40)) as pilot:
            async with asyncio.timeout(15):
                await app.synced.wait()
            table = app.query_one("#portmap", DataTable)
            assert table.row_count == 16  # every port of the 8x8 switch
            assert cell(table, "ocs1:1", 2) == ""  # no partner yet
            assert "live" in app.sub_title

            # A circuit made from the keyboard appears on the port map.
            await pilot.press("c")
            await pilot.press(*"h0.nic0", "enter", *"h1.nic0", "enter")
            await until(app, lambda: cell(table, "ocs1:1", 2) == "9")
            assert cell(table, "ocs1:9", 2) == "1"
            # Both ports name the circuit end to end.
            await until(app, lambda: cell(table, "ocs1:9", 5) == "h0.nic0 → h1.nic0")
            assert cell(table, "ocs1:1", 5) == "h0.nic0 → h1.nic0"
            reconf = app.query_one("#reconf", DataTable)
            assert reconf.row_count == 1
            latency = app.query_one("#latency", DataTable)
            assert latency.get_row("ocs1")[1] == "1"  # one reconfiguration of ocs1 so far

            # Help for the tab in view, and back.
            await pilot.press("question_mark")
            assert "Every port of every switch" in str(
                app.screen.query_one("#help-tab", Label).render())
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

            # The filter narrows the map: by endpoint, then by port.
            await pilot.press("slash", *"h1.nic0")
            assert table.row_count == 2
            app.query_one("#port-filter", Input).value = ""
            await pilot.press(*"ocs1:9")
            assert app.query_one("#port-filter", Input).value == "ocs1:9"
            assert table.row_count == 1

            # A refused request is a notification, and changes nothing.
            await app._make_circuit("h0.nic0", "nowhere")
            assert table.row_count == 1 and cell(table, "ocs1:9", 2) == "1"


async def test_the_ui_marks_a_lost_daemon_stale_and_keeps_the_picture(tmp_path: Path) -> None:
    _, path = unique_lab(tmp_path, "tui2", LAB)
    lab = load_lab(path)
    async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), mqtt=None, token="t") as rig:
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(120, 40)):
            async with asyncio.timeout(15):
                await app.synced.wait()
            rows = app.query_one("#portmap", DataTable).row_count
            await rig.daemon.stop()  # the daemon goes away
            async with asyncio.timeout(15):
                await app.stale.wait()
            assert app.sub_title.startswith("STALE since")
            assert app.screen.has_class("stale")
            assert app.query_one("#portmap", DataTable).row_count == rows  # last picture kept


async def test_every_tab_is_a_key_away(tmp_path: Path) -> None:
    _, path = unique_lab(tmp_path, "tui3", LAB)
    lab = load_lab(path)
    async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), mqtt=None, token="t") as rig:
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(120, 40)) as pilot:
            async with asyncio.timeout(15):
                await app.synced.wait()
            tabs = app.query_one(TabbedContent)
            for key, tab in (("2", "hosts"), ("3", "failover"), ("4", "reconfigurations"),
                             ("5", "events"), ("1", "ports")):
                await pilot.press(key)
                assert tabs.active == tab


def test_sparkline_and_quantiles() -> None:
    from tui.app import quantile, sparkline

    assert sparkline([]) == ""
    assert sparkline([1.0, 1.0]) == "▁▁"
    assert sparkline([0.0, 5.0, 10.0]) == "▁▅█"
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0 and quantile([1.0, 9.0], 0.99) == 9.0
