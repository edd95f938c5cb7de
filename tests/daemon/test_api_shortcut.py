"""The reconfiguration routes' shortcut (labd/daemon/api/shortcut.py) answers as the routes
themselves do: the same status, body and headers for every request, valid or not; and it is
what serves a valid one (FastAPI's routing is not reached)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from labd.daemon.api.app import create_app
from labd.daemon.api.shortcut import Shortcuts
from labd.emulation.rig import Rig
from tests.daemon.test_api_edge import BODY
from tests.labs import switch
from tests.rigs import AUTH, StartRig

ROUTES = [("POST", "/v1/switches/{}/connections"), ("PUT", "/v1/switches/{}/connections"),
          ("POST", "/v1/switches/{}/disconnect")]


def without_shortcuts(rig: Rig) -> FastAPI:
    """The same API on the same daemon, every request routed by FastAPI."""
    app = create_app(rig.daemon.services)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not Shortcuts]
    return app


@pytest.fixture
async def both(start_rig: StartRig) -> AsyncIterator[tuple[Rig, httpx.AsyncClient,
                                                           httpx.AsyncClient]]:
    async with start_rig("shortcut", switch(size="16x16", technology="ideal"),
                         token="t") as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as short, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=without_shortcuts(rig)),
                              base_url="http://labd", headers=AUTH) as routed:
        yield rig, short, routed


def answer(response: httpx.Response) -> tuple[int, str | None, Any]:
    return (response.status_code, response.headers.get("content-type"),
            response.json() if response.content else None)


def same_change(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two records of the same change: equal but for their ids and times."""
    assert set(a) == set(b) and set(a["phases"]) == set(b["phases"])
    assert {k: v for k, v in a.items() if k not in ("id", "phases")} == \
        {k: v for k, v in b.items() if k not in ("id", "phases")}


async def test_a_valid_request_is_served_by_the_shortcut_alone(
        both: tuple[Rig, httpx.AsyncClient, httpx.AsyncClient]) -> None:
    rig, short, _ = both
    routed = mock.patch.object(APIRoute, "handle", side_effect=AssertionError("routed"))
    with routed as handle:
        r = await short.post("/v1/switches/ocs1/connections",
                             json={"pairs": [[1, 17]], "verify_light": False})
        assert r.status_code == 200 and r.json()["connected"] == [[1, 17]]
        assert handle.call_count == 0
        # A body that does not validate goes on to FastAPI, which answers it in its words.
        r = await short.post("/v1/switches/ocs1/connections", json={"pairs": []})
        assert handle.call_count == 1 and r.status_code == 500
    assert rig.daemon.engine.intended["ocs1"] == {1: 17}


async def test_changes_and_refusals_are_answered_as_the_routes_answer_them(
        both: tuple[Rig, httpx.AsyncClient, httpx.AsyncClient]) -> None:
    rig, short, routed = both
    for http in (short, routed):  # made, then broken, the same way through each
        made = await http.post("/v1/switches/ocs1/connections",
                               json={"pairs": [[1, 17]], "verify_light": False})
        moved = await http.put("/v1/switches/ocs1/connections",
                               json={"pairs": [[2, 18]], "verify_light": False})
        broken = await http.post("/v1/switches/ocs1/disconnect",
                                 json={"ports": [2], "verify_light": False, "cause": "schedule"})
        if http is short:
            first = [made, moved, broken]
    for a, b in zip(first, [made, moved, broken], strict=True):
        assert a.status_code == b.status_code == 200
        assert a.headers["content-type"] == b.headers["content-type"]
        same_change(a.json(), b.json())
    assert rig.daemon.engine.intended["ocs1"] == {}
    await short.post("/v1/switches/ocs1/connections", json={"pairs": [[3, 19]]})
    refusals = [  # a port busy (409), one not on the switch (404), a switch not in the lab
        ("POST", "/v1/switches/ocs1/connections", {"pairs": [[3, 20]]}),
        ("POST", "/v1/switches/ocs1/connections", {"pairs": [[1, 99]]}),
        ("PUT", "/v1/switches/ocs1/connections", {"pairs": [[17, 1], [1, 18]]}),
        ("POST", "/v1/switches/ocs1/disconnect", {"ports": [0]}),
        ("POST", "/v1/switches/nope/connections", {"pairs": [[1, 17]]}),
        ("POST", "/v1/switches/ocs1/connections", {"pairs": [[1, 17]], "extra": 1}),
    ]
    for method, path, body in refusals:
        a = await short.request(method, path, json=body)
        b = await routed.request(method, path, json=body)
        assert a.status_code >= 400 and answer(a) == answer(b), (method, path, body)
    assert rig.daemon.engine.intended["ocs1"] == {3: 19}


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_bodies_of_any_shape_get_the_routes_answers(
        both: tuple[Rig, httpx.AsyncClient, httpx.AsyncClient], method: str,
        path: str) -> None:
    """Whatever the body, to a switch the lab does not have (nothing changes, valid or
    not): the shortcut's answer is the route's, status, headers and body."""
    _, short, routed = both
    seen: list[bytes] = []

    @example(body=b'{"pairs": [[1, 2]], "ports": [1]}')
    @example(body=b'{"pairs": [[1, NaN]]}')
    @example(body=b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[')
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(body=st.one_of(BODY.map(lambda b: json.dumps(b).encode()),
                          st.fixed_dictionaries({"ports": st.lists(st.integers(-2, 40),
                                                                   max_size=3)}).map(
                              lambda b: json.dumps(b).encode()),
                          st.binary(max_size=32)))
    def collect(body: bytes) -> None:
        seen.append(body)

    collect()
    for body in seen:
        url = path.format("nope")
        headers = {"Content-Type": "application/json"}
        a = await short.request(method, url, content=body, headers=headers)
        b = await routed.request(method, url, content=body, headers=headers)
        assert answer(a) == answer(b), (method, body)
