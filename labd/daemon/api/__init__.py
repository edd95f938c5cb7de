"""The HTTP API under ``/v1`` and the WebSocket event stream: ``app.create_app`` builds it
from one router per resource (health, instruments, hosts and agents, switches and circuits,
jobs, drills, failovers, reconfigurations, events), the request bodies (``bodies``), the
answers' shapes (``shapes``), what routes depend on (``deps``) and the HTTP statuses of
labd's errors (``errors``)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "app", "bodies", "cabling", "deps", "drills", "edge", "errors", "events", "failovers", "hosts",
    "instruments", "jobs", "meta", "metrics", "reconfigurations", "shapes", "shortcut", "switches"
]
