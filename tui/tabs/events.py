"""The Events tab: every event the daemon publishes, a sentence each with the wall-clock
time it happened, filterable; it opens on the lab's recent history, and shows each event
once."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Iterable
from datetime import datetime
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.events import Resize
from textual.widgets import Input, RichLog

from tui.sentences import sentence
from tui.tabs.pane import Pane

KEEP = 5000


class Wanted:
    """A filter's words: each plain word must be in the line (its kind included); a word
    after ``-`` must not (``-job.progress`` hides the progress lines, ``-job.`` every
    job's)."""

    def __init__(self, typed: str) -> None:
        words = typed.lower().split()
        self.shown = [w for w in words if not w.startswith("-")]
        self.hidden = [w[1:] for w in words if w.startswith("-") and len(w) > 1]

    def __bool__(self) -> bool:
        return bool(self.shown or self.hidden)

    def __call__(self, kind: str, plain: str) -> bool:
        kind, plain = kind.lower(), plain.lower()
        if any(kind.startswith(w) or w in plain for w in self.hidden):
            return False
        return all(w in plain for w in self.shown)


def wall_stamp(value: Any) -> float | None:
    """An ISO 8601 time from the API (a record's ``wall_time``) as a Unix time."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


class EventLog(RichLog):
    """The log: each line wrapped at the log's width (an 80-column terminal sees the
    whole sentence), and written again when that width changes."""

    def __init__(self) -> None:
        super().__init__(id="eventlog", max_lines=KEEP, wrap=True)
        self.drawn_width = 0

    def put(self, line: Text) -> None:
        width = self.scrollable_content_region.width
        self.write(line, width=width if width > 0 else None)

    def on_resize(self, event: Resize) -> None:
        super().on_resize(event)
        width = self.scrollable_content_region.width
        if width and width != self.drawn_width:
            self.drawn_width = width
            self.query_ancestor(EventsTab).changed()


class EventsTab(Pane):
    """The event log. It keeps the last KEEP lines, so a new filter shows them all again;
    an event met twice (a resync's history, then the stream) is shown once."""

    HELP = ("Everything the daemon reports, a sentence each, newest last (the log follows "
            "the latest), with the local time it happened; it opens on the lab's recent "
            "reconfigurations and latest failover. / filters: words that must be in the "
            "sentence or the kind (reconfiguration, failover, drill, job., host., gpu., "
            "nic., instrument., drift, warning), and words after - that must not: "
            "-job.progress hides the progress lines. Enter returns to the log.")
    KEYS_AT = "#eventlog"

    def __init__(self) -> None:
        super().__init__("5 Events", "events")
        self.lines: deque[tuple[float, str, Text]] = deque(maxlen=KEEP)
        """(when, kind, line), oldest first."""
        self.wanted = Wanted("")
        self._seen: set[Hashable] = set()
        self._seen_order: deque[Hashable] = deque()
        self._last_seq = 0

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: words, -kind hides (/ to focus)", id="event-filter")
        yield EventLog()

    # -- what comes in ----------------------------------------------------------------------
    def add_event(self, event: dict[str, Any], at: float | None = None) -> None:
        """An event from the stream; ``at``: when it arrived (wall clock, now by default:
        the event's own stamp is the daemon's monotonic clock, which means nothing here).
        One met before (by its sequence number, or the record it tells of) is left out."""
        kind = str(event.get("kind", ""))
        data = event.get("data")
        data = data if isinstance(data, dict) else {"data": data}
        seq = event.get("seq")
        if isinstance(seq, int):
            self._last_seq = max(self._last_seq, seq)
        if not self._first(self._keys(kind, data, seq)):
            return
        self.add(kind, Text(sentence(kind, data)[:2000]), at)

    def backlog(self, seq: Any, reconfigurations: Iterable[dict[str, Any]],
                failovers: Iterable[dict[str, Any]]) -> None:
        """What happened before the UI attached (a snapshot's history, newest first, as the
        API lists it), each at the wall time the daemon recorded, in time order among the
        lines already shown. ``seq``: the snapshot's last event; a lower one than any met
        means a new daemon, whose numbers start again."""
        if isinstance(seq, int) and seq < self._last_seq:
            self._forget_seqs()
        self._last_seq = seq if isinstance(seq, int) else self._last_seq
        added = False
        for kind, rows in (("reconfiguration", reconfigurations), ("failover", failovers)):
            for row in reversed(list(rows)):  # oldest first: ties keep that order
                if not self._first(self._keys(kind, row, None)):
                    continue
                stamp = wall_stamp(row.get("wall_time")) or time.time()
                self.lines.append((stamp, kind, self._line(kind, Text(sentence(kind, row)),
                                                           stamp)))
                added = True
        if added:
            ordered = sorted(self.lines, key=lambda line: line[0])  # stable: ties as met
            self.lines.clear()
            self.lines.extend(ordered)
            self.changed()

    def add(self, kind: str, line: Text, at: float | None = None) -> None:
        """A line for the log, after the time and the kind."""
        stamp = time.time() if at is None else at
        text = self._line(kind, line, stamp)
        self.lines.append((stamp, kind, text))
        # Only the tab in view writes: a hidden log is drawn whole when next shown.
        if self.in_view():
            if self.wanted(kind, text.plain):
                self.query_one(EventLog).put(text)
        else:
            self.out_of_date = True

    @staticmethod
    def _line(kind: str, line: Text, stamp: float) -> Text:
        clock = time.strftime("%H:%M:%S", time.localtime(stamp)) + \
            f".{int(stamp % 1 * 1000):03d}"
        return Text.assemble((f"{clock} ", "dim"), (f"{kind:16} ", "bold"), line)

    # -- once each --------------------------------------------------------------------------
    @staticmethod
    def _keys(kind: str, data: dict[str, Any], seq: Any) -> list[Hashable]:
        """What makes an event the one met before: its number in the stream, and for a
        record the API also lists, what the record says: a reconfiguration by its id, a
        recorded failover by its id, outcome and the stages it reached (its events go on
        telling the same recovery as it moves on)."""
        keys: list[Hashable] = []
        if isinstance(seq, int):
            keys.append(("seq", seq))
        if data.get("id") is None:
            return keys
        if kind == "reconfiguration":
            keys.append((kind, data["id"]))
        elif kind == "failover":
            offsets = data.get("since_failure_ms") or {}
            keys.append((kind, data["id"], data.get("outcome"),
                         tuple(sorted(k for k, v in offsets.items() if v is not None))))
        return keys

    def _first(self, keys: list[Hashable]) -> bool:
        """None of ``keys`` met yet: remember them (the latest few thousand)."""
        if any(key in self._seen for key in keys):
            return False
        for key in keys:
            self._seen.add(key)
            self._seen_order.append(key)
        while len(self._seen_order) > 4 * KEEP:
            self._seen.discard(self._seen_order.popleft())
        return True

    def _forget_seqs(self) -> None:
        kept = [key for key in self._seen_order if not (isinstance(key, tuple) and
                                                        key[0] == "seq")]
        self._seen = set(kept)
        self._seen_order = deque(kept)

    # -- drawing ----------------------------------------------------------------------------
    def draw(self) -> None:
        log = self.query_one(EventLog)
        log.clear()
        for _, kind, line in self.lines:
            if self.wanted(kind, line.plain):
                log.put(line)

    def shown(self) -> list[str]:
        """The lines the log shows now, as text (tests read it)."""
        return [line.plain for _, kind, line in self.lines if self.wanted(kind, line.plain)]

    def focus_filter(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self) -> None:
        self.query_one(EventLog).focus()  # Enter: back to the log

    def on_input_changed(self, event: Input.Changed) -> None:
        self.wanted = Wanted(event.value)
        self.changed()
