"""What the daemon knows of one GPU host: its status, its last heartbeat, its GPUs and NICs,
and its clock's offset from the daemon's; its JSON for ``GET /v1/hosts`` is kept between
changes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from labd.hostwire import GpuVerdict, RunState

STATUSES = ("online", "offline", "lost", "unknown")


@dataclass
class HostState:
    id: str
    status: str = "unknown"  # online, offline, lost, unknown
    last_beat_ns: int | None = None
    """When the last heartbeat arrived (daemon clock)."""
    last_sent_ns: int | None = None
    """When the agent sent it, on the daemon's clock (see ``offset_ns``)."""
    interval_s: float | None = None
    gpus: list[GpuVerdict] = field(default_factory=list)
    nics: dict[str, bool] = field(default_factory=dict)
    nic_since_ns: dict[str, int] = field(default_factory=dict)
    """When each NIC's link last changed, by the agent's clock."""
    error: str | None = None
    jobs: list[RunState] | None = None
    """Each job's latest run on the host, from its last heartbeat that said (None: its
    agent does not say)."""
    jobs_sent_ns: int | None = None
    """When that heartbeat was sent (daemon clock): an agent says its runs in some
    heartbeats only."""
    heard: set[tuple[str, str, int, str]] = field(default_factory=set)
    """(job, run, rank, progress) the daemon was told of, by an event or a heartbeat, for
    the runs the host's heartbeats list: what a heartbeat tells again is not news."""
    offset_ns: int | None = None
    """Daemon clock minus the agent's, at most: the smallest (received - sent) seen. Agents
    stamp what they observe on their own CLOCK_MONOTONIC, which another machine does not
    share; this puts those moments on the daemon's clock (late by the fastest delivery)."""
    version: int = 0
    """Bumped by every change ``as_dict`` shows, but the heartbeat's stamp."""
    slow_ns: int = 0
    """How late its heartbeats have been arriving lately (halved at each new one)."""
    deaf_mark_ns: int = 0
    """The watchdog's deaf clock (:attr:`HostMonitor.deaf_ns`) at its last heartbeat."""
    _json: tuple[tuple[Any, ...], bytes, bytes] | None = field(default=None, repr=False)

    def to_daemon_clock(self, agent_ns: Any) -> int | None:
        if not isinstance(agent_ns, int):
            return None
        return agent_ns + (self.offset_ns or 0)

    def _saw(self, sent_ns: Any) -> None:
        if isinstance(sent_ns, int):
            lag = time.monotonic_ns() - sent_ns
            self.offset_ns = lag if self.offset_ns is None else min(self.offset_ns, lag)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "last_beat_ns": self.last_beat_ns,
                "interval_s": self.interval_s, "gpus": self.gpus, "nics": self.nics,
                "error": self.error}

    def json_parts(self) -> tuple[bytes, bytes, bytes]:
        """``as_dict`` as JSON, in three parts to be joined, from what is kept since the
        last change: at thousands of hosts, ``GET /v1/hosts`` is then one join, not a
        serialisation of the fleet."""
        key = (self.version, self.status, self.interval_s, self.error, id(self.gpus),
               id(self.nics))
        if self._json is None or self._json[0] != key:
            head = f'{{"id": {json.dumps(self.id)}, "status": {json.dumps(self.status)}, ' \
                   '"last_beat_ns": '
            tail = (f', "interval_s": {json.dumps(self.interval_s)}, "gpus": '
                    f'{json.dumps(self.gpus)}, "nics": {json.dumps(self.nics)}, '
                    f'"error": {json.dumps(self.error)}}}')
            self._json = (key, head.encode(), tail.encode())
        stamp = b"null" if self.last_beat_ns is None else str(self.last_beat_ns).encode()
        return self._json[1], stamp, self._json[2]

    def as_json(self) -> bytes:
        """``as_dict`` as JSON."""
        return b"".join(self.json_parts())

    def gpu_health(self, index: int) -> str | None:
        """The GPU's latest verdict from the heartbeats, if reported."""
        return next((g.get("health") for g in self.gpus if g.get("index") == index), None)

