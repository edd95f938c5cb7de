"""A switch as a matrix: ingress ports down, egress ports across, a mark where a pair
connects them, its glyph and colour telling the light on it. Drawn with Textual's Line
API: only the lines and columns in view are drawn, so a 384x384 switch (147,456 cells)
costs what the screen holds, not a widget per cell.

``Grid`` is what is drawn (pure, from the daemon's answers); ``MatrixView`` draws it, keeps
the cursor on a cell (an ingress and an egress port) and zooms: a cell is 1 to 3 columns
wide, or stands for a block of 2, 4 or 8 ports a side when zoomed out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.render import POWER_THRESHOLD_DBM

#: Zoom levels, out to in: (ports a side per cell, columns per cell).
ZOOMS: tuple[tuple[int, int], ...] = ((8, 1), (4, 1), (2, 1), (1, 1), (1, 2), (1, 3))
#: The zoom a matrix opens at: a port per cell, two columns wide.
DEFAULT_ZOOM = 4
#: Lines above the cells: the egress ports' numbers.
HEADER = 1
#: Each cell's mark, by what is there: a glyph each, so that the light reads without
#: colour (a monochrome terminal, a colour-blind reader); the colour repeats it.
MARKS = {"lit": "●", "weak": "◐", "dark": "○", "unmetered": "◇", "failed": "✕",
         "free": "·"}


def parse_size(size: str | None, ports: int) -> tuple[int, int]:
    """A switch's ``size`` as the daemon gives it (``"16x16"``, ``"64"`` for any-to-any,
    None while it has not been identified): (ingress, egress), egress 0 for any-to-any."""
    if size:
        ingress, _, egress = size.partition("x")
        if ingress.isdigit() and (not egress or egress.isdigit()):
            return int(ingress), int(egress or 0)
    return ports, 0


@dataclass
class Grid:
    """One switch as the matrix draws it."""

    switch: str
    rows: list[int]
    """Ingress ports, top to bottom."""
    cols: list[int]
    """Egress ports, left to right (the same ports as ``rows`` on an any-to-any switch)."""
    partner: dict[int, int] = field(default_factory=dict)
    power: dict[int, float | None] = field(default_factory=dict)
    state: dict[int, str] = field(default_factory=dict)
    circuit_at: dict[int, str] = field(default_factory=dict)
    """Port → the end-to-end circuit through it."""

    @classmethod
    def of(cls, switch: str, ports: Sequence[dict[str, Any]], size: str | None,
           circuit_at: dict[str, str] | None = None) -> Grid:
        """From ``GET /v1/switches/{id}/ports`` and the switch's size."""
        numbers = [int(p["port"]) for p in ports]
        ingress, egress = parse_size(size, len(numbers))
        if egress and ingress + egress == len(numbers):
            rows, cols = numbers[:ingress], numbers[ingress:]
        else:  # any-to-any (or a size that does not match the ports): every port both ways
            rows, cols = numbers, numbers
        prefix = f"{switch}:"
        return cls(switch, rows, cols,
                   partner={int(p["port"]): int(p["partner"]) for p in ports
                            if p.get("partner") is not None},
                   power={int(p["port"]): p.get("power_dbm") for p in ports},
                   state={int(p["port"]): str(p.get("state")) for p in ports},
                   circuit_at={int(k[len(prefix):]): v for k, v in (circuit_at or {}).items()
                               if k.startswith(prefix)})

    def connected(self, ingress: int, egress: int) -> bool:
        return self.partner.get(ingress) == egress

    def light(self, ingress: int, egress: int) -> str:
        """The light on a pair, as the matrix colours it: lit, weak, dark or unmetered (no
        meter reads either end)."""
        dbm = self.power.get(egress)
        if dbm is None:
            dbm = self.power.get(ingress)
        if dbm is None:
            return "unmetered"
        return ("lit" if dbm >= POWER_THRESHOLD_DBM + 20 else
                "weak" if dbm >= POWER_THRESHOLD_DBM else "dark")

    def describe(self, port: int) -> str:
        """One port in words: state, partner, power, circuit."""
        partner = self.partner.get(port)
        dbm = self.power.get(port)
        words = [self.state.get(port, "unknown"),
                 f"to {partner}" if partner is not None else "free",
                 "no meter" if dbm is None else f"{dbm:.2f} dBm"]
        if port in self.circuit_at:
            words.append(self.circuit_at[port])
        return ", ".join(words)


class MatrixView(ScrollView, can_focus=True):
    """The matrix of one switch; the cursor is on an (ingress, egress) cell."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "matrix--free", "matrix--lit", "matrix--weak", "matrix--dark", "matrix--unmetered",
        "matrix--failed", "matrix--cursor", "matrix--cross", "matrix--label",
        "matrix--label-cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1, 0)", "Up", show=False),
        Binding("down", "move(1, 0)", "Down", show=False),
        Binding("left", "move(0, -1)", "Left", show=False),
        Binding("right", "move(0, 1)", "Right", show=False),
        Binding("pageup", "page(-1, 0)", "Page up", show=False),
        Binding("pagedown", "page(1, 0)", "Page down", show=False),
        Binding("ctrl+pageup,shift+left", "page(0, -1)", "Page left", show=False),
        Binding("ctrl+pagedown,shift+right", "page(0, 1)", "Page right", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(1)", "Last", show=False),
        Binding("plus,equals_sign", "zoom(1)", "Zoom in", show=False),
        Binding("minus", "zoom(-1)", "Zoom out", show=False),
        Binding("enter", "app.pair", "Connect", show=False),
    ]

    zoom: reactive[int] = reactive(DEFAULT_ZOOM)

    class CursorMoved(Message):
        """The cursor is on another cell (or the picture under it changed)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.grid = Grid("", [], [])
        self.row = 0
        """The cursor's ingress port, as an index into ``grid.rows``."""
        self.col = 0
        """The cursor's egress port, as an index into ``grid.cols``."""
        self._col_of: dict[int, int] = {}
        """Egress port → its index in ``grid.cols`` (each line looks its pairs up)."""

    # -- what is shown ----------------------------------------------------------------------
    def show(self, grid: Grid) -> None:
        """Draw ``grid``; the cursor stays on its ports where the switch is the same."""
        same = grid.switch == self.grid.switch
        at = self.cursor_ports() if same else None
        self.grid = grid
        self._col_of = {port: i for i, port in enumerate(grid.cols)}
        if at is not None and at[0] in grid.rows and at[1] in grid.cols:
            self.row, self.col = grid.rows.index(at[0]), grid.cols.index(at[1])
        else:
            self.row = self.col = 0
        self._resize()
        self.refresh()
        self.post_message(self.CursorMoved())

    def cursor_ports(self) -> tuple[int, int] | None:
        """The (ingress, egress) ports under the cursor; None on an empty matrix."""
        if not self.grid.rows or not self.grid.cols:
            return None
        return self.grid.rows[self.row], self.grid.cols[self.col]

    def move_to(self, ingress: int, egress: int) -> bool:
        """Put the cursor on these ports; False where the switch has no such pair."""
        if ingress not in self.grid.rows or egress not in self.grid.cols:
            return False
        self.row, self.col = self.grid.rows.index(ingress), self.grid.cols.index(egress)
        self._cursor_changed()
        return True

    # -- geometry ---------------------------------------------------------------------------
    @property
    def block(self) -> int:
        return ZOOMS[self.zoom][0]

    @property
    def cell_width(self) -> int:
        return ZOOMS[self.zoom][1]

    @property
    def label_width(self) -> int:
        return len(str(max(self.grid.rows, default=0))) + 1

    def _cells(self) -> tuple[int, int]:
        """How many cells down and across."""
        block = self.block
        return math.ceil(len(self.grid.rows) / block), math.ceil(len(self.grid.cols) / block)

    def _resize(self) -> None:
        down, across = self._cells()
        self.virtual_size = Size(self.label_width + across * self.cell_width, HEADER + down)

    def watch_zoom(self) -> None:
        self._resize()
        self._cursor_changed()

    # -- the keys ---------------------------------------------------------------------------
    def action_move(self, down: int, across: int) -> None:
        step = self.block  # zoomed out, a key moves a whole cell
        self.row = max(0, min(len(self.grid.rows) - 1, self.row + down * step))
        self.col = max(0, min(len(self.grid.cols) - 1, self.col + across * step))
        self._cursor_changed()

    def action_page(self, down: int, across: int) -> None:
        lines = max(1, self.scrollable_content_region.height - HEADER - 1)
        columns = max(1, (self.scrollable_content_region.width - self.label_width)
                      // self.cell_width - 1)
        self.action_move(down * lines, across * columns)

    def action_jump(self, end: int) -> None:
        """Home: the first cell; End: the last."""
        self.row = (len(self.grid.rows) - 1) * end if self.grid.rows else 0
        self.col = (len(self.grid.cols) - 1) * end if self.grid.cols else 0
        self._cursor_changed()

    def action_zoom(self, by: int) -> None:
        self.zoom = max(0, min(len(ZOOMS) - 1, self.zoom + by))

    def _cursor_changed(self) -> None:
        self._scroll_to_cursor()
        self.refresh()
        self.post_message(self.CursorMoved())

    def _scroll_to_cursor(self) -> None:
        """Scroll just enough that the cursor's cell is in view beside the labels."""
        region = self.scrollable_content_region
        if region.width <= 0 or region.height <= 0:
            return
        cell_y, cell_x = self.row // self.block, (self.col // self.block) * self.cell_width
        lines = max(1, region.height - HEADER)
        columns = max(1, region.width - self.label_width)
        y, x = int(self.scroll_y), int(self.scroll_x)
        if cell_y < y:
            y = cell_y
        elif cell_y >= y + lines:
            y = cell_y - lines + 1
        if cell_x < x:
            x = cell_x
        elif cell_x + self.cell_width > x + columns:
            # Whole cells only: the first one in view is never cut.
            x = math.ceil((cell_x + self.cell_width - columns) / self.cell_width) \
                * self.cell_width
        self.scroll_to(x, y, animate=False, force=True)

    def on_resize(self) -> None:
        self._scroll_to_cursor()

    # -- drawing (the Line API) -------------------------------------------------------------
    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"matrix--{name}", partial=True)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if not self.grid.rows or not self.grid.cols:
            return Strip.blank(width, self.rich_style)
        base = self.rich_style
        if y < HEADER:
            return Strip([Segment(self._header(width), base + self._style("label"))], width)
        index = int(self.scroll_y) + y - HEADER
        down, _ = self._cells()
        if index >= down:
            return Strip.blank(width, base)
        return self._cell_line(index, width, base)

    def _visible_cells(self, width: int) -> range:
        _, across = self._cells()
        first = int(self.scroll_x) // self.cell_width
        shown = max(0, width - self.label_width) // self.cell_width + 1
        return range(first, min(across, first + shown))

    def _header(self, width: int) -> str:
        """The egress ports' numbers, each over its cell, as many as fit without touching."""
        block, cw, label = self.block, self.cell_width, self.label_width
        digits = len(str(max(self.grid.cols))) + 1
        every = max(1, math.ceil(digits / cw))  # cells between two numbers
        line = [" "] * width
        offset = int(self.scroll_x) % cw
        for n, cell in enumerate(self._visible_cells(width)):
            if cell % every:
                continue
            text = str(self.grid.cols[cell * block])
            x = label + n * cw - offset
            if x < label or x + len(text) > width:
                continue  # a number is shown whole or not at all
            line[x:x + len(text)] = text
        return "".join(line)

    def _cell_line(self, index: int, width: int, base: Style) -> Strip:
        grid, block, cw = self.grid, self.block, self.cell_width
        rows = grid.rows[index * block:(index + 1) * block]
        cursor_line = self.row // block == index
        cursor_cell = self.col // block
        col_of = self._col_of
        # The cells of this line that a pair reaches, with the light on the best of them.
        marks: dict[int, str] = {}
        rank = {"lit": 4, "weak": 3, "unmetered": 2, "dark": 1}
        for port in rows:
            egress = grid.partner.get(port)
            where = None if egress is None else col_of.get(egress)
            if egress is None or where is None:
                continue
            light = "failed" if "failed" in (grid.state.get(port), grid.state.get(egress)) \
                else grid.light(port, egress)
            cell = where // block
            if marks.get(cell) is None or rank.get(light, 5) > rank.get(marks[cell], 5):
                marks[cell] = light
        failed_row = any(grid.state.get(p) == "failed" for p in rows)
        label_style = base + self._style("label-cursor" if cursor_line else "label")
        segments = [Segment(str(rows[0]).rjust(self.label_width - 1) + " ", label_style)]
        offset = int(self.scroll_x) % cw
        for cell in self._visible_cells(width):
            mark = marks.get(cell)
            if mark is not None:
                text, style = MARKS[mark], self._style(mark)
            else:
                cols = grid.cols[cell * block:(cell + 1) * block]
                failed = failed_row or any(grid.state.get(p) == "failed" for p in cols)
                text, style = (MARKS["failed"], self._style("failed")) if failed else \
                    (MARKS["free"], self._style("free"))
            text = text.center(cw) if cw > 1 else text
            style = base + style
            if cursor_line and cell == cursor_cell:
                style += self._style("cursor")
            elif cursor_line or cell == cursor_cell:
                style += self._style("cross")
            segments.append(Segment(text, style))
        strip = Strip(segments)
        if offset:  # the first cell partly scrolled out of view
            strip = Strip.join([strip.crop(0, self.label_width),
                                strip.crop(self.label_width + offset)])
        return strip.crop(0, width).extend_cell_length(width, base)
