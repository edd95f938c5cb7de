"""The Events tab: every event the daemon publishes, filterable."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Input, RichLog

from tui.tabs.pane import Pane

KEEP = 5000


class EventsTab(Pane):
    """The event log; it keeps the last KEEP lines, so a new filter shows them all again."""

    HELP = "Everything the daemon reports, newest last; / filters by kind or content."
    KEYS_AT = "#eventlog"

    def __init__(self) -> None:
        super().__init__("Events [5]", "events")
        self.lines: deque[tuple[str, Text]] = deque(maxlen=KEEP)
        self.wanted = ""
        """The filter, lower case."""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: kind or content (/ to focus)", id="event-filter")
        yield RichLog(id="eventlog", max_lines=KEEP, wrap=False)

    def add_event(self, event: dict[str, Any]) -> None:
        kind = event.get("kind", "")
        self.add(kind, Text.assemble((f"{event.get('seq', ''):>6} ", "dim"), (f"{kind:24}", "bold"),
                                     str(event.get("data", {}))[:200]))

    def add(self, kind: str, line: Text) -> None:
        self.lines.append((kind, line))
        # Not once the app is closing: the line is kept either way.
        if self._matches(line) and self.live():
            self.query_one(RichLog).write(line)

    def _matches(self, line: Text) -> bool:
        return not self.wanted or self.wanted in line.plain.lower()

    def focus_filter(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self) -> None:
        self.query_one(RichLog).focus()  # Enter: back to the log

    def on_input_changed(self, event: Input.Changed) -> None:
        self.wanted = event.value.strip().lower()
        log = self.query_one(RichLog)
        log.clear()
        for _, line in self.lines:
            if self._matches(line):
                log.write(line)
