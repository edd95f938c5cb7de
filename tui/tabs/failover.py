"""The Failover tab: the latest recovery's timeline, stage by stage."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import DataTable, Label

from labd.vocabulary import STAGES
from tui.render import local_time
from tui.tabs.pane import Pane


class FailoverTab(Pane):
    """The latest failover as the daemon last told it, filled in as its stages arrive."""

    HELP = ("The latest recovery, stage by stage as it happens, in ms after the failure: "
            "failure → reported → detected → spare chosen → switches acknowledged → "
            "light verified → links up → job restarted → collectives ready → first step. "
            "d runs a failover drill: a member's GPU fails, the daemon swaps a spare in, "
            "then the member is repaired and returned to the spares.")
    KEYS_AT = "#timeline"

    def __init__(self) -> None:
        super().__init__("3 Failover", "failover")
        self.latest: dict[str, Any] | None = None
        self.drill_off: str | None = None
        """Why d cannot run a drill on this daemon, if it cannot."""

    def compose(self) -> ComposeResult:
        yield Label("no failover yet", id="failover-title")
        yield DataTable(id="timeline", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("stage", "ms after failure")

    def show(self, timeline: dict[str, Any] | None) -> None:
        self.latest = timeline
        self.changed()

    def draw(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        title = self.query_one("#failover-title", Label)
        t = self.latest
        if t is None:
            title.update("no failover yet (d runs a drill where the hosts are emulated)"
                         if self.drill_off is None else
                         f"no failover yet; d is off here: {self.drill_off}")
            return
        plan = t.get("plan") or {}
        # A recovery is numbered when the daemon records it, at its end (or when it waits
        # for the operator): until then its events carry no id.
        number = f"#{t['id']}" if t.get("id") is not None else "(in progress, not yet recorded)"
        when = ""
        if t.get("wall_time"):
            when = " at " + local_time(str(t["wall_time"]))
        title.update(f"failover {number}{when} · job {t['job']}: {t.get('trigger')} on "
                     f"{t['member']} → {plan.get('spare', 'no spare')}: {t['outcome']} "
                     f"{t.get('detail') or ''}".rstrip())
        offsets = t.get("since_failure_ms", {})
        for stage in in_time_order(offsets):
            value = offsets.get(stage)
            table.add_row(stage, "…" if value is None else f"{value:.2f}", key=stage)


def in_time_order(offsets: dict[str, float | None]) -> list[str]:
    """The stages as they happened: by their time after the failure, those not reached
    last, in their usual order (labd.vocabulary.STAGES). Stages overlap: the light can be
    verified before the last switch acknowledges, and a table in the usual order then
    reads backwards in time."""
    order = {stage: i for i, stage in enumerate(STAGES)}
    known = [*STAGES, *sorted(set(offsets) - set(STAGES))]
    return sorted(known, key=lambda s: (offsets.get(s) is None, offsets.get(s) or 0.0,
                                        order.get(s, len(order))))
