"""The Matrix tab: one switch at a time as a matrix of ingress ✕ egress ports (tui/matrix.py),
the cursor's ports named under it."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Label

from tui.matrix import MARKS, ZOOMS, Grid, MatrixView
from tui.screens.form import FormScreen
from tui.tabs.pane import Pane

#: The legend: each mark, the style it is drawn in, and what it means.
LEGEND = tuple((MARKS[style], style, words) for style, words in (
    ("lit", "lit"), ("weak", "weak"), ("dark", "dark"), ("unmetered", "no meter"),
    ("free", "free"), ("failed", "failed")))


class MatrixTab(Pane):
    """A switch's cross-connects as a matrix; the port map's data, drawn another way."""

    HELP = ("One switch as a matrix: ingress ports down, egress ports across; a mark where "
            "a pair connects them, telling the light on it by glyph and colour: ● lit "
            "(green), ◐ weak (yellow), ○ dark (red), ◇ no meter reads it; · free, ✕ a "
            "failed port. Arrows move the cursor, "
            "PgUp/PgDn a screen (shift+arrows across), Home/End the corners, g goes to a "
            "port; + and - zoom (out to a block of 8 ports a cell); [ and ] show the "
            "previous or next switch. Enter or p connects the pair under the cursor, x "
            "breaks it (each after asking).")
    KEYS_AT = "#matrix"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left_square_bracket", "switch(-1)", "Prev switch", show=False),
        Binding("right_square_bracket", "switch(1)", "Next switch", show=False),
        Binding("g", "go", "Go to port", show=False),
    ]

    def __init__(self) -> None:
        super().__init__("6 Matrix", "matrix")
        self.switch: str | None = None
        """The switch shown; None until the daemon has named one."""
        self.ports: dict[str, list[dict[str, Any]]] = {}
        self.sizes: dict[str, str | None] = {}
        self.circuit_at: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Label("no switch yet", id="matrix-title")
        yield MatrixView(id="matrix")
        yield Label("", id="matrix-cursor")

    @property
    def view(self) -> MatrixView:
        return self.query_one(MatrixView)

    # -- what the daemon says ---------------------------------------------------------------
    def show(self, ports: dict[str, list[dict[str, Any]]], sizes: dict[str, str | None],
             circuit_at: dict[str, str]) -> None:
        """The switches' ports as the port map last read them (the same dicts, not
        copies: the matrix is drawn from them when shown)."""
        self.ports, self.sizes, self.circuit_at = ports, sizes, circuit_at
        if self.switch not in ports:
            self.switch = min(ports, default=None)
        self.changed()

    def select(self, switch: str) -> None:
        """Show ``switch`` (the Ports tab's cursor names it when the matrix is opened)."""
        if switch in self.ports and switch != self.switch:
            self.switch = switch
            self.changed()

    def draw(self) -> None:
        if self.switch is None:
            return
        self.view.show(Grid.of(self.switch, self.ports.get(self.switch, []),
                               self.sizes.get(self.switch), self.circuit_at))
        self._retitle()

    def _retitle(self) -> None:
        switches = sorted(self.ports)
        if self.switch not in switches:
            self.query_one("#matrix-title", Label).update("no switch yet")
            return
        block, width = ZOOMS[self.view.zoom]
        zoom = f"{block} ports a side per cell" if block > 1 else \
            f"a port per cell, {width} column{'s' if width > 1 else ''} wide"
        title = Text.assemble(
            (f"{self.switch}", "bold"),
            f" {self.sizes.get(str(self.switch)) or '?'} ({switches.index(str(self.switch)) + 1}"
            f" of {len(switches)}) · rows ingress, columns egress · {zoom} · ")
        for mark, style, words in LEGEND:
            title.append(mark, self.view.get_component_rich_style(f"matrix--{style}",
                                                                 partial=True))
            title.append(f" {words}  ")
        self.query_one("#matrix-title", Label).update(title)

    # -- the cursor -------------------------------------------------------------------------
    def cursor(self) -> tuple[str, int, int] | None:
        """The switch, ingress and egress port under the cursor."""
        if not self.is_attached or self.switch is None:
            return None
        at = self.view.cursor_ports()
        return None if at is None else (self.switch, *at)

    def on_matrix_view_cursor_moved(self) -> None:
        self._retitle()  # the zoom may have changed
        at = self.cursor()
        label = self.query_one("#matrix-cursor", Label)
        if at is None:
            label.update("")
            return
        switch, ingress, egress = at
        grid = self.view.grid
        pair = "connected" if grid.connected(ingress, egress) else "not connected"
        label.update(Text.assemble(
            (f"{switch} {ingress} → {egress}", "bold"), f": {pair}  │  ",
            (f"in {ingress}", "bold"), f": {grid.describe(ingress)}  │  ",
            (f"out {egress}", "bold"), f": {grid.describe(egress)}"))

    # -- the keys ---------------------------------------------------------------------------
    def action_switch(self, by: int) -> None:
        switches = sorted(self.ports)
        if switches and self.switch in switches:
            self.switch = switches[(switches.index(self.switch) + by) % len(switches)]
            self.draw()

    def action_go(self) -> None:
        """Put the cursor on a port (and, optionally, the egress port across)."""
        at = self.cursor()
        if at is None:
            return

        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            try:
                ingress, egress = int(answer["ingress"]), int(answer["egress"])
            except ValueError:
                self.notify("ports are numbers", severity="warning")
                return
            if not self.view.move_to(ingress, egress):
                self.notify(f"{at[0]} has no pair {ingress} → {egress} (ingress "
                            f"{self.view.grid.rows[0]}-{self.view.grid.rows[-1]}, egress "
                            f"{self.view.grid.cols[0]}-{self.view.grid.cols[-1]})",
                            severity="warning")

        self.app.push_screen(FormScreen(f"Go to a port of {at[0]}", [
            ("ingress", f"Ingress port (now {at[1]})", ""),
            ("egress", f"Egress port (now {at[2]})", "")]), typed)
