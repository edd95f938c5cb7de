"""What routes depend on: the daemon's services, read from the app's state (HTTP and
WebSocket alike); and what each route needs of the caller's key (checked at the edge, before
the route is called)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends
from starlette.requests import HTTPConnection

from labd.daemon.access import Role
from labd.daemon.services import Services


# async: a plain function would be run in a worker thread on every request
async def get_services(connection: HTTPConnection) -> Services:
    """The services ``create_app`` put on the app's state."""
    services: Services = connection.app.state.services
    return services


def lab_sha256(connection: HTTPConnection) -> str:
    """The SHA-256 of the lab file as the daemon read it at start-up."""
    digest: str = connection.app.state.lab_sha256
    return digest


ServicesDep = Annotated[Services, Depends(get_services)]


def needs(role: Role) -> dict[str, Any]:
    """A route decorator's arguments for a route that needs ``role``: the edge (edge.py)
    checks it before the body is read, and the OpenAPI tells it as ``x-labd-role``."""
    return {"openapi_extra": {"x-labd-role": role}}


#: Changes to switches and circuits.
OPERATOR = needs("operator")
#: Jobs, spares, recoveries' decisions and drills.
ADMIN = needs("admin")
#: An agent's messages and command polls, ``/v1/agents/{host}/...``: that host's key (an
#: access file's ``host = "..."`` key) or an admin key; any other key may not speak for a
#: host (an operator could otherwise fake a GPU failure and start a failover).
AGENT: dict[str, Any] = {"openapi_extra": {"x-labd-role": "admin", "x-labd-host": "host"}}
