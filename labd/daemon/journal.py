"""The daemon's WARNING lines for whoever reads its journal: one as an instrument goes
offline and one as it is back, one as a GPU host is lost and one as it is back, one as a
failover starts and one with its outcome.

They are read off the event stream (an observer: it cannot fall behind, and costs the
publisher a dict lookup for every other kind), so each line says what the stream says,
once, whichever part noticed. The default level is ``warning``: without these an outage
left nothing in the journal (the link's own lines are INFO, for ``-v``). Lines about the
same thing go through the one limiter (labd.repeats): a switch that flaps, or a thousand
hosts lost at once, is a few lines and a count of those held back, not a flood.

The broker link (labd.daemon.bus) and a leadership change (labd.ha.leadership) log their
own WARNING lines, where the reason is known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from labd.events import Event, EventHub
from labd.repeats import Repeats

__all__ = ["Journal"]

log = logging.getLogger(__name__)

#: Link states in which an instrument takes no command (``closed``: the daemon stops it).
DOWN = frozenset({"connecting", "backoff", "offline"})
#: A failover's outcomes while it has not ended.
UNDER_WAY = frozenset({"in-progress", "awaiting-operator"})


class Journal:
    """Observes ``hub`` and logs the changes an operator must hear of (module docstring)."""

    def __init__(self, hub: EventHub, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._repeats = Repeats(clock=clock)
        self._online: set[str] = set()
        self._down_since: dict[str, float] = {}
        self._lost_since: dict[str, float] = {}
        self._failovers: set[tuple[str, str, str]] = set()
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "instrument.state": self._instrument, "host.lost": self._host_lost,
            "host.status": self._host_status, "failover": self._failover}
        hub.observe(self.observe)

    def observe(self, event: Event) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event.data)

    def _say(self, key: str, message: str, *args: Any, **fields: str) -> None:
        told = self._repeats.tell(key)
        if told is not None:
            log.warning(message + "%s", *args, told.suffix(), extra=fields)

    def _instrument(self, data: dict[str, Any]) -> None:
        name, state = str(data.get("instrument")), data.get("state")
        now = self._clock()
        if state == "online":
            since = self._down_since.pop(name, None)
            if since is not None:
                self._say(f"instrument:{name}:back", "%s: back online after %.1f s", name,
                          now - since, instrument=name)
            self._online.add(name)
        elif state in DOWN and name in self._online:
            self._online.discard(name)
            self._down_since[name] = now
            detail = str(data.get("detail") or "").strip()
            self._say(f"instrument:{name}:offline", "%s: offline (%s); the daemon "
                      "reconnects by itself", name, detail or state, instrument=name)
        elif state == "closed":
            self._online.discard(name)
            self._down_since.pop(name, None)

    def _host_lost(self, data: dict[str, Any]) -> None:
        host = str(data.get("host"))
        self._lost_since.setdefault(host, self._clock())
        self._say(f"host:{host}:lost", "host %s: %s (was %s)", host, data.get("status"),
                  data.get("was"), host=host)

    def _host_status(self, data: dict[str, Any]) -> None:
        host = str(data.get("host"))
        if data.get("status") != "online":
            return
        since = self._lost_since.pop(host, None)
        if since is not None:
            self._say(f"host:{host}:back", "host %s: back online after %.1f s", host,
                      self._clock() - since, host=host)

    def _failover(self, data: dict[str, Any]) -> None:
        job, member = str(data.get("job")), str(data.get("member"))
        key = (job, member, str(data.get("trigger")))
        outcome = str(data.get("outcome"))
        if outcome in UNDER_WAY:
            if key not in self._failovers:
                self._failovers.add(key)
                self._say(f"failover:{job}:start", "job %s: failover started: member %s "
                          "(%s, host %s)", job, member, key[2], data.get("host"), job=job)
            return
        self._failovers.discard(key)
        detail = str(data.get("detail") or "").strip()
        self._say(f"failover:{job}:end", "job %s: failover of member %s ended: %s%s", job,
                  member, outcome, f" ({detail})" if detail else "", job=job)
