"""The HTTP API (``/v1``, OpenAPI at ``/openapi.json``) and the WebSocket event stream, put
together from one router per resource.

Every request needs ``Authorization: Bearer <token>`` with a key whose role grants the
route's (``x-labd-role``: reads ``viewer``, changes ``operator``, jobs and drills ``admin``),
checked at the edge before the body is read (edge.py); reads may be opened to all. Errors
are JSON with a ``detail`` that says what was wrong: 401 no key or an unknown one, 403 a
role too low, 404 unknown switch or port, 409 port busy, 413 body too large, 415 not UTF-8
JSON, 422 bad body; a request that is not well-formed HTTP is the HTTP server's 400, in
plain text.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from labd import __version__
from labd.daemon.access import Access
from labd.daemon.api import (
    cabling,
    drills,
    errors,
    events,
    failovers,
    holds,
    hosts,
    instruments,
    jobs,
    meta,
    meters,
    metrics,
    probes,
    reconfigurations,
    switches,
)
from labd.daemon.api.edge import Edge
from labd.daemon.api.shortcut import Shortcuts
from labd.daemon.services import Services
from labd.lab.loader import file_sha256

#: In the order requests are matched: the reconfiguration routes, the hot path, first.
ROUTERS = (switches, meta, instruments, hosts, jobs, drills, failovers, reconfigurations,
           events, metrics, cabling, meters, holds, probes)


def create_app(services: Services) -> FastAPI:
    """The API on ``services`` (routes find them on ``app.state.services``)."""
    app = FastAPI(title="labd", version=__version__,
                  description="Control daemon for photonic ML-fabric testbeds")
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    app.state.services = services
    app.state.unsure = meta.Unsure(services)
    settings = services.api
    access = settings.access or Access()
    if services.token:
        access = access.with_token(services.token)
    open_reads = settings.reads_open()
    # The edge's own: a route's role must be known before its body is read.
    # The routers' own routes (included without a prefix, so their paths are the app's):
    # the app's own list holds the included routers, not their routes.
    routes = [route for module in ROUTERS for route in module.router.routes]
    # Inside the edge (added first): what reaches a shortcut has passed the edge's checks.
    app.add_middleware(Shortcuts, shortcuts=switches.SHORTCUTS)
    app.add_middleware(Edge, routes=routes, access=access,
                       open_reads=open_reads, max_body=settings.max_body,
                       open_metrics=settings.open_metrics,
                       standby=services.role.refused if services.role is not None else None,
                       stopping=lambda: services.stopping)
    app.openapi = lambda: _openapi(app, open_reads)  # type: ignore[method-assign]
    # Read once: the lab the daemon runs, even if the file is edited meanwhile.
    app.state.lab_sha256 = file_sha256(services.lab.source)
    return app


ERROR = {"content": {"application/json": {"schema": {
    "type": "object", "properties": {"detail": {"type": "string"}},
    "required": ["detail"]}}}}
#: The edge's answers, which every operation may give (a role too low, a body refused).
EDGE_RESPONSES = {
    "401": {"description": "no bearer token, or one that is not a key of the daemon's"},
    "403": {"description": "the key's role does not grant the route's (x-labd-role)"},
}
#: What the HTTP server answers, before labd reads the request, to one that is not HTTP it
#: can parse (a ``Transfer-Encoding`` it does not know, a header name with a space): any
#: operation may meet it, and its body is the server's line of plain text.
MALFORMED = {"400": {"description": "the request is not well-formed HTTP (answered by the "
                                    "HTTP server, in plain text)",
                     "content": {"text/plain": {"schema": {"type": "string"}}}}}
#: labd's errors (errors.py), where an operation may meet them: a thing the lab lacks, a
#: clash, an instrument that failed or is offline.
NOT_FOUND = {"404": {"description": "the path names something the lab does not have"}}
DEVICE_RESPONSES = {
    "502": {"description": "the instrument failed"},
    "503": {"description": "the switch is offline (reconnecting); nothing was sent"},
}
CHANGE_RESPONSES = {
    **NOT_FOUND, **DEVICE_RESPONSES,
    "409": {"description": "it clashes with what is going on (a port in use, a job's "
                           "state, a drill)"},
}
BODY_RESPONSES = {
    "413": {"description": "the body is larger than the daemon takes (--max-body)"},
    "415": {"description": "the body is not JSON in UTF-8 (Content-Type: application/json)"},
}


def _openapi(app: FastAPI, open_reads: bool) -> dict[str, Any]:
    """FastAPI's schema, plus who may call each operation: its ``x-labd-role``, the bearer
    scheme, and the edge's refusals."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = FastAPI.openapi(app)
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            role = operation.setdefault("x-labd-role", "viewer")
            responses = operation.setdefault("responses", {})
            responses.update(MALFORMED)
            if role != "viewer" or not open_reads:
                operation["security"] = [{"bearer": []}]
                for code, what in EDGE_RESPONSES.items():
                    responses.setdefault(code, {**what, **ERROR})
            errors = dict(NOT_FOUND) if "{" in path else {}
            if path.startswith("/v1/switches/"):
                errors |= DEVICE_RESPONSES
            if method in ("post", "put", "patch"):
                errors |= CHANGE_RESPONSES | BODY_RESPONSES
            for code, what in errors.items():
                responses.setdefault(code, {**what, **ERROR})
    app.openapi_schema = schema
    return schema
