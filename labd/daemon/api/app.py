"""The HTTP API (``/v1``, OpenAPI at ``/openapi.json``) and the WebSocket event stream, put
together from one router per resource.

Reads are open; changes need ``Authorization: Bearer <token>``. Errors are JSON with a
``detail`` that says what was wrong: 404 unknown switch or port, 409 port busy, 422 bad body.
"""

from __future__ import annotations

from fastapi import FastAPI

from labd import __version__
from labd.daemon.api import (
    drills,
    errors,
    events,
    failovers,
    hosts,
    instruments,
    jobs,
    meta,
    reconfigurations,
    switches,
)
from labd.daemon.services import Services
from labd.lab.file import file_sha256

#: In the order requests are matched: the reconfiguration routes, the hot path, first.
ROUTERS = (switches, meta, instruments, hosts, jobs, drills, failovers, reconfigurations,
           events)


def create_app(services: Services) -> FastAPI:
    """The API on ``services`` (routes find them on ``app.state.services``)."""
    app = FastAPI(title="labd", version=__version__,
                  description="Control daemon for photonic ML-fabric testbeds")
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    app.state.services = services
    # Read once: the lab the daemon runs, even if the file is edited meanwhile.
    app.state.lab_sha256 = file_sha256(services.lab.source)
    return app
