"""A request the daemon's stop cuts off (its task cancelled once the stop's time is up) is
answered 503 by the API's edge, saying so, and ends there: left to the server, the
cancellation was an ERROR with a traceback in the log and a 500 to the client. A
cancellation while the daemon runs is passed on as it is."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from labd.daemon.access import Access
from labd.daemon.api.edge import Edge

SCOPE = {"type": "http", "method": "GET", "path": "/v1/health", "headers": [],
         "query_string": b"", "path_params": {}}


async def cut_off(stopping: bool) -> tuple[list[dict[str, Any]], BaseException | None]:
    under_way = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        under_way.set()
        await asyncio.Event().wait()  # a change on a switch that never answers

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    edge = Edge(app, routes=[], access=Access(), open_reads=True, max_body=1024,
                stopping=lambda: stopping)
    task = asyncio.create_task(edge.call(SCOPE, receive, send))
    await under_way.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError as exc:
        return sent, exc
    return sent, None


async def test_a_request_cut_off_by_the_stop_is_answered_503() -> None:
    sent, raised = await cut_off(stopping=True)
    assert raised is None
    assert sent[0]["status"] == 503
    assert "cut off" in json.loads(sent[1]["body"])["detail"]


async def test_a_cancellation_while_running_is_passed_on() -> None:
    sent, raised = await cut_off(stopping=False)
    assert isinstance(raised, asyncio.CancelledError) and sent == []


async def test_an_answer_already_begun_is_not_begun_again() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise asyncio.CancelledError

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if sent and message["type"] == "http.response.start":
            raise RuntimeError("Expected ASGI message 'http.response.body'")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    edge = Edge(app, routes=[], access=Access(), open_reads=True, max_body=1024,
                stopping=lambda: True)
    await edge.call(SCOPE, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start"]
