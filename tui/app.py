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
import time
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Input,
    Label,
    RichLog,
    TabbedContent,
    TabPane,
)

from labd.client import DaemonClient, DaemonError

STAGES = ("failure", "reported", "detected", "spare_chosen", "switches_acked",
          "light_verified", "links_up", "job_restarted", "collectives_ready", "first_step")


BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """The values as bars, scaled between their minimum and maximum."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in values)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def power_text(dbm: float | None, threshold: float = -30.0) -> Text:
    """Optical power, coloured by level: light, weak light, dark."""
    if dbm is None:
        return Text("-", style="dim")
    style = "green" if dbm >= threshold + 20 else "yellow" if dbm >= threshold else "dim red"
    return Text(f"{dbm:7.2f}", style=style)


class CircuitScreen(ModalScreen[tuple[str, str] | None]):
    """Make a circuit between two endpoints: type both, Enter confirms, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("Make a circuit (Enter in the second field makes it; Esc cancels)")
            yield Input(placeholder="from endpoint, e.g. h0.nic0", id="src")
            yield Input(placeholder="to endpoint, e.g. h1.nic0", id="dst")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "src":
            self.query_one("#dst", Input).focus()
            return
        src = self.query_one("#src", Input).value.strip()
        dst = self.query_one("#dst", Input).value.strip()
        if src and dst:
            self.dismiss((src, dst))

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = {
    "ports": "Every port of every switch: its partner, state (failed in red), optical power "
             "coloured by level (green: well lit, yellow: near the threshold, dim red: dark) "
             "and the end-to-end circuit through it. / filters (switch, switch:port, "
             "endpoint); c makes a circuit between two endpoints.",
    "hosts": "Each GPU host: status (lost hosts in red), its GPUs' health (● green healthy, "
             "yellow degraded, red failed), NIC links, and the jobs (rank) it serves or is a "
             "spare for.",
    "failover": "The latest recovery, stage by stage as it happens, in ms after the failure: "
                "failure → reported → detected → spare chosen → switches acknowledged → "
                "light verified → links up → job restarted → collectives ready → first step.",
    "reconfigurations": "Recent reconfigurations: outcome, pairs, device (dispatched → "
                        "acknowledged), light (dispatched → light verified) and total ms.",
    "events": "Everything the daemon reports, newest last.",
}
KEYS = ("1-5 tabs · / filter ports · c make a circuit · r resync · ? this help · "
        "ctrl+p command palette · q quit. When the daemon is unreachable the title says "
        "STALE and the last picture is kept.")


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


class LabApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "labd"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("c", "circuit", "Make circuit"),
        Binding("slash", "filter", "Filter ports"),
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
        self.synced = asyncio.Event()
        """Set after each resync from a snapshot (tests wait on it)."""
        self.applied = asyncio.Condition()
        """Notified after each event is applied."""
        self.stale = asyncio.Event()
        """Set while the daemon is out of reach."""
        self.render_ms: list[float] = []
        """How long each port-map update took (scripts/bench_tui.py reads it)."""
        self.jobs: list[dict[str, Any]] = []
        self.device_ms: dict[str, list[float]] = {}
        self.light_ms: dict[str, list[float]] = {}
        self.circuit_at: dict[str, str] = {}
        """``switch:port`` → the end-to-end circuit through it, "h0.nic0 → h1.nic0"."""

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="ports"):
            with TabPane("Ports [1]", id="ports"):
                yield Input(placeholder="filter: switch, port or endpoint (/ to focus)",
                            id="port-filter")
                yield DataTable(id="portmap", zebra_stripes=True, cursor_type="row")
            with TabPane("Hosts [2]", id="hosts"):
                yield DataTable(id="hosttable", cursor_type="row")
            with TabPane("Failover [3]", id="failover"):
                yield Label("no failover yet", id="failover-title")
                yield DataTable(id="timeline", cursor_type="row")
            with TabPane("Reconfigurations [4]", id="reconfigurations"):
                yield DataTable(id="latency", cursor_type="row")
                yield DataTable(id="reconf", zebra_stripes=True, cursor_type="row")
            with TabPane("Events [5]", id="events"):
                yield RichLog(id="eventlog", max_lines=5000, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"{self.client.url} — connecting"
        self.query_one("#portmap", DataTable).add_columns(
            "switch", "port", "partner", "state", "power dBm", "circuit")
        self.query_one("#hosttable", DataTable).add_columns(
            "host", "status", "GPUs", "NIC links", "jobs (rank) / spare")
        self.query_one("#timeline", DataTable).add_columns("stage", "ms after failure")
        self.query_one("#latency", DataTable).add_columns(
            "switch", "n", "device p50", "device p99", "light p50", "device ms, last 60")
        self.query_one("#reconf", DataTable).add_columns(
            "id", "switch", "cause", "outcome", "pairs", "device ms", "light ms", "total ms")
        self.query_one("#portmap", DataTable).focus()  # keys act on the map, not the filter
        self.run_worker(self._follow(), exclusive=True, group="events")

    async def on_unmount(self) -> None:
        await self.client.close()

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
        for switch in switches:
            await self._load_ports(switch)
        await self._load_circuits()
        self.hosts = snapshot.get("hosts", [])
        self.jobs = snapshot.get("jobs", [])
        latest = await self.client.get("/v1/failovers", limit=1)
        self.failover = latest[0] if latest else None
        rows = await self.client.get("/v1/reconfigurations", limit=100)
        reconf = self.query_one("#reconf", DataTable)
        reconf.clear()
        self.device_ms.clear()
        self.light_ms.clear()
        for row in reversed(rows):
            self._add_reconfiguration(row)
        self._render_latency()
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
        except DaemonError as exc:  # an offline switch: say so, keep its last picture
            self.query_one("#eventlog", RichLog).write(Text(str(exc), style="yellow"))

    async def _apply(self, event: dict[str, Any]) -> None:
        kind, data = event.get("kind", ""), event.get("data", {})
        self.query_one("#eventlog", RichLog).write(
            Text.assemble((f"{event.get('seq', ''):>6} ", "dim"), (f"{kind:24}", "bold"),
                          str(data)[:200]))
        if kind == "reconfiguration":
            await self._load_ports(data["switch"])
            await self._load_circuits()
            self._render_ports()
            self._add_reconfiguration(data)
            self._render_latency()
        elif kind == "failover":
            self.failover = data
            self._render_failover()
        elif kind == "job.state":
            self.jobs = [data if j.get("id") == data.get("id") else j for j in self.jobs]
            self._render_hosts()
        elif kind.startswith(("host.", "gpu.", "nic.")):
            self.hosts = await self.client.get("/v1/hosts")
            self._render_hosts()
        async with self.applied:
            self.applied.notify_all()

    # -- rendering -------------------------------------------------------------------------
    def _render_ports(self) -> None:
        started = time.perf_counter()
        table = self.query_one("#portmap", DataTable)
        table.clear()
        wanted = self.port_filter.lower()
        for switch in sorted(self.ports):
            for port in self.ports[switch]:
                where = f"{switch}:{port['port']}"
                circuit = self.circuit_at.get(where, "")
                cells = (switch, str(port["port"]),
                         "" if port["partner"] is None else str(port["partner"]),
                         str(port["state"]), circuit)
                if wanted and not any(wanted in c.lower() for c in (where, *cells)):
                    continue
                # Plain strings where there is nothing to colour: 768 rows add up.
                state: str | Text = cells[3] if cells[3] in ("enabled", "unknown") else Text(
                    cells[3], style="red" if cells[3] == "failed" else "dim")
                table.add_row(switch, cells[1],
                              Text(cells[2], style="bold cyan") if cells[2] else "", state,
                              power_text(port.get("power_dbm")),
                              Text(circuit, style="bold cyan") if circuit else "", key=where)
        self.render_ms.append((time.perf_counter() - started) * 1000)

    def _render_hosts(self) -> None:
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
        table = self.query_one("#timeline", DataTable)
        table.clear()
        title = self.query_one("#failover-title", Label)
        t = self.failover
        if t is None:
            title.update("no failover yet")
            return
        plan = t.get("plan") or {}
        title.update(f"#{t.get('id')} job {t['job']}: {t.get('trigger')} on {t['member']} → "
                     f"{plan.get('spare', 'no spare')}: {t['outcome']} {t.get('detail') or ''}")
        offsets = t.get("since_failure_ms", {})
        for stage in STAGES:
            value = offsets.get(stage)
            table.add_row(stage, "…" if value is None else f"{value:.2f}", key=stage)

    def _add_reconfiguration(self, row: dict[str, Any]) -> None:
        phases = row.get("phases") or {}

        def span(a: str, b: str) -> str:
            start, end = phases.get(a), phases.get(b)
            return "-" if start is None or end is None else f"{(end - start) / 1e6:.2f}"

        switch = str(row.get("switch"))
        for series, (a, b) in ((self.device_ms, ("dispatched", "acknowledged")),
                               (self.light_ms, ("dispatched", "light"))):
            start, end = phases.get(a), phases.get(b)
            if start is not None and end is not None:
                kept = series.setdefault(switch, [])
                kept.append((end - start) / 1e6)
                del kept[:-500]
        pairs = len(row.get("connected", [])) + len(row.get("disconnected", []))
        outcome = str(row.get("outcome"))
        table = self.query_one("#reconf", DataTable)
        table.add_row(str(row.get("id")), str(row.get("switch")), str(row.get("cause")),
                      Text(outcome, style="green" if outcome == "ok" else "bold red"),
                      str(pairs), span("dispatched", "acknowledged"),
                      span("dispatched", "light"), span("requested", "done"))
        if table.row_count > 500:
            table.remove_row(next(iter(table.rows)))

    def _render_latency(self) -> None:
        """Per switch: the device time's distribution and its recent course."""
        table = self.query_one("#latency", DataTable)
        table.clear()
        for switch, device in sorted(self.device_ms.items()):
            light = self.light_ms.get(switch, [])
            table.add_row(switch, str(len(device)), f"{quantile(device, 0.5):.2f}",
                          f"{quantile(device, 0.99):.2f}",
                          f"{quantile(light, 0.5):.2f}" if light else "-",
                          Text(sparkline(device[-60:]), style="cyan"), key=switch)

    # -- actions ---------------------------------------------------------------------------
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
        self.action_goto("ports")
        self.query_one("#port-filter", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "port-filter":  # Enter: back to the map
            self.query_one("#portmap", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "port-filter":
            self.port_filter = event.value.strip()
            self._render_ports()

    def action_resync(self) -> None:
        self.run_worker(self._follow(), exclusive=True, group="events")

    def action_circuit(self) -> None:
        def made(answer: tuple[str, str] | None) -> None:
            if answer is not None:
                self.run_worker(self._make_circuit(*answer), group="actions")

        self.push_screen(CircuitScreen(), made)

    async def _make_circuit(self, src: str, dst: str) -> None:
        try:
            result = await self.client.post("/v1/circuits", {"from": src, "to": dst})
        except DaemonError as exc:
            self.notify(str(exc), title="circuit not made", severity="error", timeout=8)
            return
        hops = ", ".join(f"{h['switch']} {h['ingress']}→{h['egress']}"
                         for h in result["route"]["hops"]) or "a direct fibre"
        self.notify(f"{src} → {dst} via {hops}", title="circuit made")
