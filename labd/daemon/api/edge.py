"""The API's edge: every HTTP request and WebSocket passes here before any route sees it,
and before a byte of its body is read. In order:

1. the key: the route's role (``x-labd-role`` in its OpenAPI; reads need ``viewer``) against
   the bearer token's — 401 without a key or with an unknown one, 403 for a role too low;
   an agent's route (``x-labd-host``: ``/v1/agents/{host}/...``) takes that host's key or
   an admin key, and a host key takes nothing else;
2. the body: a ``Content-Length`` beyond the limit is 413 at once, a body that is not
   ``application/json`` 415, and the body is read counting its bytes (413 as soon as it
   passes the limit, never buffered whole), then refused 415 unless it is UTF-8 without a
   byte-order mark (the JSON parser would take UTF-16 and UTF-32 too), and 422 if it holds
   a number of more digits than Python reads (FastAPI would answer it 400).

A refusal closes the connection: what the client still sends is not read.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from labd.daemon.access import Access, Role, grants
from labd.daemon.api.bodies import MAX_INT
from labd.errors import NotLeader

#: Where the schema and its pages are served, and the liveness and readiness probes
#: (probes.py): open to all, they hold nothing of the lab's.
OPEN_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/healthz", "/readyz"})
#: Prometheus' scrape path, open unless the daemon is told otherwise (ApiSettings).
METRICS_PATH = "/metrics"
#: Methods whose requests carry no body here (one sent anyway is still counted).
BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
#: Methods that change nothing: what a standby (``--ha``) still answers.
READS = frozenset({"GET", "HEAD", "OPTIONS"})
BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
#: The most digits Python's JSON reads in an integer (int()'s guard against quadratic
#: conversion; 0: none), and a run of more, which only a body beyond it can hold.
DIGITS = sys.get_int_max_str_digits()
LONG_RUN = re.compile(rb"[0-9]{%d}" % (DIGITS + 1))

NO_KEY = ("a bearer token is required: send 'Authorization: Bearer <token>' with the "
          "daemon's token ($LABD_TOKEN or its token file, as labd run reports) or a key "
          "of its access file")
BAD_KEY = ("the bearer token is not one of the daemon's keys: send the daemon's token "
           "($LABD_TOKEN or its token file, as labd run reports) or a key of its access "
           "file")


def route_role(route: BaseRoute) -> Role:
    """The role a route needs (deps.OPERATOR, deps.ADMIN); reads need a viewer's."""
    extra = getattr(route, "openapi_extra", None) or {}
    role: Role = extra.get("x-labd-role", "viewer")
    return role


def route_host(route: BaseRoute, child: Scope) -> str | None:
    """For an agent's route (deps.AGENT), the host it speaks for, from its path."""
    extra = getattr(route, "openapi_extra", None) or {}
    param = extra.get("x-labd-host")
    if param is None:
        return None
    host = child.get("path_params", {}).get(param)
    return host if isinstance(host, str) else None


class Edge:
    """Pure ASGI middleware (module docstring); ``routes`` are the app's, to find the role
    a request needs before the app is called."""

    def __init__(self, app: ASGIApp, *, routes: list[BaseRoute], access: Access,
                 open_reads: bool, max_body: int, open_metrics: bool = False,
                 standby: Callable[[], NotLeader | None] | None = None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.app, self.routes, self.access = app, routes, access
        self.stopping = stopping
        """Whether the daemon is stopping: a request its stop cuts off is answered here."""
        self.standby = standby
        """Under ``--ha``: the refusal of a change while this daemon does not lead."""
        self.open_reads, self.max_body = open_reads, max_body
        self.open_paths = OPEN_PATHS | ({METRICS_PATH} if open_metrics else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.check_key(scope, headers)
        if refusal is not None:
            status, detail = refusal
            extra = {"www-authenticate": "Bearer"} if status == 401 else {}
            if scope["type"] == "websocket":
                await deny_socket(scope, send, status, detail)
            else:
                await answer(send, status, detail, extra)
            return
        if (self.standby is not None and scope["type"] == "http"
                and scope["method"] not in READS
                and (refused := self.standby()) is not None):
            await answer(send, 503, str(refused), leader_headers(refused))
            return
        if scope["type"] == "websocket" or (
                scope["method"] in BODILESS and not has_body(headers)):
            await self.call(scope, receive, send)
            return
        body = await self.read_body(headers, receive, send)
        if body is not None:
            await self.call(scope, replay(body, receive), send)

    async def call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app. A request the daemon's stop cuts off (it cancels what is still under way
        once its time is up) ends here: the server would log the cancellation as an ERROR
        with a traceback and answer 500."""
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.stopping():
                raise
            if scope["type"] == "http":
                # Unless the answer had begun (the server then refuses a second start).
                with contextlib.suppress(RuntimeError, OSError):
                    await answer(send, 503, "the daemon stopped while this request was "
                                            "under way: it was cut off, and what reached "
                                            "the switch is read back at its next start")

    def needed(self, scope: Scope) -> tuple[Role | None, str | None]:
        """The role a request needs (None where anyone may), and for an agent's route the
        host whose key may stand in for it."""
        if scope["path"] in self.open_paths:
            return None, None
        role: Role = "viewer"
        host: str | None = None
        partial: Role | None = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                role, host = route_role(route), route_host(route, child)
                # Kept in the scope, as Starlette's router keeps its match (the endpoint,
                # the path's parameters): the shortcut (shortcut.py) need not match again.
                scope.update(child)
                break
            if match is Match.PARTIAL and partial is None:
                partial = route_role(route)
        else:
            role = partial or "viewer"
        return (None if role == "viewer" and self.open_reads else role), host

    def check_key(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        needed, agent = self.needed(scope)
        if needed is None:
            return None
        token = bearer(headers)
        if token is None:
            return 401, NO_KEY
        held, host = self.access.holder(token)
        if held is None and host is None:
            return 401, BAD_KEY
        what = "the event stream" if scope["type"] == "websocket" else \
            f"{scope['method']} {scope['path']}"
        if agent is not None and host == agent:
            return None
        if agent is not None and held != "admin":
            this = f"host {host}'s key" if host is not None else f"{held}'s"
            return 403, (f"{what} takes host {agent}'s key or an admin key (this one is "
                         f"{this}): give the agent its own host key from the daemon's "
                         "access file (host = \"" + agent + "\")")
        if held is None:
            return 403, (f"{what}: a host key (host {host}'s) may use /v1/agents/{host}/* "
                         "and nothing else; use a key with a role for this")
        if not grants(held, needed):
            return 403, (f"{what} needs an {needed} key (this one is {held}'s): use a key "
                         f"of role {needed} or admin from the daemon's access file")
        return None

    async def read_body(self, headers: Headers, receive: Receive, send: Send
                        ) -> bytes | None:
        """The whole body, or None once a refusal has been sent (or the client left)."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await answer(send, 413, too_large(self.max_body))
            return None
        if has_body(headers):
            problem = media_problem(headers.get("content-type"))
            if problem is not None:
                await answer(send, 415, problem)
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await answer(send, 413, too_large(self.max_body))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and not utf8(body):
            await answer(send, 415, "a JSON body must be UTF-8, without a byte-order mark "
                                    "(UTF-16 and UTF-32 are refused)")
            return None
        if len(body) > DIGITS > 0 and too_long_number(body):
            await answer(send, 422, f"the body holds a number of more than {DIGITS} digits, "
                                    f"which is not read; the API's integers are at most "
                                    f"{MAX_INT}")
            return None
        return body


def bearer(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return "transfer-encoding" in headers or (length is not None and length != "0")


def media_problem(content_type: str | None) -> str | None:
    """Why a body of this Content-Type is refused; None for JSON in UTF-8."""
    media, *params = (content_type or "").split(";")
    if media.strip().lower() != "application/json":
        return (f"a body must be JSON, sent with 'Content-Type: application/json' "
                f"(not {content_type or 'none'!r})")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and \
                value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return f"a JSON body must be UTF-8, not {value.strip()!r}"
    return None


def utf8(body: bytes) -> bool:
    if body.startswith(BOMS) or b"\x00" in body[:4]:
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def too_long_number(body: bytes) -> bool:
    """Whether JSON's parser refuses ``body`` for an integer of too many digits (a long run
    of digits in a string is no number: parsed to tell)."""
    if LONG_RUN.search(body) is None:
        return False
    try:
        json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return False  # answered by the app as any body that is not JSON
    except ValueError:
        return True
    return False


def too_large(limit: int) -> str:
    return (f"the body is larger than the daemon takes ({limit} bytes; labd run "
            "--max-body sets it)")


def replay(body: bytes, receive: Receive) -> Receive:
    """The body, read already, as the app asks for it; then the client's own messages (a
    disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


async def answer(send: Send, status: int, detail: str,
                 headers: dict[str, str] | None = None) -> None:
    """A refusal as the API's errors look (``{"detail": ...}``); the connection closes after
    it, so that a body not read is not read later either (the server stops reading it at
    once: server.py; a client sending a large body should ask ``Expect: 100-continue``, and
    so hear the refusal before it sends)."""
    content = json.dumps({"detail": detail}).encode()
    raw: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(content)),
        (b"connection", b"close"),
        *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


def leader_headers(refused: NotLeader) -> dict[str, str]:
    """Where the leader answers, for a client that follows it (``x-labd-leader``)."""
    return {"x-labd-leader": refused.leader_url} if refused.leader_url else {}


async def deny_socket(scope: Scope, send: Send, status: int, detail: str) -> None:
    """Refuse a WebSocket before it is accepted: an HTTP answer where the server can send
    one, else a close (the client sees 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        content = json.dumps({"detail": detail}).encode()
        headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json"),
                                              (b"content-length", b"%d" % len(content))]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        message: dict[str, Any] = {"type": "websocket.http.response.start",
                                   "status": status, "headers": headers}
        await send(message)
        await send({"type": "websocket.http.response.body", "body": content})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
