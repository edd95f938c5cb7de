"""What routes depend on: the daemon's services, read from the app's state (HTTP and
WebSocket alike), and, for every change, the bearer token."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, HTTPException
from starlette.requests import HTTPConnection

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


async def authorised(connection: HTTPConnection,
                     authorization: Annotated[str | None, Header()] = None) -> None:
    # The token from the state itself, not through get_services: every change passes here.
    expected = f"Bearer {connection.app.state.services.token}"
    if authorization is None or not secrets.compare_digest(authorization, expected):
        raise HTTPException(401, "a bearer token is required for changes: send "
                                 "'Authorization: Bearer <token>' (see labd run's report)")


#: For the ``dependencies`` of every route that changes something.
AUTHORISED = [Depends(authorised)]
