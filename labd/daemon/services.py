"""What the daemon's HTTP API and MQTT bridge are given to work with: the lab and the parts
that run it, not the daemon itself (``labd.daemon.core`` builds them and owns their
lifecycle). Routes read it from ``app.state.services`` (``labd.daemon.api.deps``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from labd.daemon.access import ApiSettings
from labd.events import EventHub
from labd.fabric.engine import Engine
from labd.ha.role import Role
from labd.hosts.jobs import JobManager
from labd.hosts.monitor import CommandQueues, HostMonitor
from labd.lab.loader import Lab
from labd.store.writer import Store


class Drills(Protocol):
    """What runs failover drills for the API, where the daemon's GPU hosts are emulated
    in its process (labd.emulation.drill.DrillService)."""

    def start(self, job: str | None, member: str | None, kind: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class Exposition(Protocol):
    """The daemon's figures in Prometheus' text format (labd.daemon.metrics)."""

    def expose(self) -> bytes: ...


@dataclass
class Services:
    lab: Lab
    engine: Engine
    hosts: HostMonitor
    jobs: JobManager
    hub: EventHub
    store: Store
    token: str
    """The daemon's own key (admin): its token file's, or, with an access file, one made
    for its in-process clients (emulated hosts, drills)."""
    commands: CommandQueues
    """Job commands for agents that poll the API (the lab has no broker)."""
    snapshot: Callable[[], dict[str, Any]]
    """The whole picture, as a WebSocket or MQTT session starts with it."""
    instruments_state: Callable[[], list[dict[str, Any]]]
    """Each instrument's driver, connection state and identity, in lab-file order."""
    api: ApiSettings = field(default_factory=ApiSettings)
    """Who may do what (roles, keys, open reads), the body limit, TLS."""
    metrics: Exposition | None = None
    """Its figures for ``GET /metrics``; None: a daemon that keeps none."""
    role: Role | None = None
    """Under ``--ha``: whether this daemon leads (labd.ha.role); None: it runs alone."""
    stopping: bool = False
    """Set as the daemon begins to stop: a request cut off then is answered 503 (the API's
    edge), not left to the server to log as an error."""
    drills: Drills | None = None
    """Set after start-up by whoever runs the lab's GPU hosts in emulation (drills need
    them); None: the API refuses drills."""
