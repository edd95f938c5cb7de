"""The Matrix tab on a 384x384 switch, driven by Textual's pilot against a daemon on an
emulated lab: the cursor goes to a port, a pair is made there and broken again; and the
matrix's pure parts (the grid from the daemon's answers, the size)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, Label, TabbedContent

from tests.tui.screen import screen_lines
from tests.tui.test_tui import attached, until
from tui.app import LabApp
from tui.matrix import MARKS, Grid, MatrixView, parse_size

BIG = """
[[instrument]]
id = "big"
driver = "polatis-scpi"
emulate = true
size = "384x384"
[instrument.emulator]
technology = "ideal"
switch_time_ms = 0
jitter_ms = 0
[[instrument]]
id = "small"
driver = "calient-tl1"
emulate = true
size = "16"
user = "admin"
password = "pxc***"
[instrument.emulator]
switch_time_ms = 0
jitter_ms = 0
"""


def question(app: LabApp) -> str:
    return str(app.screen.query_one("#question", Label).render())


async def test_a_pair_made_on_a_384x384_matrix(tmp_path: Path) -> None:
    async with attached(tmp_path, "matrix", BIG) as (rig, app, pilot):
        await pilot.press("6")
        assert app.query_one(TabbedContent).active == "matrix"
        view = app.query_one(MatrixView)
        assert view.has_focus
        assert app.matrix.switch == "big"  # the first switch by name
        assert len(view.grid.rows) == len(view.grid.cols) == 384
        assert (view.grid.rows[0], view.grid.cols[0], view.grid.cols[-1]) == (1, 385, 768)
        # Drawn line by line: a handful of widgets, not one per cell.
        assert len(app.query("*")) < 200

        # g goes to a port: ingress 300, egress 700, far outside the first screen.
        assert view.scroll_offset == (0, 0)
        await pilot.press("g", *"300", "enter", *"700", "enter")
        assert view.cursor_ports() == (300, 700)
        # Scrolled so that the cursor's cell is in view beside the labels.
        region = view.scrollable_content_region
        assert view.scroll_y <= 299 < view.scroll_y + region.height - 1
        cell_x = (699 - 384) * view.cell_width  # egress 700 is the 316th column
        assert view.scroll_x <= cell_x < view.scroll_x + region.width - view.label_width
        named = str(app.query_one("#matrix-cursor", Label).render())
        assert "big 300 → 700: not connected" in named
        # The arrows move by a port; PageDown by a screen; a port that is not there is
        # refused, and the cursor stays.
        await pilot.press("down", "right")
        assert view.cursor_ports() == (301, 701)
        await pilot.press("up", "left")
        assert view.cursor_ports() == (300, 700)
        await pilot.press("g", *"300", "enter", *"9999", "enter")
        assert view.cursor_ports() == (300, 700)

        # Enter asks to connect the pair under the cursor; yes makes it on the switch.
        await pilot.press("enter")
        assert "Connect big port 300 to port 700" in question(app)
        await pilot.press("y")
        await until(app, lambda: view.grid.connected(300, 700), timeout=30)
        assert rig.daemon.engine.intended["big"] == {300: 700}
        named = str(app.query_one("#matrix-cursor", Label).render())
        assert "big 300 → 700: connected" in named and "to 700" in named
        # The cell shows the pair: the mark on the cursor's line, under its column.
        lines = screen_lines(app.export_screenshot())
        row = next(line for line in lines if line.lstrip().startswith("300"))
        # The light reads by its glyph, not only its colour (the ideal switch's own
        # taps: lit).
        assert view.grid.light(300, 700) == "lit" and MARKS["lit"] in row

        # Zoomed out to blocks of 8 ports, the cursor stays on its ports.
        await pilot.press("minus", "minus", "minus", "minus")
        assert view.block == 8 and view.cursor_ports() == (300, 700)
        # x breaks the pair under the cursor, after asking.
        await pilot.press("x")
        assert "Disconnect big port 300 from port 700" in question(app)
        await pilot.press("y")
        await until(app, lambda: not view.grid.connected(300, 700), timeout=30)
        assert not rig.daemon.engine.intended["big"]

        # ] shows the next switch, an any-to-any one: every port down and across.
        await pilot.press("right_square_bracket")
        assert app.matrix.switch == "small"
        assert view.grid.rows == view.grid.cols == list(range(1, 17))


async def test_the_matrix_opens_on_the_port_maps_switch(tmp_path: Path) -> None:
    async with attached(tmp_path, "matrix2", BIG) as (_, app, pilot):
        portmap = app.ports.query_one("#portmap", DataTable)
        # The CALIENT is read by no meter: one summary row, which names its switch.
        portmap.move_cursor(row=portmap.get_row_index("small:*"))
        await pilot.press("6")
        assert app.matrix.switch == "small"
        await pilot.press("1")
        portmap.move_cursor(row=portmap.get_row_index("big:400"))
        await pilot.press("6")
        assert app.matrix.switch == "big"


def test_a_grid_from_the_daemons_ports() -> None:
    ports = [{"port": p, "partner": {1: 6, 6: 1}.get(p), "state": "failed" if p == 3 else
              "enabled", "power_dbm": {6: -2.0}.get(p)} for p in range(1, 9)]
    grid = Grid.of("m", ports, "4x4", {"m:1": "a → b", "x:1": "elsewhere"})
    assert (grid.rows, grid.cols) == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert grid.connected(1, 6) and not grid.connected(1, 5)
    assert grid.light(1, 6) == "lit" and grid.light(2, 5) == "unmetered"
    assert grid.describe(1) == "enabled, to 6, no meter, a → b"
    assert grid.describe(3).startswith("failed, free")
    # A size that does not match the ports: every port both ways.
    assert Grid.of("m", ports, "2x2").rows == list(range(1, 9))


def test_sizes() -> None:
    assert parse_size("384x384", 768) == (384, 384)
    assert parse_size("64", 64) == (64, 0)
    assert parse_size(None, 12) == (12, 0)
    assert parse_size("garbage", 5) == (5, 0)
