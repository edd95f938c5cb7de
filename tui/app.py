"""``labd tui``: the lab engineer's window into a running daemon.

Tabs: the port map of every switch (partner, state, power coloured by level, circuits
named by their endpoints), the GPU hosts, the latest failover's timeline, recent
reconfigurations with their phases, and the event log. It follows the daemon's event
stream; when the daemon goes away it says so, keeps the last picture marked stale, and
resyncs from a fresh snapshot when the daemon is back. It never blocks on the network:
all requests run in workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Input,
    Label,
    ProgressBar,
    RichLog,
    TabbedContent,
    TabPane,
)
from textual.worker import WorkerCancelled, WorkerFailed

from labd.client.api import DaemonClient
from labd.errors import CampaignError, DaemonError
from labd.measure.campaign import (
    ReconfigPlan,
    batch_sizes,
    free_ports,
    planned,
    run_reconfig,
    span_ms,
    summary,
)
from labd.vocabulary import SPANS, STAGES, percentile

BARS = "▁▂▃▄▅▆▇█"
#: The port map is refreshed at most this often (seconds) under a stream of changes.
REFRESH_S = 0.2


def sparkline(values: list[float]) -> str:
    """The values as bars, scaled between their minimum and maximum."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in values)


def power_text(dbm: float | None, threshold: float = -30.0) -> Text:
    """Optical power, coloured by level: light, weak light, dark."""
    if dbm is None:
        return Text("-", style="dim")
    style = "green" if dbm >= threshold + 20 else "yellow" if dbm >= threshold else "dim red"
    return Text(f"{dbm:7.2f}", style=style)


class FormScreen(ModalScreen[dict[str, str] | None]):
    """A few fields typed in turn: Enter moves to the next and, in the last, submits;
    Escape cancels. Answers each field's value by its id."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[tuple[str, str, str]]) -> None:
        """``fields``: (id, placeholder, initial value)."""
        super().__init__()
        self.title_text = title
        self.fields = fields

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"{self.title_text} (Enter: next field, then go; Esc cancels)")
            for field_id, placeholder, value in self.fields:
                yield Input(value=value, placeholder=placeholder, id=field_id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        ids = [f[0] for f in self.fields]
        at = ids.index(str(event.input.id))
        if at + 1 < len(ids):
            self.query_one(f"#{ids[at + 1]}", Input).focus()
            return
        values = {i: self.query_one(f"#{i}", Input).value.strip() for i in ids}
        if all(values.values()):
            self.dismiss(values)
        else:
            self.notify("every field is needed", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question before a change: y or Enter says yes, n or Escape no."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            yield Label("y / Enter: yes    n / Esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


HELP = {
    "ports": "Every port of every switch: its partner, state (failed in red), optical power "
             "coloured by level (green: well lit, yellow: near the threshold, dim red: dark) "
             "and the end-to-end circuit through it; below, a mesh's routed paths (each "
             "element passed, ═ bar, ╳ cross). / filters (switch, switch:port, endpoint). "
             "c makes a circuit between two endpoints, p a raw pair on one switch; x breaks "
             "the circuit (or the raw pair) on the port under the cursor; m measures "
             "reconfiguration latency on its switch. Every change asks first.",
    "hosts": "Each GPU host: status (lost hosts in red), its GPUs' health (● green healthy, "
             "yellow degraded, red failed), NIC links, and the jobs (rank) it serves or is a "
             "spare for. d runs a failover drill (emulated hosts).",
    "failover": "The latest recovery, stage by stage as it happens, in ms after the failure: "
                "failure → reported → detected → spare chosen → switches acknowledged → "
                "light verified → links up → job restarted → collectives ready → first step. "
                "d runs a failover drill: a member's GPU fails, the daemon swaps a spare in, "
                "then the member is repaired and returned to the spares.",
    "reconfigurations": "Per switch and phase: device (dispatched → acknowledged), "
                        "switching (the command that moves the light → acknowledged; "
                        "device but for a CALIENT's ENT-CRS), light (dispatched → light "
                        "verified), software (requested → dispatched) "
                        "and total: n, p50, p99, max and the last 60 as a sparkline. Below, "
                        "recent reconfigurations: cause, outcome, pairs and phases. m starts "
                        "a latency measurement (toggle, random, permutation or sweep) on a "
                        "switch's free ports.",
    "events": "Everything the daemon reports, newest last; / filters by kind or content.",
}
KEYS = ("1-5 tabs · / filter · c circuit · p raw pair · x break · m measure · d drill · "
        "r resync · ? this help · ctrl+p command palette · q quit. When the daemon is "
        "unreachable the title says STALE and the last picture is kept.")


class HelpScreen(ModalScreen[None]):
    """Help for the tab in view; any of Escape, ? or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"), Binding("question_mark", "close", "Close"),
        Binding("q", "close", "Close")]

    def __init__(self, tab: str) -> None:
        super().__init__()
        self.tab = tab

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(HELP.get(self.tab, ""), id="help-tab")
            yield Label(KEYS, id="help-keys")

    def action_close(self) -> None:
        self.dismiss(None)


#: The port map's columns: (key, label, width).
PORT_COLUMNS = (("switch", "switch", 8), ("port", "port", 5), ("partner", "partner", 7),
                ("state", "state", 9), ("power", "power dBm", 9), ("circuit", "circuit", 34))
PortCells = tuple[str, str, str, str, "float | None", str]


def port_cell(column: str, value: Any) -> str | Text:
    """One port-map cell as shown: plain strings where there is nothing to colour (768
    rows add up), colour where it says something."""
    if column == "power":
        return power_text(value)
    if column in ("partner", "circuit"):
        return Text(value, style="bold cyan") if value else ""
    if column == "state" and value not in ("enabled", "unknown"):
        return Text(value, style="red" if value == "failed" else "dim")
    return str(value)


def draw_path(ingress: int, egress: int | None, elements: list[list[Any]]) -> Text:
    """A mesh path as the light takes it: ``1 ─[0 ═]─[5 ╳]─[9 ═]─ 6``."""
    text = Text(f"{ingress} ")
    for element, state in elements:
        text.append("─[", style="dim")
        text.append(f"{element} {'═' if state == 'bar' else '╳'}",
                    style="cyan" if state == "bar" else "magenta")
        text.append("]", style="dim")
    text.append(f"─ {egress if egress is not None else '?'}")
    return text


class LabApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "labd"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("c", "circuit", "Circuit"),
        Binding("p", "pair", "Raw pair"),
        Binding("x", "break", "Break"),
        Binding("m", "measure", "Measure"),
        Binding("d", "drill", "Drill"),
        Binding("slash", "filter", "Filter"),
        Binding("r", "resync", "Resync"),
        Binding("question_mark", "help", "Help"),
        Binding("1", "goto('ports')", "Ports", show=False),
        Binding("2", "goto('hosts')", "Hosts", show=False),
        Binding("3", "goto('failover')", "Failover", show=False),
        Binding("4", "goto('reconfigurations')", "Reconfigurations", show=False),
        Binding("5", "goto('events')", "Events", show=False),
    ]

    def __init__(self, url: str, token: str | None = None) -> None:
        super().__init__()
        self.client = DaemonClient(url, token)
        self.ports: dict[str, list[dict[str, Any]]] = {}
        self.hosts: list[dict[str, Any]] = []
        self.failover: dict[str, Any] | None = None
        self.stale_since: float | None = None
        self.port_filter = ""
        self.event_filter = ""
        self.synced = asyncio.Event()
        """Set after each resync from a snapshot (tests wait on it)."""
        self.applied = asyncio.Condition()
        """Notified after each event is applied, and after each action's answer."""
        self.stale = asyncio.Event()
        """Set while the daemon is out of reach."""
        self.render_ms: list[float] = []
        """How long each port-map update took (scripts/bench_tui.py reads it)."""
        self.jobs: list[dict[str, Any]] = []
        self.phase_ms: dict[tuple[str, str], list[float]] = {}
        """(switch, span) → the last 500 reconfigurations' times (labd.measure.campaign.SPANS)."""
        self.circuit_at: dict[str, str] = {}
        """``switch:port`` → the end-to-end circuit through it, "h0.nic0 → h1.nic0"."""
        self.mesh_paths: dict[str, dict[str, Any]] = {}
        """mesh → its state from ``GET /v1/switches/{id}`` (paths and intended pairs)."""
        self.shown: dict[str, PortCells] = {}
        """What the port map shows, row by row (only changed cells are redrawn)."""
        self.event_lines: deque[tuple[str, Text]] = deque(maxlen=5000)
        self.recent: deque[dict[str, Any]] = deque(maxlen=500)
        """The latest reconfigurations, oldest first (the Reconfigurations tab's rows)."""
        self.hidden_changes: set[str] = set()
        """Tabs whose tables changed while out of sight: drawn when next shown (drawing a
        table nobody sees costs a full repaint of the screen)."""
        self.drawn_paths: list[tuple[str, int, Any, str | Text, Any]] = []
        self.changed_switches: set[str] = set()
        self.refresh_due = False
        self.refreshed_at = 0.0
        self.last_notice = ""
        """The latest notification's text (tests read it)."""

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="ports"):
            with TabPane("Ports [1]", id="ports"):
                yield Input(placeholder="filter: switch, port or endpoint (/ to focus)",
                            id="port-filter")
                yield DataTable(id="portmap", zebra_stripes=True, cursor_type="row")
                yield DataTable(id="paths", cursor_type="row")
            with TabPane("Hosts [2]", id="hosts"):
                yield DataTable(id="hosttable", cursor_type="row")
            with TabPane("Failover [3]", id="failover"):
                yield Label("no failover yet", id="failover-title")
                yield DataTable(id="timeline", cursor_type="row")
            with TabPane("Reconfigurations [4]", id="reconfigurations"):
                yield ProgressBar(id="measure-progress", show_eta=True)
                yield DataTable(id="latency", cursor_type="row")
                yield DataTable(id="reconf", zebra_stripes=True, cursor_type="row")
            with TabPane("Events [5]", id="events"):
                yield Input(placeholder="filter: kind or content (/ to focus)",
                            id="event-filter")
                yield RichLog(id="eventlog", max_lines=5000, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"{self.client.url} — connecting"
        portmap = self.query_one("#portmap", DataTable)
        for key, label, width in PORT_COLUMNS:
            portmap.add_column(label, width=width, key=key)
        self.query_one("#paths", DataTable).add_columns(
            "mesh", "ports", "circuit", "path (element ═ bar, ╳ cross)")
        self.query_one("#paths", DataTable).display = False
        self.query_one("#measure-progress", ProgressBar).display = False
        self.query_one("#hosttable", DataTable).add_columns(
            "host", "status", "GPUs", "NIC links", "jobs (rank) / spare")
        self.query_one("#timeline", DataTable).add_columns("stage", "ms after failure")
        self.query_one("#latency", DataTable).add_columns(
            "switch", "phase", "n", "p50 ms", "p99 ms", "max ms", "last 60")
        self.query_one("#reconf", DataTable).add_columns(
            "id", "switch", "cause", "outcome", "pairs", "device ms", "light ms", "total ms")
        portmap.focus()  # keys act on the map, not the filter
        self.run_worker(self._follow(), exclusive=True, group="events")

    async def on_unmount(self) -> None:
        # A measurement stopped here still puts its switch back: let it, then close.
        measuring = [w for w in self.workers if w.group == "measure"]
        for worker in measuring:
            worker.cancel()
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()
        await self.client.close()

    def notify_user(self, message: str, title: str, error: bool = False) -> None:
        self.last_notice = f"{title}: {message}"
        self.notify(message, title=title, severity="error" if error else "information",
                    timeout=8 if error else 5)

    async def _announce(self) -> None:
        async with self.applied:
            self.applied.notify_all()

    # -- following the daemon --------------------------------------------------------------
    async def _follow(self) -> None:
        delay = 0.5
        while True:
            try:
                async for message in self.client.events():
                    if message.get("kind") == "snapshot":
                        await self._resync(message)
                        delay = 0.5
                    else:
                        await self._apply(message)
            except DaemonError as exc:
                self._mark_stale(str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _mark_stale(self, why: str) -> None:
        if self.stale_since is None:
            self.stale_since = time.time()
            self.screen.add_class("stale")
            self.stale.set()
        since = time.strftime("%H:%M:%S", time.localtime(self.stale_since))
        self.sub_title = f"STALE since {since}: {why} (last picture kept; retrying)"

    async def _resync(self, snapshot: dict[str, Any]) -> None:
        """A fresh picture: every switch's ports, the hosts, the latest failover, the
        recent reconfigurations."""
        switches = sorted(snapshot.get("intended", {}))
        self.mesh_paths = {}
        for switch in switches:
            await self._load_ports(switch)
            state = await self.client.get(f"/v1/switches/{switch}")
            if state.get("paths") is not None:
                self.mesh_paths[switch] = state
        await self._load_circuits()
        self.hosts = snapshot.get("hosts", [])
        self.jobs = snapshot.get("jobs", [])
        latest = await self.client.get("/v1/failovers", limit=1)
        self.failover = latest[0] if latest else None
        rows = await self.client.get("/v1/reconfigurations", limit=100)
        self.recent.clear()
        self.phase_ms.clear()
        for row in reversed(rows):
            self._add_reconfiguration(row)
        self._render_reconfigurations()
        self._render_ports()
        self._render_hosts()
        self._render_failover()
        self.stale_since = None
        self.stale.clear()
        self.screen.remove_class("stale")
        self.sub_title = f"{self.client.url} — live"
        self.synced.set()

    async def _load_circuits(self) -> None:
        self.circuit_at = {}
        for route in await self.client.get("/v1/circuits"):
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
            self._log_line("error", Text(str(exc), style="yellow"))

    def _port_map_changed(self, switch: str) -> None:
        """Refresh the switch's ports: at once after a quiet spell, else at most every
        REFRESH_S, all the switches changed meanwhile together (a steady stream of changes
        would otherwise repaint the screen for each one)."""
        self.changed_switches.add(switch)
        if self.refresh_due:
            return
        self.refresh_due = True
        wait = self.refreshed_at + REFRESH_S - time.monotonic()
        if wait <= 0:
            self.run_worker(self._refresh_ports(), group="ports")
        else:
            self.set_timer(wait, lambda: self.run_worker(self._refresh_ports(), group="ports"))

    async def _refresh_ports(self) -> None:
        switches, self.changed_switches = self.changed_switches, set()
        self.refresh_due = False
        self.refreshed_at = time.monotonic()
        for switch in sorted(switches):
            await self._load_ports(switch)
        await self._load_circuits()
        self._render_ports()
        await self._announce()

    def _log_line(self, kind: str, line: Text) -> None:
        self.event_lines.append((kind, line))
        wanted = self.event_filter.lower()
        if not wanted or wanted in line.plain.lower():
            # The log lives on the main screen: look there, not on a dialog that may be on
            # top, and not at all once the app is closing (the line is kept either way).
            logs = list(self.screen_stack[0].query("#eventlog").results(RichLog)) \
                if self.screen_stack else []
            if logs:
                logs[0].write(line)

    async def _apply(self, event: dict[str, Any]) -> None:
        kind, data = event.get("kind", ""), event.get("data", {})
        self._log_line(kind, Text.assemble((f"{event.get('seq', ''):>6} ", "dim"),
                                           (f"{kind:24}", "bold"), str(data)[:200]))
        if kind == "reconfiguration":
            self._port_map_changed(data["switch"])
            self._add_reconfiguration(data)
            self._render_reconfigurations(data)
        elif kind == "failover":
            self.failover = data
            self._render_failover()
        elif kind == "drill":
            self._drill_said(data)
        elif kind == "job.state":
            self.jobs = [data if j.get("id") == data.get("id") else j for j in self.jobs]
            self._render_hosts()
        elif kind.startswith(("host.", "gpu.", "nic.")):
            self.hosts = await self.client.get("/v1/hosts")
            self._render_hosts()
        await self._announce()

    # -- rendering -------------------------------------------------------------------------
    def _port_rows(self) -> list[tuple[str, PortCells]]:
        wanted = self.port_filter.lower()
        rows = []
        for switch in sorted(self.ports):
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

    def _render_ports(self) -> None:
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
        self._render_paths()
        self.render_ms.append((time.perf_counter() - started) * 1000)

    def _render_paths(self) -> None:
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

    def _render_hosts(self) -> None:
        if not self._visible("hosts"):
            return
        table = self.query_one("#hosttable", DataTable)
        table.clear()
        for host in self.hosts:
            gpus = Text()
            for gpu in host.get("gpus", []):
                health = gpu.get("health")
                gpus.append("● ", style={"healthy": "green", "degraded": "yellow",
                                         "failed": "bold red"}.get(health, "dim"))
            links = " ".join(f"{n}:{'up' if up else 'down'}"
                             for n, up in sorted(host.get("nics", {}).items()))
            status = host.get("status", "unknown")
            table.add_row(host["id"], Text(status, style="green" if status == "online"
                                           else "bold red"), gpus, links,
                          self._roles(host.get("nics", {})), key=host["id"])

    def _roles(self, nics: dict[str, bool]) -> str:
        """The jobs (and ranks) a host's NICs serve, and the pools they are spares in."""
        roles = []
        for job in self.jobs:
            members = job.get("members", [])
            roles += [f"{job['id']} ({members.index(n)})" for n in nics if n in members]
            roles += [f"spare for {job['id']}" for n in nics if n in job.get("spares", [])]
        return ", ".join(roles) or "-"

    def _render_failover(self) -> None:
        if not self._visible("failover"):
            return
        table = self.query_one("#timeline", DataTable)
        table.clear()
        title = self.query_one("#failover-title", Label)
        t = self.failover
        if t is None:
            title.update("no failover yet (d runs a drill where the hosts are emulated)")
            return
        plan = t.get("plan") or {}
        title.update(f"#{t.get('id')} job {t['job']}: {t.get('trigger')} on {t['member']} → "
                     f"{plan.get('spare', 'no spare')}: {t['outcome']} {t.get('detail') or ''}")
        offsets = t.get("since_failure_ms", {})
        for stage in STAGES:
            value = offsets.get(stage)
            table.add_row(stage, "…" if value is None else f"{value:.2f}", key=stage)

    def _add_reconfiguration(self, row: dict[str, Any]) -> None:
        switch = str(row.get("switch"))
        for name, start, end in SPANS:
            value = span_ms(row, start, end)
            if value is not None:
                kept = self.phase_ms.setdefault((switch, name), [])
                kept.append(value)
                del kept[:-500]
        self.recent.append(row)

    def _visible(self, tab: str) -> bool:
        if self.query_one(TabbedContent).active == tab:
            return True
        self.hidden_changes.add(tab)
        return False

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = str(event.pane.id)
        if tab in self.hidden_changes:
            self.hidden_changes.discard(tab)
            {"reconfigurations": self._render_reconfigurations, "hosts": self._render_hosts,
             "failover": self._render_failover}.get(tab, lambda: None)()

    def _render_reconfigurations(self, latest: dict[str, Any] | None = None) -> None:
        """The latency summary and the recent rows: the new row only where the table is
        up to date, every row after it was out of sight."""
        if not self._visible("reconfigurations"):
            return
        table = self.query_one("#reconf", DataTable)
        if latest is None:
            table.clear()
        for row in [latest] if latest is not None else self.recent:
            table.add_row(*reconfiguration_cells(row))
        while table.row_count > self.recent.maxlen:  # type: ignore[operator]
            table.remove_row(next(iter(table.rows)))
        self._render_latency()

    def _render_latency(self) -> None:
        """Per switch and phase: the distribution of the last 500 and the last 60's course."""
        table = self.query_one("#latency", DataTable)
        table.clear()
        order = {name: i for i, (name, _, _) in enumerate(SPANS)}
        for (switch, name), values in sorted(self.phase_ms.items(),
                                             key=lambda i: (i[0][0], order[i[0][1]])):
            table.add_row(switch, name, str(len(values)), f"{percentile(values, 50):.2f}",
                          f"{percentile(values, 99):.2f}", f"{max(values):.2f}",
                          Text(sparkline(values[-60:]), style="cyan"), key=f"{switch}:{name}")

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): labd's actions and tabs beside Textual's own."""
        yield from super().get_system_commands(screen)
        for title, what, action in (
                ("Make a circuit", "between two endpoints, on every switch it crosses",
                 self.action_circuit),
                ("Connect a raw pair", "two ports of one switch", self.action_pair),
                ("Break", "the circuit or raw pair through the port under the cursor",
                 self.action_break),
                ("Measure reconfiguration latency", "toggle, random, permutation or sweep "
                 "on a switch's free ports", self.action_measure),
                ("Run a failover drill", "fail a member GPU; watch the recovery",
                 self.action_drill),
                ("Resync", "from a fresh snapshot", self.action_resync)):
            yield SystemCommand(title, what, action)
        for tab in self.TAB_FOCUS:
            yield SystemCommand(f"Show {tab}", f"the {tab} tab", partial(self.action_goto, tab))

    # -- navigation ------------------------------------------------------------------------
    #: The widget that takes the keys on each tab.
    TAB_FOCUS: ClassVar[dict[str, str]] = {
        "ports": "#portmap", "hosts": "#hosttable", "failover": "#timeline",
        "reconfigurations": "#reconf", "events": "#eventlog"}

    def action_goto(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        # Focus follows, or the tab holding the old focus would take itself back.
        self.query_one(self.TAB_FOCUS[tab]).focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.query_one(TabbedContent).active))

    def action_filter(self) -> None:
        """Filter the events on the Events tab, the port map everywhere else."""
        if self.query_one(TabbedContent).active == "events":
            self.query_one("#event-filter", Input).focus()
            return
        self.action_goto("ports")
        self.query_one("#port-filter", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "port-filter":  # Enter: back to the map
            self.query_one("#portmap", DataTable).focus()
        elif event.input.id == "event-filter":
            self.query_one("#eventlog", RichLog).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "port-filter":
            self.port_filter = event.value.strip()
            self._render_ports()
        elif event.input.id == "event-filter":
            self.event_filter = event.value.strip()
            log = self.query_one("#eventlog", RichLog)
            log.clear()
            wanted = self.event_filter.lower()
            for _, line in self.event_lines:
                if not wanted or wanted in line.plain.lower():
                    log.write(line)

    def action_resync(self) -> None:
        self.run_worker(self._follow(), exclusive=True, group="events")

    def port_under_cursor(self) -> tuple[str, int] | None:
        """The switch and port of the port-map row under the cursor."""
        table = self.query_one("#portmap", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        switch, _, port = str(key).rpartition(":")
        return switch, int(port)

    # -- actions: every change asks first --------------------------------------------------
    def _ask(self, question: str, then: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Ask; on yes, run ``then()`` in a worker."""
        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(then(), group="actions")

        self.push_screen(ConfirmScreen(question), answered)

    def _ask_change(self, question: str, title: str, method: str, path: str,
                    body: dict[str, Any], said: Callable[[Any], str]) -> None:
        self._ask(question, lambda: self._change(title, method, path, body, said))

    async def _change(self, title: str, method: str, path: str, body: dict[str, Any],
                      said: Callable[[Any], str]) -> None:
        """One change through the API; the answer (or the refusal) as a notification."""
        try:
            result = await self.client.request(method, path, body)
        except DaemonError as exc:
            self.notify_user(str(exc), f"{title}: refused", error=True)
        else:
            self.notify_user(said(result), title)
        await self._announce()

    def action_circuit(self) -> None:
        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            src, dst = answer["src"], answer["dst"]
            self._ask_change(
                f"Make the circuit {src} → {dst} (on every switch it crosses)?",
                "circuit made", "POST", "/v1/circuits", {"from": src, "to": dst},
                lambda r: f"{src} → {dst} via {route_text(r['route'])}")

        self.push_screen(FormScreen("Make a circuit", [
            ("src", "from endpoint, e.g. h0.nic0", ""),
            ("dst", "to endpoint, e.g. h1.nic0", "")]), typed)

    def action_pair(self) -> None:
        at = self.port_under_cursor()

        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            try:
                a, b = int(answer["a"]), int(answer["b"])
            except ValueError:
                self.notify_user("ports are numbers", "raw pair not made", error=True)
                return
            switch = answer["switch"]
            self._ask_change(
                f"Connect {switch} port {a} to port {b} (a raw pair, no endpoints)?",
                "pair made", "POST", f"/v1/switches/{switch}/connections",
                {"pairs": [[a, b]]}, lambda r: f"{switch} {a}↔{b}: {r['outcome']}")

        self.push_screen(FormScreen("Connect a raw pair on one switch", [
            ("switch", "switch id", at[0] if at else ""),
            ("a", "port", str(at[1]) if at else ""), ("b", "other port", "")]), typed)

    def action_break(self) -> None:
        """Break the circuit through the port under the cursor, or its raw pair."""
        at = self.port_under_cursor()
        if at is None:
            return
        switch, port = at
        circuit = self.circuit_at.get(f"{switch}:{port}")
        cells = self.shown.get(f"{switch}:{port}")
        if circuit:
            src, dst = circuit.split(" → ")
            self._ask_change(
                f"Break the circuit {circuit} (on every switch it crosses)?",
                "circuit broken", "POST", "/v1/circuits/disconnect", {"from": src, "to": dst},
                lambda r: f"{circuit}: was via {route_text(r['route'])}")
        elif cells is not None and cells[2]:
            partner = cells[2]
            self._ask_change(
                f"Disconnect {switch} port {port} from port {partner}?",
                "pair broken", "POST", f"/v1/switches/{switch}/disconnect", {"ports": [port]},
                lambda r: f"{switch} {port}↔{partner}: {r['outcome']}")
        else:
            self.notify_user(f"{switch} port {port} is in no circuit", "nothing to break")

    def action_drill(self) -> None:
        self._ask("Run a failover drill: a member GPU of the first job with spares fails "
                  "(Xid 79), the daemon swaps a spare in, then the member is repaired?",
                  self._drill)

    async def _drill(self) -> None:
        try:
            await self.client.post("/v1/drills/failover", {"kind": "gpu"})
        except DaemonError as exc:
            self.notify_user(str(exc), "drill not started", error=True)
        else:
            self.action_goto("failover")
        await self._announce()

    def _drill_said(self, data: dict[str, Any]) -> None:
        state = data.get("state")
        if state == "failed":
            self.notify_user(str(data.get("detail")), "drill failed", error=True)
        elif state in ("recovered", "ended"):
            self.notify_user(f"job {data['job']}: {data.get('member')} → "
                             f"{data.get('outcome')}", "drill")
        elif state == "done":
            self.notify_user(f"{data.get('member')} repaired and returned as a spare",
                             "drill done")

    def action_measure(self) -> None:
        at = self.port_under_cursor()

        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            try:
                plan = ReconfigPlan(answer["switch"], answer["pattern"],
                                    int(answer["rounds"]), int(answer["k"]))
                plan.check()
            except (ValueError, CampaignError) as exc:
                self.notify_user(str(exc), "measurement not started", error=True)
                return
            self.run_worker(self._measure(plan), group="measure", exclusive=True)

        self.push_screen(FormScreen("Measure reconfiguration latency on free ports", [
            ("switch", "switch id", at[0] if at else ""),
            ("pattern", "toggle | random | permutation | sweep", "toggle"),
            ("rounds", "reconfigurations (per batch size)", "20"),
            ("k", "pairs per batch (random)", "1")]), typed)

    async def _measure(self, plan: ReconfigPlan) -> None:
        bar = self.query_one("#measure-progress", ProgressBar)
        self.action_goto("reconfigurations")
        rows: list[dict[str, Any]] = []
        try:
            sizes = batch_sizes(plan, await free_ports(self.client, plan.switch))
            bar.update(total=planned(plan, sizes), progress=0)
            bar.display = True
            async for row in run_reconfig(self.client, plan):
                rows.append(row)
                bar.advance(1)
        except (DaemonError, CampaignError) as exc:
            self.notify_user(str(exc), "measurement stopped", error=True)
        finally:
            bar.display = False
        device = [r for r in summary(rows) if r["span"] == "device"]
        self.notify_user(", ".join(f"k={r['k']}: device p50 {r['p50']:.2f} ms, p99 "
                                   f"{r['p99']:.2f} ms" for r in device) or "no timed rows",
                         f"{plan.switch} {plan.pattern}: {len(rows)} reconfigurations")
        await self._announce()


def reconfiguration_cells(row: dict[str, Any]) -> tuple[str | Text, ...]:
    """A reconfiguration as the table shows it: id, switch, cause, outcome, pairs, and its
    device, light and total times in ms."""
    def span(a: str, b: str) -> str:
        value = span_ms(row, a, b)
        return "-" if value is None else f"{value:.2f}"

    outcome = str(row.get("outcome"))
    pairs = len(row.get("connected", [])) + len(row.get("disconnected", []))
    return (str(row.get("id")), str(row.get("switch")), str(row.get("cause")),
            Text(outcome, style="green" if outcome == "ok" else "bold red"), str(pairs),
            span("dispatched", "acknowledged"), span("dispatched", "light"),
            span("requested", "done"))


def route_text(route: dict[str, Any]) -> str:
    return ", ".join(f"{h['switch']} {h['ingress']}→{h['egress']}"
                     for h in route["hops"]) or "a direct fibre"
