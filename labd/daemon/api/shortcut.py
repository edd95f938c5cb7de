"""The reconfiguration routes, the API's hot path, answered without FastAPI's per-request
machinery when their body is valid.

A request to one of them (``SHORTCUTS`` in switches.py) has passed the edge (its key, its
body's size and encoding) and its body is read. Here the body is parsed and validated as
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.routing import BaseRoute, Match
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
    """Pure ASGI middleware, inside the edge: ``routes`` are the app's routes that have a
    shortcut, each with it."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[tuple[BaseRoute, Shortcut]]) -> None:
        self.app, self.routes = app, list(routes)

    def matched(self, scope: Scope) -> tuple[Shortcut, Scope] | None:
        """The shortcut of the route ``scope`` asks for, with the route's child scope (its
        path's parameters); None where it asks for another."""
        for route, shortcut in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                return shortcut, child
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.matched(scope) if scope["type"] == "http" and \
            scope["method"] in ("POST", "PUT") else None
        if found is None:
            await self.app(scope, receive, send)
            return
        shortcut, child = found
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
            result = await shortcut.call(engine, child["path_params"]["switch"], parsed)
        except ANSWERED as exc:
            await error_response(exc)(scope, receive, send)
            return
        await JSONResponse(result.as_dict())(scope, receive, send)
