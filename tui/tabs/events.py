"""The Events tab: every event the daemon publishes, a sentence each with the wall-clock
time it arrived, filterable."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Input, RichLog

from tui.sentences import sentence
from tui.tabs.pane import Pane

KEEP = 5000


class EventsTab(Pane):
    """The event log; it keeps the last KEEP lines, so a new filter shows them all again."""

    HELP = ("Everything the daemon reports, a sentence each, newest last (the log follows "
            "the latest), with the local time it arrived. / filters: words in the sentence "
            "or the kind (reconfiguration, failover, drill, job., host., gpu., nic., "
            "instrument., drift, warning); Enter returns to the log.")
    KEYS_AT = "#eventlog"

    def __init__(self) -> None:
        super().__init__("5 Events", "events")
        self.lines: deque[tuple[str, Text]] = deque(maxlen=KEEP)
        self.wanted = ""
        """The filter, lower case."""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: kind or content (/ to focus)", id="event-filter")
        yield RichLog(id="eventlog", max_lines=KEEP, wrap=False)

    def add_event(self, event: dict[str, Any], at: float | None = None) -> None:
        """An event from the stream; ``at``: when it arrived (wall clock, now by default:
        the event's own stamp is the daemon's monotonic clock, which means nothing here)."""
        kind = str(event.get("kind", ""))
        data = event.get("data")
        said = sentence(kind, data if isinstance(data, dict) else {"data": data})
        self.add(kind, Text(said[:2000]), at)

    def add(self, kind: str, line: Text, at: float | None = None) -> None:
        """A line for the log, after the time and the kind."""
        stamp = time.time() if at is None else at
        clock = time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{int(stamp % 1 * 1000):03d}"
        line = Text.assemble((f"{clock} ", "dim"), (f"{kind:16} ", "bold"), line)
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
