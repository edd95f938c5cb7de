"""The reconfiguration routes, the API's hot path, answered without FastAPI's per-request
machinery when their body is valid.

A request to one of them (``SHORTCUTS`` in switches.py) has passed the edge (its key, its
body's size and encoding; the edge's match of its route is kept in the scope) and its body
is read. Here the body is parsed and validated as
FastAPI would (``json.loads``, then the route's model from Python objects), the route's own
call is made, and its result is answered as the route answers it (the same JSONResponse).
Anything else goes on to the app: a body that does not parse or validate (FastAPI then
answers it as it answers every bad body, 422 in its words), and every other route. An error
is answered by the app's own handler for it (errors.py); one it has none for is the 500 of
the app's outer middleware, as from the route.

What is skipped, and measured (docs/benchmarks.md): routing the request a second time,
solving its dependencies, FastAPI's request objects and its exception and exit-stack
layers, about a tenth of a millisecond per request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from labd.daemon.api.edge import replay
from labd.daemon.api.errors import ANSWERED, error_response
from labd.fabric.engine import Engine, Result

__all__ = ["Shortcut", "Shortcuts"]


@dataclass(frozen=True)
class Shortcut:
    """A route's body model and what it does: ``call(engine, switch, body)``."""

    model: type[BaseModel]
    call: Callable[[Engine, str, Any], Awaitable[Result]]


class Shortcuts:
    """Pure ASGI middleware, inside the edge, which has matched the request's route and
    kept its endpoint and path parameters in the scope: ``shortcuts`` by endpoint."""

    def __init__(self, app: ASGIApp, *,
                 shortcuts: Mapping[Callable[..., Any], Shortcut]) -> None:
        self.app, self.shortcuts = app, dict(shortcuts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = scope.get("endpoint") if scope["type"] == "http" else None
        shortcut = self.shortcuts.get(endpoint) if endpoint is not None else None
        if shortcut is None:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            parsed = shortcut.model.model_validate(json.loads(body), from_attributes=True)
        except Exception:  # whatever it is, the app answers it in its own words
            await self.app(scope, replay(body, receive), send)
            return
        engine: Engine = scope["app"].state.services.engine
        try:
            result = await shortcut.call(engine, scope["path_params"]["switch"], parsed)
        except ANSWERED as exc:
            await error_response(exc)(scope, receive, send)
            return
        await JSONResponse(result.as_dict())(scope, receive, send)
