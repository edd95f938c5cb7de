"""``labd tui``: the lab engineer's window into a running daemon.

Tabs (tui/tabs/, one module each): the port map of every switch (partner, state, power
coloured by level, circuits named by their endpoints), the GPU hosts, the latest failover's
timeline, recent reconfigurations with their phases, the event log, and a switch as a
matrix of ingress by egress ports. The app follows
the daemon's event stream and hands each event to the tabs it concerns; when the daemon
goes away it says so, keeps the last picture marked stale, and resyncs from a fresh
snapshot when the daemon is back. It never blocks on the network: all requests run in
workers. The keys that change things lead to tui/changes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from functools import partial
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Header, TabbedContent
from textual.worker import WorkerCancelled, WorkerFailed

from labd.client.api import DaemonClient
from labd.errors import DaemonError
from tui.changes import Changes
from tui.reach import CHANGES, Unreachable, unable
from tui.screens.help import HelpScreen
from tui.tabs.events import EventsTab
from tui.tabs.failover import FailoverTab
from tui.tabs.hosts import HostsTab
from tui.tabs.matrix import MatrixTab
from tui.tabs.pane import Pane
from tui.tabs.ports import PortsTab
from tui.tabs.reconfigurations import ReconfigurationsTab


class LabApp(App[None]):
    """The tabs, the keys, and the daemon's event stream routed to the tabs."""

    CSS_PATH = "app.tcss"
    TITLE = "labd"
    # The footer holds what fits 80 columns (eight short labels, compact, no palette
    # entry: 67 columns); p and ctrl+p are in the help and the palette. A change this lab
    # cannot take is shown dimmed (check_action), and its key's second binding says why
    # instead of asking first.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("c", "circuit", "Circuit"),
        Binding("p", "pair", "Raw pair", show=False),
        Binding("x", "break", "Break"),
        Binding("m", "measure", "Measure"),
        Binding("d", "drill", "Drill"),
        Binding("slash", "filter", "Filter"),
        Binding("r", "resync", "Resync"),
        Binding("question_mark", "help", "Help"),
        *(Binding(key, f"why_not('{action}')", show=False) for action, key in CHANGES.items()),
        Binding("1", "goto('ports')", "Ports", show=False),
        Binding("2", "goto('hosts')", "Hosts", show=False),
        Binding("3", "goto('failover')", "Failover", show=False),
        Binding("4", "goto('reconfigurations')", "Reconfigurations", show=False),
        Binding("5", "goto('events')", "Events", show=False),
        Binding("6", "goto('matrix')", "Matrix", show=False),
    ]

    def __init__(self, url: str, token: str | None = None, *, ca: str | None = None
                 ) -> None:
        super().__init__()
        self.client = DaemonClient(url, token, ca=ca)
        self.stale_since: float | None = None
        self.synced = asyncio.Event()
        """Set after each resync from a snapshot (tests wait on it)."""
        self.applied = asyncio.Condition()
        """Notified after each event is applied, and after each action's answer."""
        self.stale = asyncio.Event()
        """Set while the daemon is out of reach."""
        # Held, not queried: events still arriving while the app closes find them.
        self.ports = PortsTab(self.client)
        self.hosts = HostsTab()
        self.failover = FailoverTab()
        self.reconfigurations = ReconfigurationsTab()
        self.events = EventsTab()
        self.matrix = MatrixTab()
        self.tabs: dict[str, Pane] = {str(tab.id): tab for tab in (
            self.ports, self.hosts, self.failover, self.reconfigurations, self.events,
            self.matrix)}
        self.lab: str | None = None
        """The lab's name, as the daemon gives it (GET /v1/health)."""
        self.daemons: list[str] = [self.client.url]
        """The lab's daemons met so far (``--ha``: the leader and its standbys): when the
        one followed goes, the next is tried."""
        self.lab_endpoints: list[str] = []
        self.unsure: tuple[float, str] | None = None
        """While the daemon is unsure of its hosts: since when (wall clock) and why."""
        """The lab's endpoints (GET /v1/endpoints), offered as ``c``'s fields are typed."""
        self.changes = Changes(self, self.client, self._announce, self.action_goto)
        self.unable: dict[str, str] = {}
        """The changes that cannot work now, by action, and why (tui/reach.py)."""
        self.banner = Unreachable()

    @property
    def render_ms(self) -> list[float]:
        """How long each port-map update took (scripts/bench_tui.py reads it)."""
        return self.ports.render_ms

    def compose(self) -> ComposeResult:
        yield Header()
        yield self.banner
        with TabbedContent(initial="ports"):
            yield from self.tabs.values()
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.sub_title = f"{self.client.url} — connecting"
        self.matrix.show({}, {}, {})
        self.ports.take_keys()  # keys act on the map, not the filter
        self.run_worker(self._follow(), exclusive=True, group="events")

    async def on_unmount(self) -> None:
        # A measurement stopped here still puts its switch back: let it, then close.
        measuring = [w for w in self.workers if w.group == "measure"]
        for worker in measuring:
            worker.cancel()
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await worker.wait()
        await self.client.close()

    async def _announce(self) -> None:
        async with self.applied:
            self.applied.notify_all()

    # -- following the daemon --------------------------------------------------------------
    async def _follow(self) -> None:
        delay = 0.5
        while True:
            try:
                async for message in self.client.events():
                    if not self.is_running:
                        return  # closing: the tabs are being taken down
                    if message.get("kind") == "snapshot":
                        if not await self._resync(message):
                            delay = 0.0  # moved to the leader: at once
                            break
                        delay = 0.5
                    else:
                        await self._apply(message)
            except DaemonError as exc:
                self._mark_stale(str(exc))
                if len(self.daemons) > 1:  # the leader gone: another may lead now
                    at = self.daemons.index(self.client.url) if (
                        self.client.url in self.daemons) else -1
                    self.client.move(self.daemons[(at + 1) % len(self.daemons)])
            await asyncio.sleep(delay)
            delay = min(max(delay, 0.25) * 2, 5.0)

    def _mark_stale(self, why: str) -> None:
        """The daemon is out of reach: a short title that fits 80 columns, the banner
        with the URL, why and what to do, and every change key off until it is back."""
        if self.stale_since is None:
            self.stale_since = time.time()
            self.screen.add_class("stale")
            self.stale.set()
        if not self.synced.is_set():  # never reached: no picture to keep
            self.banner.tell(self.client.url, why, None)
            self.sub_title = "daemon not reachable"
        else:
            self.banner.tell(self.client.url, why, self.stale_since)
            since = time.strftime("%H:%M:%S", time.localtime(self.stale_since))
            self.sub_title = f"STALE since {since}"
        self._set_unable(dict.fromkeys(CHANGES, f"the daemon at {self.client.url} is not "
                                                "reachable"))

    def _set_unable(self, reasons: dict[str, str]) -> None:
        self.unable = reasons
        if self.failover.drill_off != reasons.get("drill"):
            self.failover.drill_off = reasons.get("drill")
            self.failover.changed()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A change this lab cannot take: shown, dimmed (its key says why instead)."""
        return None if action in self.unable else True

    def action_why_not(self, action: str) -> None:
        """A dimmed key pressed: why it cannot work here, at once, asking nothing."""
        self.changes.tell(self.unable.get(action, "it is off"),
                          f"{CHANGES.get(action, action)} is off", error=True)

    async def _resync(self, snapshot: dict[str, Any]) -> bool:
        """A fresh picture: every switch's ports, the hosts, the latest failover, the
        recent reconfigurations; False instead where the daemon is a standby that names
        its lab's leader (``--ha``), which the app then follows."""
        health = await self.client.get("/v1/health")
        ha = health.get("ha") or {}
        leader = ha.get("leader")
        if ha.get("role") == "standby" and isinstance(leader, str) and leader and \
                leader.rstrip("/") != self.client.url:
            for url in (self.client.url, leader.rstrip("/")):
                if url not in self.daemons:
                    self.daemons.append(url)
            self.sub_title = f"{self.client.url} stands by; following the leader at {leader}"
            self.client.move(leader)
            return False
        self.lab = str(health.get("lab") or "") or None
        # The lab first: several daemons on one machine differ by it, not by their port.
        self.title = f"labd · {self.lab}" if self.lab else "labd"
        self.lab_endpoints = [str(e["id"]) for e in await self.client.get("/v1/endpoints")]
        switches = sorted(snapshot.get("intended", {}))
        await self.ports.load(switches)
        self._show_matrix()
        latest = await self.client.get("/v1/failovers", limit=1)
        rows = await self.client.get("/v1/reconfigurations", limit=100)
        self.reconfigurations.show(reversed(rows))
        self.events.backlog(snapshot.get("seq"), rows, latest)
        self._set_unable(await unable(self.client, self.lab_endpoints, switches))
        self.banner.clear()
        self.hosts.show(snapshot.get("hosts", []), snapshot.get("jobs", []))
        self.failover.show(latest[0] if latest else None)
        self.stale_since = None
        self.stale.clear()
        self.screen.remove_class("stale")
        episode = health.get("hosts") or {}
        self.unsure = (time.time() - float(episode.get("for_s") or 0.0),
                       str(episode.get("why") or "")) if episode.get("unsure") else None
        self._live()
        self.synced.set()
        return True

    async def _apply(self, event: dict[str, Any]) -> None:
        kind, data = event.get("kind", ""), event.get("data", {})
        self.events.add_event(event)
        if kind == "reconfiguration":
            self.ports.switch_changed(data["switch"])
            self.reconfigurations.add(data)
        elif kind == "failover":
            self.failover.show(data)
        elif kind == "drill":
            self.changes.drill_said(data)
        elif kind == "job.state":
            self.hosts.show_job(data)
        elif kind == "hosts.unsure":
            if not data.get("waiting"):
                self.unsure = None
            elif self.unsure is None:
                self.unsure = (time.time(), str(data.get("detail") or ""))
            self._live()
        elif kind.startswith(("host.", "gpu.", "nic.")):
            self.hosts.show_hosts(await self.client.get("/v1/hosts"))
        await self._announce()

    def _live(self) -> None:
        """The title's line while following the daemon, with the badge while it is unsure
        of its hosts (it holds its verdicts: a silent host is not declared lost)."""
        line = f"{self.client.url} — live"
        if self.unsure is not None:
            since, why = self.unsure
            line += (f" · HOSTS UNSURE since {time.strftime('%H:%M:%S', time.localtime(since))}"
                     f": {why}")
        self.sub_title = line

    def _show_matrix(self) -> None:
        self.matrix.show(self.ports.ports, self.ports.sizes, self.ports.circuit_at)

    async def on_ports_tab_redrawn(self) -> None:
        self._show_matrix()
        await self._announce()

    def on_ports_tab_trouble(self, message: PortsTab.Trouble) -> None:
        self.events.add("error", Text(message.text, style="yellow"))

    # -- navigation ------------------------------------------------------------------------
    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if isinstance(event.pane, Pane):
            event.pane.came_into_view()

    def action_goto(self, tab: str) -> None:
        tabs = self.query_one(TabbedContent)
        if tab == "matrix" and tabs.active == "ports":
            at = self.ports.port_under_cursor()  # the matrix opens on the map's switch
            if at is not None:
                self.matrix.select(at[0])
        tabs.active = tab
        # Focus follows, or the tab holding the old focus would take itself back.
        self.tabs[tab].take_keys()

    def action_help(self) -> None:
        text = self.tabs[self.query_one(TabbedContent).active].HELP
        off = [f"{CHANGES[action]} ({action}): {why}" for action, why in self.unable.items()]
        self.push_screen(HelpScreen(text, off))

    def action_filter(self) -> None:
        """Filter the events on the Events tab, the port map everywhere else."""
        if self.query_one(TabbedContent).active == "events":
            self.events.focus_filter()
            return
        self.action_goto("ports")
        self.ports.focus_filter()

    def action_resync(self) -> None:
        self.run_worker(self._follow(), exclusive=True, group="events")

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): labd's actions and tabs beside Textual's own."""
        yield from super().get_system_commands(screen)
        for title, what, name in (
                ("Make a circuit", "between two endpoints, on every switch it crosses",
                 "circuit"),
                ("Connect a raw pair", "two ports of one switch", "pair"),
                ("Break", "the circuit or raw pair through the port under the cursor",
                 "break"),
                ("Measure reconfiguration latency", "toggle, random, permutation or sweep "
                 "on a switch's free ports", "measure"),
                ("Run a failover drill", "fail a member GPU; watch the recovery", "drill")):
            if name in self.unable:  # offered, but it says why it cannot work here
                yield SystemCommand(title, f"off: {self.unable[name]}",
                                    partial(self.action_why_not, name))
            else:
                yield SystemCommand(title, what, getattr(self, f"action_{name}"))
        yield SystemCommand("Resync", "from a fresh snapshot", self.action_resync)
        for tab in self.tabs:
            yield SystemCommand(f"Show {tab}", f"the {tab} tab", partial(self.action_goto, tab))

    # -- changes: every one asks first (tui/changes.py) ------------------------------------
    def action_circuit(self) -> None:
        self.changes.circuit(self.known_endpoints())

    def known_endpoints(self) -> list[str]:
        """The lab's endpoints, and any the UI has heard of beside them (the hosts' NICs,
        the jobs' members and spares, the ends of the circuits up now)."""
        found: set[str] = set(self.lab_endpoints)
        for host in self.hosts.hosts:
            found.update(str(n) for n in host.get("nics", {}))
        for job in self.hosts.jobs:
            found.update(map(str, [*job.get("members", []), *job.get("spares", [])]))
        for circuit in self.ports.circuit_at.values():
            found.update(circuit.split(" → "))
        return sorted(found)

    def _active(self) -> str:
        return str(self.query_one(TabbedContent).active)

    def action_pair(self) -> None:
        """On the matrix, the pair under its cursor; elsewhere a form, filled in from the
        port map's cursor."""
        if self._active() == "matrix":
            at = self.matrix.cursor()
            if at is not None:
                self.changes.pair_here(*at)
            return
        self.changes.pair(self.ports.port_under_cursor())

    def action_break(self) -> None:
        """Break the circuit through the port under the cursor, or its raw pair (on the
        matrix: the pair under its cursor, if it is connected)."""
        if self._active() == "matrix":
            cell = self.matrix.cursor()
            if cell is None:
                return
            switch, ingress, egress = cell
            if not self.matrix.view.grid.connected(ingress, egress):
                self.changes.tell(f"{switch} {ingress} → {egress} is not connected",
                                  "nothing to break")
                return
            self.changes.break_port(switch, ingress, self.ports.circuit_through(
                switch, ingress), str(egress))
            return
        at = self.ports.port_under_cursor()
        if at is not None:
            self.changes.break_port(*at, self.ports.circuit_through(*at),
                                    self.ports.partner(*at))

    def action_drill(self) -> None:
        self.changes.drill()

    def action_measure(self) -> None:
        cell = self.matrix.cursor() if self._active() == "matrix" else None
        at = cell[:2] if cell is not None else self.ports.port_under_cursor()
        self.changes.measure(at, self.reconfigurations)
