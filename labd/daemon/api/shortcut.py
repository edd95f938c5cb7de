"""The reconfiguration routes answered past FastAPI's per-request machinery when their body
is valid (docs/benchmarks.md, "Rooms around a library").

A request the edge has matched to one of them (``SHORTCUTS`` in switches.py) has its body
parsed and validated as FastAPI would, the route's own call made, and its result answered as
the route answers it. A body that does not parse or validate, and every other route, go on
to the app, which answers them in its own words."""

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
