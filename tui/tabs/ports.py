"""The Ports tab: every port of every switch, and under it a mesh's routed paths."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from labd.client.api import DaemonClient
from labd.errors import DaemonError
from tui.render import draw_path, port_cell
from tui.tabs.pane import Pane

#: The port map is refreshed at most this often (seconds) under a stream of changes.
REFRESH_S = 0.2
#: The port map's columns: (key, label, width).
PORT_COLUMNS = (("switch", "switch", 8), ("port", "port", 5), ("partner", "partner", 7),
                ("state", "state", 8), ("power", "power dBm", 9), ("circuit", "circuit", 34))
PortCells = tuple[str, str, str, str, "float | None", str]
#: The port of a summary row's key (``mesh1:*``): a switch no meter reads, not opened.
SUMMARY = "*"


class PortsTab(Pane):
    """The port map. It reads a changed switch's ports from the daemon itself, paced so
    that a stream of changes does not repaint the screen for each one."""

    HELP = ("Every port of every switch: its partner, state (failed in red), optical power "
            "coloured by level (green: well lit, yellow: near the threshold, dim red: dark) "
            "and the end-to-end circuit through it; below, a mesh's routed paths (each "
            "element passed, ═ bar, ╳ cross). / filters (switch, switch:port, endpoint). "
            "c makes a circuit between two endpoints, p a raw pair on one switch; x breaks "
            "the circuit (or the raw pair) on the port under the cursor; m measures "
            "reconfiguration latency on its switch. Every change asks first. A switch no "
            "meter reads is one summary row until Enter opens it (Enter again closes it); "
            "6 shows the switch under the cursor as a matrix.")
    KEYS_AT = "#portmap"

    class Redrawn(Message):
        """The port map shows the daemon's answer to a change."""

    class Trouble(Message):
        """A switch could not be read (its last picture is kept): a line for the log."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, client: DaemonClient) -> None:
        super().__init__("1 Ports", "ports")
        self.client = client
        self.ports: dict[str, list[dict[str, Any]]] = {}
        self.circuit_at: dict[str, str] = {}
        """``switch:port`` → the end-to-end circuit through it, "h0.nic0 → h1.nic0"."""
        self.mesh_paths: dict[str, dict[str, Any]] = {}
        """mesh → its state from ``GET /v1/switches/{id}`` (paths and intended pairs)."""
        self.sizes: dict[str, str | None] = {}
        """switch → its size as the daemon gives it ("16x16", "64" for any-to-any)."""
        self.opened: set[str] = set()
        """Unmetered switches the user opened: shown port by port, not summarised."""
        self.shown: dict[str, PortCells] = {}
        """What the port map shows, row by row (only changed cells are redrawn)."""
        self.drawn_paths: list[tuple[str, int, Any, str | Text, Any]] = []
        self.port_filter = ""
        self.render_ms: list[float] = []
        """How long each port-map update took (scripts/bench_tui.py reads it)."""
        self.changed_switches: set[str] = set()
        self.refresh_due = False
        self.refreshed_at = 0.0

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: switch, port or endpoint (/ to focus)",
                    id="port-filter")
        yield DataTable(id="portmap", zebra_stripes=True, cursor_type="row")
        yield DataTable(id="paths", cursor_type="row")
        yield Static(id="holds")

    def on_mount(self) -> None:
        portmap = self.query_one("#portmap", DataTable)
        for key, label, width in PORT_COLUMNS:
            portmap.add_column(label, width=width, key=key)
        paths = self.query_one("#paths", DataTable)
        paths.add_columns("mesh", "ports", "circuit", "path (element ═ bar, ╳ cross)")
        paths.display = False
        self.query_one("#holds", Static).display = False

    # -- what the daemon says ---------------------------------------------------------------
    async def load(self, switches: list[str]) -> None:
        """A fresh picture of these switches: their ports, a mesh's paths, the circuits."""
        self.mesh_paths = {}
        for switch in switches:
            await self._load_ports(switch)
            state = await self.client.get(f"/v1/switches/{switch}")
            self.sizes[switch] = state.get("size")
            if state.get("paths") is not None:
                self.mesh_paths[switch] = state
        await self._load_circuits()
        await self.load_holds()
        self.draw()

    async def load_holds(self) -> None:
        """The ports clients hold (``GET /v1/holds``): a plan's, a script's; others'
        changes to them are refused, naming the holder."""
        try:
            holds = await self.client.get("/v1/holds")
        except DaemonError:
            return  # an older daemon, or gone: the last line stays until the next read
        self.show_holds(holds if isinstance(holds, list) else [])

    def show_holds(self, holds: list[dict[str, Any]]) -> None:
        """One line under the map while anything is held; none otherwise."""
        line = self.query_one("#holds", Static)
        line.display = bool(holds)
        if holds:
            said = [f"{h.get('switch')} {', '.join(map(str, h.get('ports') or []))} by "
                    f"{h.get('holder')}" for h in holds[:4]]
            more = f"; {len(holds) - 4} more" if len(holds) > 4 else ""
            line.update(Text(f"held: {'; '.join(said)}{more}", style="bold yellow"))

    async def _load_circuits(self) -> None:
        try:
            routes = await self.client.get("/v1/circuits")
        except DaemonError as exc:  # the daemon went away: keep the last names, say so
            self.post_message(self.Trouble(str(exc)))
            return
        self.circuit_at = {}
        for route in routes:
            name = f"{route['from']} → {route['to']}"
            for hop in route["hops"]:
                for port in (hop["ingress"], hop["egress"]):
                    self.circuit_at[f"{hop['switch']}:{port}"] = name

    async def _load_ports(self, switch: str) -> None:
        try:
            self.ports[switch] = await self.client.get(f"/v1/switches/{switch}/ports")
            if switch in self.mesh_paths:
                self.mesh_paths[switch] = await self.client.get(f"/v1/switches/{switch}")
        except DaemonError as exc:  # an offline switch: say so, keep its last picture
            self.post_message(self.Trouble(str(exc)))

    def switch_changed(self, switch: str) -> None:
        """Refresh the switch's ports: at once after a quiet spell, else at most every
        REFRESH_S, all the switches changed meanwhile together (a steady stream of changes
        would otherwise repaint the screen for each one)."""
        self.changed_switches.add(switch)
        if self.refresh_due:
            return
        self.refresh_due = True
        wait = self.refreshed_at + REFRESH_S - time.monotonic()
        if wait <= 0:
            self.run_worker(self._refresh(), group="ports")
        else:
            self.set_timer(wait, lambda: self.run_worker(self._refresh(), group="ports"))

    async def _refresh(self) -> None:
        switches, self.changed_switches = self.changed_switches, set()
        self.refresh_due = False
        self.refreshed_at = time.monotonic()
        for switch in sorted(switches):
            await self._load_ports(switch)
        await self._load_circuits()
        await self.load_holds()  # a plan's changes come with its hold
        self.draw()
        self.post_message(self.Redrawn())

    # -- what the cursor is on --------------------------------------------------------------
    def port_under_cursor(self) -> tuple[str, int] | None:
        """The switch and port of the port-map row under the cursor."""
        table = self.query_one("#portmap", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        switch, _, port = str(key).rpartition(":")
        if port == SUMMARY:  # a summarised switch: its first port
            ports = self.ports.get(switch) or [{"port": 1}]
            return switch, int(ports[0]["port"])
        return switch, int(port)

    def circuit_through(self, switch: str, port: int) -> str | None:
        """The end-to-end circuit through the port, "h0.nic0 → h1.nic0"."""
        return self.circuit_at.get(f"{switch}:{port}")

    def partner(self, switch: str, port: int) -> str:
        """The port's partner as the map shows it; "" for none."""
        cells = self.shown.get(f"{switch}:{port}")
        return cells[2] if cells is not None else ""

    # -- unmetered switches: summarised --------------------------------------------------
    def summarised(self, switch: str) -> bool:
        """A switch no meter reads (no port has a power reading) is one row until opened:
        its ports say little port by port, and a mesh of them would fill the first
        screen of a small terminal."""
        ports = self.ports.get(switch, [])
        return (bool(ports) and switch not in self.opened and not self.port_filter
                and all(p.get("power_dbm") is None for p in ports))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a summary row opens its switch; on a port of an opened one, closes it."""
        if event.data_table.id != "portmap":
            return
        switch, _, port = str(event.row_key.value).rpartition(":")
        if port == SUMMARY:
            self.opened.add(switch)
        elif switch in self.opened:
            self.opened.discard(switch)
        else:
            return
        self.draw()
        table = self.query_one("#portmap", DataTable)
        first = f"{switch}:{SUMMARY}" if switch not in self.opened else next(
            (k for k in self.shown if k.startswith(f"{switch}:")), None)
        if first in self.shown:
            table.move_cursor(row=table.get_row_index(first))

    # -- the filter -------------------------------------------------------------------------
    def focus_filter(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self) -> None:
        self.query_one("#portmap", DataTable).focus()  # Enter: back to the map

    def on_input_changed(self, event: Input.Changed) -> None:
        self.port_filter = event.value.strip()
        self.draw()

    # -- drawing ----------------------------------------------------------------------------
    def _port_rows(self) -> list[tuple[str, PortCells]]:
        wanted = self.port_filter.lower()
        rows: list[tuple[str, PortCells]] = []
        for switch in sorted(self.ports):
            if self.summarised(switch):
                ports = self.ports[switch]
                pairs = sum(1 for p in ports if p["partner"] is not None) // 2
                rows.append((f"{switch}:{SUMMARY}", (
                    switch, f"1-{len(ports)}", "", f"{len(ports)} ports", None,
                    f"no meter, {pairs} pair{'s' * (pairs != 1)} (Enter)")))
                continue
            for port in self.ports[switch]:
                where = f"{switch}:{port['port']}"
                circuit = self.circuit_at.get(where, "")
                cells: PortCells = (switch, str(port["port"]),
                                    "" if port["partner"] is None else str(port["partner"]),
                                    str(port["state"]), port.get("power_dbm"), circuit)
                if wanted and not any(wanted in str(c).lower() for c in (where, *cells)):
                    continue
                rows.append((where, cells))
        return rows

    def draw(self) -> None:
        """Redraw the port map: only the cells that changed, unless the rows themselves
        did (a new filter, a switch coming online)."""
        started = time.perf_counter()
        table = self.query_one("#portmap", DataTable)
        rows = self._port_rows()
        if [key for key, _ in rows] != list(self.shown):
            table.clear()
            for key, cells in rows:
                table.add_row(*(port_cell(c[0], v) for c, v in zip(PORT_COLUMNS, cells,
                                                                     strict=True)), key=key)
        else:
            for key, cells in rows:
                before = self.shown[key]
                for index, (column, value) in enumerate(zip(PORT_COLUMNS, cells, strict=True)):
                    if before[index] != value:
                        table.update_cell(key, column[0], port_cell(column[0], value))
        self.shown = dict(rows)
        self._draw_paths()
        self.render_ms.append((time.perf_counter() - started) * 1000)

    def _draw_paths(self) -> None:
        """A mesh's routed paths: the elements each circuit passes, column by column."""
        rows = []
        for mesh, state in sorted(self.mesh_paths.items()):
            intended = {a for a, _ in state.get("intended", [])}
            for path in state["paths"]:
                a = path["from"]
                circuit = self.circuit_at.get(f"{mesh}:{a}", "") if a in intended else Text(
                    "not intended (drift)", style="yellow")
                rows.append((mesh, a, path["to"], circuit, path["elements"]))
        table = self.query_one("#paths", DataTable)
        table.display = bool(self.mesh_paths)
        if rows == self.drawn_paths:
            return  # unchanged: a redraw would repaint the whole screen
        self.drawn_paths = rows
        table.clear()
        for mesh, a, b, circuit, elements in rows:
            table.add_row(mesh, f"{a}→{b if b is not None else '?'}", circuit,
                          draw_path(a, b, elements), key=f"{mesh}:{a}")
