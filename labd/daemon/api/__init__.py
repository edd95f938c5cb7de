"""The HTTP API under ``/v1`` and the WebSocket event stream: ``app.create_app`` builds it
from one router per resource (health, instruments, hosts and agents, switches and circuits,
jobs, drills, failovers, reconfigurations, events), the request bodies (``bodies``), the
answers' shapes (``shapes``), what routes depend on (``deps``) and the HTTP statuses of
labd's errors (``errors``)."""
