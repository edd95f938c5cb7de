"""The Reconfigurations tab: per switch and phase, the latency of the latest
reconfigurations; below, the recent ones row by row."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, ProgressBar, Static

from labd.client.api import DaemonClient
from labd.measure.campaign import (
    ReconfigPlan,
    batch_sizes,
    free_ports,
    planned,
    run_reconfig,
    summary,
)
from labd.vocabulary import SPANS, percentile, span_ms
from tui.render import reconfiguration_cells, sparkline
from tui.tabs.pane import Pane

#: Reconfigurations kept: the recent rows, and the times of each switch and phase.
KEEP = 500
#: The latest times drawn as a sparkline.
SPARK = 60
PhaseTimes = dict[tuple[str, str], list[float]]


def record(phase_ms: PhaseTimes, row: dict[str, Any]) -> None:
    """Add a reconfiguration's time in each phase (labd.vocabulary.SPANS) it went through
    to ``phase_ms`` ((switch, phase) → times in ms), keeping the last KEEP of each."""
    switch = str(row.get("switch"))
    for name, start, end in SPANS:
        value = span_ms(row, start, end)
        if value is not None:
            kept = phase_ms.setdefault((switch, name), [])
            kept.append(value)
            del kept[:-KEEP]


def latency_rows(phase_ms: Mapping[tuple[str, str], Sequence[float]]) -> list[tuple[str, ...]]:
    """The latency table's rows, by switch and then in the order of SPANS: switch, phase,
    n, p50, p99 and max in ms, and the last SPARK times as a sparkline."""
    order = {name: i for i, (name, _, _) in enumerate(SPANS)}
    return [(switch, name, str(len(values)), f"{percentile(values, 50):.2f}",
             f"{percentile(values, 99):.2f}", f"{max(values):.2f}",
             sparkline(list(values[-SPARK:])))
            for (switch, name), values in sorted(phase_ms.items(),
                                                 key=lambda i: (i[0][0], order[i[0][1]]))]


def _by_id(value: Any) -> int:
    """A row's place, newest first: by the id the daemon gave it (ids only grow)."""
    text = str(value)
    return int(text) if text.isdigit() else -1


class ReconfigurationsTab(Pane):
    """The latest reconfigurations, as the daemon records them (a latency measurement's
    included, with its progress shown above them while it runs)."""

    HELP = ("Per switch and phase: device (dispatched → acknowledged), "
            "switching (the command that moves the light → acknowledged; "
            "device but for a CALIENT's ENT-CRS), light (dispatched → light "
            "verified), software (requested → dispatched) "
            "and total: n, p50, p99, max and the last 60 as a sparkline. Below, "
            "recent reconfigurations, newest first: cause, outcome, pairs and phases. m "
            "starts a latency measurement (toggle, random, permutation or sweep) on a "
            "switch's free ports; its result stays in the panel above the tables until "
            "the next one.")
    KEYS_AT = "#reconf"

    def __init__(self) -> None:
        super().__init__("4 Reconfigurations", "reconfigurations")
        self.phase_ms: PhaseTimes = {}
        """(switch, phase) → the last KEEP reconfigurations' times."""
        self.recent: deque[dict[str, Any]] = deque(maxlen=KEEP)
        """The latest reconfigurations, oldest first (the rows of the table below)."""

    def compose(self) -> ComposeResult:
        yield ProgressBar(id="measure-progress", show_eta=True)
        yield Static("", id="measure-result")
        yield DataTable(id="latency", cursor_type="row")
        yield DataTable(id="reconf", zebra_stripes=True, cursor_type="row")

    def on_mount(self) -> None:
        self.query_one(ProgressBar).display = False
        self.query_one("#measure-result", Static).display = False
        self.query_one("#latency", DataTable).add_columns(
            "switch", "phase", "n", "p50 ms", "p99 ms", "max ms", "last 60")
        reconf = self.query_one("#reconf", DataTable)
        reconf.add_column("id", key="id")
        reconf.add_columns("switch", "cause", "outcome", "pairs", "device ms", "light ms",
                           "total ms")

    def show(self, rows: Iterable[dict[str, Any]]) -> None:
        """The picture anew from these reconfigurations, oldest first."""
        self.recent.clear()
        self.phase_ms.clear()
        for row in rows:
            self._keep(row)
        self.changed()

    def add(self, row: dict[str, Any]) -> None:
        """A new reconfiguration: its row added where the table is up to date."""
        self._keep(row)
        if self.in_view():
            self._draw(row)
        else:
            self.out_of_date = True

    def _keep(self, row: dict[str, Any]) -> None:
        record(self.phase_ms, row)
        self.recent.append(row)

    def draw(self) -> None:
        self._draw(None)

    def _draw(self, latest: dict[str, Any] | None) -> None:
        """The latency summary and the recent rows: only ``latest`` where given, else
        every row."""
        table = self.query_one("#reconf", DataTable)
        if latest is None:
            table.clear()
        for row in [latest] if latest is not None else self.recent:
            table.add_row(*reconfiguration_cells(row))
        while table.row_count > KEEP:
            table.remove_row(next(iter(table.rows)))  # the first added: the oldest
        # Newest first: the rows arrive oldest first, and the latest is what one looks for.
        table.sort("id", key=_by_id, reverse=True)
        latency = self.query_one("#latency", DataTable)
        latency.clear()
        for *cells, spark in latency_rows(self.phase_ms):
            latency.add_row(*cells, Text(spark, style="cyan"), key=f"{cells[0]}:{cells[1]}")

    def measured(self, plan: ReconfigPlan, rows: list[dict[str, Any]],
                 stopped: str | None = None) -> str:
        """Keep a measurement's result in its panel (until the next one); the headline."""
        ok = sum(1 for r in rows if r.get("outcome") == "ok")
        headline = (f"{plan.switch} {plan.pattern}: {len(rows)} reconfigurations "
                    f"({ok} ok)" + (f", stopped: {stopped}" if stopped else ""))
        text = Text.assemble(("last measurement  ", "bold"), headline)
        for r in summary(rows):
            text.append(f"\n  k={r['k']:<3} {r['span']:9} n={r['n']:<5} p50 {r['p50']:8.2f} ms"
                        f"   p99 {r['p99']:8.2f} ms   max {r['max']:8.2f} ms")
        if not rows:
            text.append("\n  no timed rows")
        panel = self.query_one("#measure-result", Static)
        panel.update(text)
        panel.display = True
        return headline

    async def measure(self, client: DaemonClient,
                      plan: ReconfigPlan) -> AsyncIterator[dict[str, Any]]:
        """Run a latency measurement with its progress bar showing: each reconfiguration
        as the campaign (labd.measure.campaign) makes it."""
        bar = self.query_one(ProgressBar)
        try:
            sizes = batch_sizes(plan, await free_ports(client, plan.switch))
            bar.update(total=planned(plan, sizes), progress=0)
            bar.display = True
            async for row in run_reconfig(client, plan):
                yield row
                bar.advance(1)
        finally:
            bar.display = False
