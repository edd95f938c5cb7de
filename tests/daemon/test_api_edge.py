"""The API's edge on a real daemon and a real socket: keys and roles checked before a body is
read, bodies limited and UTF-8 JSON only, ports strict JSON integers, integers bounded (422,
never 500), HTTPS where a certificate is given; and the token file, the access file and
their errors on their own."""

import asyncio
import contextlib
import hashlib
import json
import os
import resource
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import example, given, settings
from hypothesis import strategies as st

from labd.client.api import DaemonClient
from labd.daemon.access import Access, ApiSettings, beyond_loopback
from labd.daemon.api.edge import DIGITS, too_long_number
from labd.emulation.rig import Rig
from labd.errors import AccessError, DaemonError, RequestError
from labd.token import find_token, make_token_file, read_token_file
from tests.commands.test_broker_config import certificates
from tests.labs import endpoint, host, switch, write_lab
from tests.rigs import StartRig, background_rig, next_event

TOKEN = "edge-admin-token"
VIEWER, OPERATOR, ADMIN = "viewer-token-0123456789", "operator-token-0123456789", \
    "admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
#: The three roles' keys: the viewer's by its digest, the others as tokens.
ACCESS = Access.parse({"key": [
    {"name": "dash", "role": "viewer",
     "sha256": hashlib.sha256(VIEWER.encode()).hexdigest()},
    {"name": "ci", "role": "operator", "token": OPERATOR},
    {"name": "boss", "role": "admin", "token": ADMIN}]}, "test")
MB = 1 << 20


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def edge(start_rig: StartRig, api: ApiSettings | None = None, token: str | None = TOKEN
               ) -> AsyncIterator[Rig]:
    async with start_rig("edge", switch(switch_ms=1), token=token, api=api) as rig:
        yield rig


def resident_bytes() -> int:
    """This process's resident memory now (the daemon runs in it)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


async def raw_request(url: str, head: str, body: bytes, repeat: int, *, first: int = 0
                      ) -> tuple[int, bytes]:
    """``head`` (request line and headers) and ``first`` copies of ``body``, then the
    answer read; then ``repeat`` copies more sent, which a server that answered early drops
    or refuses (a closed connection). The status and the answer's head."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + body * first)
        async with asyncio.timeout(30):
            answer = await reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(repeat):
                writer.write(body)
                await writer.drain()
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer


# -- keys and roles --------------------------------------------------------------------------
async def test_reads_and_the_event_stream_need_a_key(start_rig: StartRig) -> None:
    async with edge(start_rig) as rig, httpx.AsyncClient(base_url=rig.daemon.url) as http:
        none = await http.get("/v1/health")
        assert none.status_code == 401 and "bearer token is required" in none.json()["detail"]
        assert none.headers["www-authenticate"] == "Bearer"
        wrong = await http.get("/v1/switches/ocs1", headers=bearer("nope"))
        assert wrong.status_code == 401 and "not one of the daemon's keys" in wrong.text
        assert (await http.get("/v1/nowhere")).status_code == 401  # no probing either
        assert (await http.get("/v1/health", headers=AUTH)).json()["lab"]
        assert (await http.get("/v1/nowhere", headers=AUTH)).status_code == 404
        assert (await http.get("/openapi.json")).status_code == 200  # the schema is open
        ws_url = rig.daemon.url.replace("http://", "ws://") + "/v1/events"
        for headers in ({}, bearer("nope")):
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(ws_url, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401
        client = DaemonClient(rig.daemon.url, TOKEN)
        try:
            first = await anext(aiter(client.events()))
            assert first["kind"] == "snapshot"
        finally:
            await client.close()
        stranger = DaemonClient(rig.daemon.url, "nope")
        try:
            with pytest.raises(DaemonError, match="401"):
                await anext(aiter(stranger.events()))
            with pytest.raises(DaemonError, match="401"):
                await stranger.get("/v1/health")
        finally:
            await stranger.close()


async def test_each_role_may_do_its_part_and_no_more(start_rig: StartRig) -> None:
    async with edge(start_rig, ApiSettings(access=ACCESS), token=None) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        change = {"pairs": [[1, 9]]}
        for token in (VIEWER, OPERATOR, ADMIN, rig.daemon.token):
            assert (await http.get("/v1/switches/ocs1", headers=bearer(token))
                    ).status_code == 200
        low = await http.post("/v1/switches/ocs1/connections", json=change,
                              headers=bearer(VIEWER))
        assert low.status_code == 403
        assert "needs an operator key (this one is viewer's)" in low.json()["detail"]
        drill = await http.post("/v1/drills/failover", json={}, headers=bearer(OPERATOR))
        assert drill.status_code == 403 and "needs an admin key" in drill.text
        assert (await http.post("/v1/jobs/j/stop", headers=bearer(OPERATOR))).status_code \
            == 403
        ok = await http.post("/v1/switches/ocs1/connections", json=change,
                             headers=bearer(OPERATOR))
        assert ok.status_code == 200 and ok.json()["outcome"] == "ok"
        # admin ⊇ operator: past the edge, the route's own answer (no hosts, no job)
        assert (await http.post("/v1/drills/failover", json={}, headers=bearer(ADMIN))
                ).status_code == 409
        assert (await http.post("/v1/jobs/j/stop", headers=bearer(ADMIN))).status_code == 404
        # the old single token is no key where an access file is given
        assert (await http.get("/v1/health", headers=AUTH)).status_code == 401
        rows = (await http.get("/v1/reconfigurations", headers=bearer(VIEWER))).json()
    assert len(rows) == 1 and rig.daemon.engine.intended["ocs1"] == {1: 9}


async def test_open_reads_open_reads_only(start_rig: StartRig) -> None:
    async with edge(start_rig, ApiSettings(open_reads=True)) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        assert (await http.get("/v1/switches/ocs1")).status_code == 200
        assert (await http.post("/v1/switches/ocs1/connections",
                                json={"pairs": [[1, 9]]})).status_code == 401
        ws_url = rig.daemon.url.replace("http://", "ws://") + "/v1/events"
        async with websockets.connect(ws_url) as socket:
            assert json.loads(await asyncio.wait_for(socket.recv(), 10))["kind"] == "snapshot"
        schema = (await http.get("/openapi.json")).json()
        health = schema["paths"]["/v1/health"]["get"]
        assert "security" not in health and health["x-labd-role"] == "viewer"
        assert schema["paths"]["/v1/switches/{switch}/connections"]["post"]["security"]


H1, H2 = "host-h1-token-0123456789", "host-h2-token-0123456789"
#: The roles' keys and two hosts' keys, the second by its digest.
HOST_ACCESS = Access.parse({"key": [
    *({"name": k.name, "role": k.role, "sha256": k.sha256.hex()} for k in ACCESS.keys),
    {"name": "agent-h1", "host": "h1", "token": H1},
    {"host": "h2", "sha256": hashlib.sha256(H2.encode()).hexdigest()}]}, "test")


async def test_an_agents_routes_take_its_host_key_or_an_admin_key_alone(
        start_rig: StartRig) -> None:
    """The review's case: any operator key could post any host's events (a faked GPU
    failure starts a failover) or take its job commands."""
    hosts = (endpoint("h1.nic0"), endpoint("h2.nic0"), host("h1", emulate=False),
             host("h2", emulate=False))
    async with start_rig("agents", switch(switch_ms=1), *hosts, token=None,
                         api=ApiSettings(access=HOST_ACCESS)) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        async def post(who: str, at: str, kind: str = "heartbeat") -> httpx.Response:
            return await http.post(f"/v1/agents/{at}/{kind}", content=b'{"gpus": []}',
                                   headers={**bearer(who), **JSON})

        async def poll(who: str, at: str) -> httpx.Response:
            return await http.get(f"/v1/agents/{at}/commands", params={"wait_s": 0},
                                  headers=bearer(who))

        assert (await post(H1, "h1")).status_code == 202
        assert (await poll(H1, "h1")).json() == []
        assert (await post(H2, "h2")).status_code == 202
        for who, at in ((H1, "h2"), (H2, "h1")):
            refused = await post(who, at, "events")
            assert refused.status_code == 403, refused.text
            assert f"takes host {at}'s key or an admin key" in refused.json()["detail"]
            assert "(this one is host " in refused.json()["detail"]
            assert (await poll(who, at)).status_code == 403
        assert (await post(H1, "zz")).status_code == 403  # no probing for hosts either
        for who in (OPERATOR, VIEWER):
            refused = await post(who, "h1", "events")
            assert refused.status_code == 403 and "or an admin key" in refused.text
            assert (await poll(who, "h1")).status_code == 403
        for who in (ADMIN, rig.daemon.token):
            assert (await post(who, "h1")).status_code == 202
            assert (await poll(who, "h2")).status_code == 200
        assert (await post(ADMIN, "zz")).status_code == 404  # past the edge: the route's
        # a host key is nothing but its agent's: no switch changes, no reads, no stream
        change = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]},
                                 headers=bearer(H1))
        assert change.status_code == 403 and "nothing else" in change.json()["detail"]
        assert (await http.get("/v1/health", headers=bearer(H1))).status_code == 403
        ws_url = rig.daemon.url.replace("http://", "ws://") + "/v1/events"
        with pytest.raises(websockets.InvalidStatus) as refused_ws:
            async with websockets.connect(ws_url, additional_headers=bearer(H2)):
                pass
        assert refused_ws.value.response.status_code == 403
    assert rig.daemon.engine.intended["ocs1"] == {}


async def test_a_real_agent_reports_over_http_with_its_host_key(
        start_rig: StartRig, tmp_path: Path) -> None:
    """``labd agent --daemon`` as a user runs it, with its own host key from a file: heard."""
    hosts = (endpoint("h1.nic0"), host("h1", emulate=False))
    async with start_rig("agent", switch(switch_ms=1), *hosts, token=None,
                         api=ApiSettings(access=HOST_ACCESS)) as rig:
        daemon = rig.daemon
        _, sub = daemon.hub.subscribe()
        key_file = tmp_path / "h1.key"
        key_file.write_text(H1 + "\n")
        key_file.chmod(0o600)
        agent = await labd("agent", "--host", "h1", "--lab", daemon.lab.lab.name,
                           "--daemon", daemon.url, "--token-file", str(key_file),
                           "--backend", "emulated", "--gpus", "1")
        try:
            event = await next_event(sub, "gpu.health", timeout=30)
            assert event.data["host"] == "h1"
            assert daemon.hosts.hosts["h1"].status == "online"
        finally:
            agent.terminate()
            await agent.wait()
            sub.close()


# -- bodies ----------------------------------------------------------------------------------
async def test_an_unauthenticated_100_mb_body_is_refused_unread(start_rig: StartRig) -> None:
    """The issue's case: a body parsed before the key was checked (422, and 224 MB more)."""
    async with edge(start_rig) as rig:
        head = ("POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {100 * MB}\r\n"
                "Expect: 100-continue\r\n\r\n")
        chunk = b"[" * MB
        before = resident_bytes()
        status, answer = await raw_request(rig.daemon.url, head, chunk, 100)
        grown = resident_bytes() - before
        assert status == 401 and b"100 Continue" not in answer
        assert grown < 8 * MB, f"the daemon grew by {grown / MB:.1f} MB"
        assert rig.daemon.engine.intended["ocs1"] == {}


async def test_a_body_beyond_the_limit_is_refused_before_it_is_read(
        start_rig: StartRig) -> None:
    async with edge(start_rig) as rig:
        url = rig.daemon.url
        before = resident_bytes()
        # declared: refused on its Content-Length
        head = ("POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {100 * MB}\r\nExpect: 100-continue\r\n\r\n")
        status, _ = await raw_request(url, head, b" " * MB, 100)
        assert status == 413
        # chunked: counted as it comes, refused once past the limit
        head = ("POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (MB, b" " * MB)
        status, _ = await raw_request(url, head, piece, 98, first=2)
        assert status == 413
        assert resident_bytes() - before < 8 * MB
        assert rig.daemon.engine.intended["ocs1"] == {}


async def send_until_closed(url: str, head: str, piece: bytes, count: int
                            ) -> tuple[bytes, int]:
    """``head``, then up to ``count`` copies of ``piece`` (then the end of what the client
    sends) while the answer is read to the end of what the server sends: the answer, and
    the bytes of body sent by then (each write waited until the socket took it)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0

    async def send() -> None:
        nonlocal sent
        writer.write(head.encode())
        for _ in range(count):
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
        writer.write_eof()  # all sent: a server still reading it has it all

    sending = asyncio.create_task(send())
    try:
        async with asyncio.timeout(60):
            answer = await reader.read()
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
        writer.close()
    return answer, sent


@pytest.mark.parametrize("framing", ["declared", "chunked"])
async def test_a_body_past_the_limit_is_refused_and_the_rest_left_unsent(
        start_rig: StartRig, framing: str) -> None:
    """The issue's case: a 100 MB chunked body with an admin key was read to its end, the
    413 sent and the connection kept open. Now the 413 comes as the limit is passed, and
    the connection is closed while the client has most of the body still to send."""
    piece = b" " * MB
    length = f"Content-Length: {100 * MB}"
    if framing == "chunked":
        piece, length = b"%x\r\n%s\r\n" % (MB, piece), "Transfer-Encoding: chunked"
    head = ("POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"{length}\r\n\r\n")
    async with edge(start_rig) as rig:
        answer, sent = await send_until_closed(rig.daemon.url, head, piece, 100)
        status, _, rest = answer.partition(b"\r\n")
        assert status.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert sent < 50 * MB, f"{sent / MB:.0f} MB of 100 sent before the close"
        assert b"connection: close" in rest.lower() and b"--max-body" in rest
        assert rig.daemon.engine.intended["ocs1"] == {}


async def test_the_body_limit_is_a_setting(start_rig: StartRig) -> None:
    async with edge(start_rig, ApiSettings(max_body=64)) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        small = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        assert small.status_code == 200
        large = await http.post("/v1/switches/ocs1/connections",
                                json={"pairs": [[2, 10]], "cause": "api" + " " * 64})
        assert large.status_code == 413 and "64 bytes" in large.text


#: Bodies refused, each with its status and the words of its answer.
BAD_BODIES: list[tuple[str, dict[str, str], bytes, int, str]] = [
    ("text/plain", {"Content-Type": "text/plain"}, b'{"pairs": [[1, 9]]}', 415,
     "Content-Type: application/json"),
    ("no type", {}, b'{"pairs": [[1, 9]]}', 415, "Content-Type: application/json"),
    ("UTF-16", JSON, '{"pairs": [[1, 9]]}'.encode("utf-16-le"), 415, "UTF-8"),
    ("UTF-16 with BOM", JSON, '{"pairs": [[1, 9]]}'.encode("utf-16"), 415, "UTF-8"),
    ("UTF-32", JSON, '{"pairs": [[1, 9]]}'.encode("utf-32"), 415, "UTF-8"),
    ("UTF-8 BOM", JSON, '{"pairs": [[1, 9]]}'.encode("utf-8-sig"), 415, "byte-order mark"),
    ("charset", {"Content-Type": "application/json; charset=utf-16"},
     '{"pairs": [[1, 9]]}'.encode("utf-16-le"), 415, "utf-16"),
    ("latin-1", JSON, b'{"pairs": [[1, 9]], "cause": "\xe9"}', 415, "UTF-8"),
    ("string ports", JSON, b'{"pairs": [["1", "17"]]}', 422, "valid integer"),
    ("a boolean port", JSON, b'{"pairs": [[true, 9]]}', 422, "valid integer"),
    ("a float port", JSON, b'{"pairs": [[1.0, 9]]}', 422, "valid integer"),
    ("a port beyond 64 bits", JSON, b'{"pairs": [[1, 100000000000000000000]]}', 422,
     "less than or equal"),
    ("a negative port", JSON, b'{"pairs": [[-1, 9]]}', 422, "greater than or equal"),
    ("a port of 5,000 digits", JSON, b'{"pairs": [[1, ' + b"9" * 5000 + b']]}', 422,
     "more than 4300 digits"),
    ("no pairs", JSON, b'{"pairs": []}', 422, "at least 1 item"),
    ("three ports", JSON, b'{"pairs": [[1, 9, 2]]}', 422, "at most 2"),
    ("a string flag", JSON, b'{"pairs": [[1, 9]], "verify_light": "false"}', 422,
     "valid boolean"),
]


@pytest.mark.parametrize(("name", "headers", "body", "status", "words"), BAD_BODIES,
                         ids=[case[0] for case in BAD_BODIES])
async def test_a_bad_body_is_refused_and_changes_nothing(
        start_rig: StartRig, name: str, headers: dict[str, str], body: bytes, status: int,
        words: str) -> None:
    async with edge(start_rig) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        answer = await http.post("/v1/switches/ocs1/connections", content=body,
                                 headers=headers)
        assert answer.status_code == status, answer.text
        assert words in answer.text
        assert (await http.get("/v1/reconfigurations")).json() == []
    assert rig.daemon.engine.intended["ocs1"] == {}


async def test_other_bodies_are_as_strict(start_rig: StartRig) -> None:
    async with edge(start_rig) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        for path, body in [("/v1/switches/ocs1/disconnect", {"ports": [True]}),
                           ("/v1/switches/ocs1/disconnect", {"ports": ["3"]}),
                           ("/v1/switches/ocs1/disconnect", {"ports": []}),
                           ("/v1/jobs/j/decision", {"approve": "yes"}),
                           ("/v1/jobs/j/decision", {"approve": 1})]:
            answer = await http.post(path, json=body)
            assert answer.status_code == 422, (path, body, answer.text)
        # a whole map may be empty: it takes every circuit down
        await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        cleared = await http.put("/v1/switches/ocs1/connections", json={"pairs": []})
        assert cleared.status_code == 200 and cleared.json()["disconnected"] == [[1, 9]]


async def test_a_whole_map_giving_a_port_twice_is_422_naming_it(start_rig: StartRig) -> None:
    """PUT took {"pairs": [[1, 9], [1, 10]]} as the map {1: 10} (a dict of the pairs kept
    the last), where POST of the same pairs is 422. The engine refuses it for every caller:
    the API, and the bus's replace command, which gives the engine the pairs as sent."""
    async with edge(start_rig) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        path = "/v1/switches/ocs1/connections"
        assert (await http.post(path, json={"pairs": [[2, 10]]})).status_code == 200
        for pairs, port in [([[1, 9], [1, 10]], 1), ([[3, 11], [4, 12], [3, 13]], 3),
                            ([[1, 9], [5, 9]], 9)]:
            for method in ("PUT", "POST"):
                answer = await http.request(method, path, json={"pairs": pairs})
                assert answer.status_code == 422, (method, pairs, answer.text)
                assert f"port {port} appears twice" in answer.json()["detail"], answer.text
            with pytest.raises(RequestError, match=f"port {port} appears twice"):
                await rig.daemon.engine.reconfigure("ocs1", replace=[(a, b) for a, b in pairs])
        assert len((await http.get("/v1/reconfigurations")).json()) == 1
    assert rig.daemon.engine.intended["ocs1"] == {2: 10}


async def test_a_number_of_more_digits_than_python_reads_is_422_on_every_route(
        start_rig: StartRig) -> None:
    """Python's JSON refuses an integer of over 4,300 digits (int()'s guard), which FastAPI
    answered 400 "There was an error parsing the body"."""
    huge = "7" * 5000
    async with edge(start_rig) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        for method, path, body in [
                ("PUT", "/v1/switches/ocs1/connections", f'{{"pairs": [[1, {huge}]]}}'),
                ("POST", "/v1/switches/ocs1/disconnect", f'{{"ports": [-{huge}]}}'),
                ("POST", "/v1/circuits", f'{{"from": "a", "to": "b", "cause": {huge}}}'),
                ("POST", "/v1/jobs/j/decision", f'{{"approve": {huge}, "x": "{huge}"}}'),
                # after the number, what is not JSON: the number is what is said
                ("POST", "/v1/switches/ocs1/connections", f'{{"pairs": [[{huge}, 9]] nope')]:
            answer = await http.request(method, path, content=body, headers=JSON)
            assert answer.status_code == 422, (method, path, answer.text)
            assert "more than 4300 digits" in answer.json()["detail"], answer.text
        # The same digits in a string are a string: the route answers it (no such endpoint).
        answer = await http.post("/v1/circuits", json={"from": huge, "to": "b"})
        assert answer.status_code == 404, answer.text
        assert (await http.get("/v1/reconfigurations")).json() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2 * DIGITS), st.booleans(), st.booleans()),
                max_size=4))
def test_a_number_too_long_to_read_is_told_from_digits_in_a_string(
        runs: list[tuple[int, bool, bool]]) -> None:
    """Runs of digits in a body, as numbers (negative or not) or in strings: only a number
    of more digits than Python reads is refused."""
    items = [f'"{"7" * n}"' if quoted else ("-" if negative else "") + "7" * n
             for n, quoted, negative in runs]
    body = ("[" + ", ".join(items) + "]").encode()
    assert too_long_number(body) == any(n > DIGITS and not quoted for n, quoted, _ in runs)


#: The issue's three 500s (an SQLite OverflowError), and their neighbours.
BEYOND_64_BITS = [
    "/v1/reconfigurations?since_ns=" + str(10**30),
    "/v1/reconfigurations?until_ns=" + str(2**63),
    "/v1/reconfigurations?since_ns=-1",
    "/v1/reconfigurations/" + str(10**30) + "/traces",
    "/v1/reconfigurations/-1/traces",
    "/v1/failovers/" + str(10**30),
    "/v1/failovers/" + str(2**63),
    "/v1/failovers?limit=" + str(10**30),
    "/v1/agents/h1/commands?wait_s=1e400",
]


async def test_integers_beyond_64_bits_are_422_never_500(start_rig: StartRig) -> None:
    async with edge(start_rig) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as http:
        for path in BEYOND_64_BITS:
            answer = await http.get(path)
            assert answer.status_code == 422, (path, answer.text)
        edge_of_range = str(2**63 - 1)
        assert (await http.get(f"/v1/failovers/{edge_of_range}")).status_code == 404
        assert (await http.get(f"/v1/reconfigurations/{edge_of_range}/traces")).json() == []
        assert (await http.get(f"/v1/reconfigurations?since_ns={edge_of_range}")
                ).json() == []


PORT = st.one_of(st.integers(-10, 20), st.integers(), st.text(max_size=4), st.booleans(),
                 st.floats(allow_nan=True), st.none())
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                       max_leaves=12)
BODY = st.one_of(
    st.fixed_dictionaries({"pairs": st.lists(st.lists(PORT, max_size=3), max_size=3)},
                          optional={"verify_light": JSONISH, "cause": JSONISH}),
    st.dictionaries(st.text(max_size=8), JSONISH, max_size=3),
    JSONISH)


def test_any_body_is_answered_without_a_server_error(tmp_path: Path) -> None:
    """Whatever the body, bytes or JSON of any shape, under any Content-Type, the answer is
    a 2xx, or a 4xx with a detail; what is changed is only ever valid ports."""
    with background_rig(tmp_path, "fuzz", switch(switch_ms=1)) as bg, \
            httpx.Client(base_url=bg.daemon.url, headers=bearer("t")) as http:

        # Found by this test: NaN in a body (Python's JSON reads it) was echoed back in the
        # validation errors, which could not then be written as JSON: a 500.
        @example(body=b'{"pairs": [[], [], [NaN, null]], "verify_light": {"": null}, '
                      b'"cause": {}}', kind="application/json", method="POST")
        @example(body=b'{"pairs": [[1, Infinity]]}', kind="application/json", method="PUT")
        @settings(max_examples=150, deadline=None, database=None)
        @given(body=st.one_of(BODY.map(lambda b: json.dumps(b).encode()),
                              st.binary(max_size=64)),
               kind=st.sampled_from(["application/json", "application/json; charset=utf-8",
                                     "text/plain", "application/json; charset=latin-1"]),
               method=st.sampled_from(["POST", "PUT"]))
        def check(body: bytes, kind: str, method: str) -> None:
            answer = http.request(method, "/v1/switches/ocs1/connections", content=body,
                                  headers={"Content-Type": kind})
            assert answer.status_code < 500, (body, kind, answer.text)
            if answer.status_code >= 400:
                assert answer.json()["detail"]

        check()
        intended = bg.daemon.engine.intended["ocs1"]
        assert all(1 <= p <= 16 for pair in intended.items() for p in pair)


# -- TLS -------------------------------------------------------------------------------------
async def test_https_where_a_certificate_is_given(start_rig: StartRig, tmp_path: Path) -> None:
    ca, cert, key = certificates(tmp_path / "tls")
    api = ApiSettings(tls_cert=str(cert), tls_key=str(key))
    async with edge(start_rig, api) as rig:
        assert rig.daemon.url.startswith("https://127.0.0.1:")
        client = DaemonClient(rig.daemon.url, TOKEN, ca=str(ca))
        try:
            assert (await client.get("/v1/health"))["lab"]
            changed = await client.post("/v1/switches/ocs1/connections", {"pairs": [[1, 9]]})
            assert changed["outcome"] == "ok"
            first = await anext(aiter(client.events()))
            assert first["kind"] == "snapshot"
        finally:
            await client.close()
        plain = rig.daemon.url.replace("https://", "http://")
        async with httpx.AsyncClient(base_url=plain, headers=AUTH) as http:
            with pytest.raises(httpx.HTTPError):
                await http.get("/v1/health")
        untrusting = DaemonClient(rig.daemon.url, TOKEN)  # the system's CAs only
        try:
            with pytest.raises(DaemonError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get("/v1/health")
        finally:
            await untrusting.close()


def test_a_certificate_that_cannot_be_used_is_a_message(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(AccessError, match="cannot serve HTTPS with certificate"):
        ApiSettings(tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "cert.pem"))
    with pytest.raises(AccessError, match="both a certificate and its key"):
        ApiSettings(tls_cert=str(tmp_path / "cert.pem"))


def test_beyond_loopback() -> None:
    assert not any(map(beyond_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert all(map(beyond_loopback, ["0.0.0.0", "::", "10.0.0.2", "lab.example"]))


# -- the token file and the access file ------------------------------------------------------
def test_the_token_file_is_made_0600_from_its_first_byte(tmp_path: Path) -> None:
    old = os.umask(0)  # the widest umask: the mode must not come from it
    try:
        token = make_token_file(tmp_path / "state" / "labd" / "token")
    finally:
        os.umask(old)
    path = tmp_path / "state" / "labd" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_token_file(path) == token and len(token) >= 24
    assert make_token_file(path) == token  # another's, kept as it is


def test_private_files_are_0600_from_their_first_byte_whatever_the_umask(
        tmp_path: Path) -> None:
    """One helper for every secret file (tokens, MQTT credentials, the store): created
    0600, an older file's wider mode not kept, an existing file left as it is."""
    from labd.files import create_private, readable_by_others, write_private

    before = os.umask(0)  # the widest a process could be started with
    try:
        assert create_private(tmp_path / "new", "secret\n")
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600
        assert not create_private(tmp_path / "new", "other\n")  # left as it is
        assert (tmp_path / "new").read_text() == "secret\n"
        wide = tmp_path / "sub" / "wide"
        wide.parent.mkdir()
        wide.write_text("old")
        wide.chmod(0o644)
        assert readable_by_others(wide)
        write_private(wide, "new")
        assert stat.S_IMODE(wide.stat().st_mode) == 0o600 and wide.read_text() == "new"
        assert not readable_by_others(wide)
        write_private(tmp_path / "made" / "deep" / "file", "x")  # its folders made too
        assert not readable_by_others(tmp_path / "made" / "deep" / "file")
    finally:
        os.umask(before)


def test_a_named_token_file_wins_over_the_environment(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's case: ``labd tui`` and ``labd agent`` took $LABD_TOKEN over the file
    named with --token-file, where ``labd run`` took the file."""
    from labd.agent.cli import _token

    named = tmp_path / "named"
    named.write_text("from-the-file\n")
    monkeypatch.setenv("LABD_TOKEN", "from-the-environment")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert find_token(file=named) == "from-the-file"
    assert _token(str(named)) == "from-the-file"
    assert find_token() == "from-the-environment"
    assert find_token("in-code", file=named) == "in-code"
    with pytest.raises(AccessError, match="No such file"):  # a named file is never skipped
        find_token(file=tmp_path / "missing")


def test_a_token_file_that_cannot_be_used_is_a_message(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two").write_text("a\nb\n")
    for name, words in [("empty", "must hold the token alone"),
                        ("two", "must hold the token alone"), ("missing", "No such file")]:
        with pytest.raises(AccessError, match=words):
            read_token_file(tmp_path / name)


def test_an_access_file(tmp_path: Path) -> None:
    path = tmp_path / "access.toml"
    digest = hashlib.sha256(VIEWER.encode()).hexdigest()
    path.write_text(f'open_reads = true\n[[key]]\nname = "dash"\nrole = "viewer"\n'
                    f'sha256 = "{digest}"\n[[key]]\nrole = "admin"\ntoken = "{ADMIN}"\n')
    access = Access.load(path)
    assert access.open_reads
    assert (access.role_of(VIEWER), access.role_of(ADMIN)) == ("viewer", "admin")
    assert access.role_of("x" * 24) is None and access.role_of(None) is None
    assert access.with_token(OPERATOR, "operator").role_of(OPERATOR) == "operator"
    assert HOST_ACCESS.holder(H1) == (None, "h1") and HOST_ACCESS.holder(H2) == (None, "h2")
    assert HOST_ACCESS.holder(ADMIN) == ("admin", None) and HOST_ACCESS.role_of(H1) is None


#: Access files refused, each with the words of its message.
BAD_ACCESS: list[tuple[str, str]] = [
    ("[[key]]\nrole = 'root'\ntoken = '0123456789abcdef'", "role must be one of viewer"),
    ("[[key]]\nrole = 'admin'", "exactly one of token and sha256"),
    ("[[key]]\nrole = 'admin'\ntoken = 'short'", "16 characters or more"),
    ("[[key]]\nrole = 'admin'\ntoken = '0123456789abcdef'\nsha256 = '00'",
     "exactly one of token and sha256"),
    ("[[key]]\nrole = 'admin'\nsha256 = 'zz'", "64 hex digits"),
    ("[[key]]\nrole = 'admin'\nsha256 = 7", "64 hex digits"),
    ("[[key]]\nrole = 'admin'\ntoken = '0123456789abcdef'\npassword = 1", "unknown field"),
    ("open_reads = 'yes'\n[[key]]\nrole = 'admin'\ntoken = '0123456789abcdef'",
     "open_reads must be true or false"),
    ("keys = []", "unknown setting"),
    ("", "no [[key]] tables"),
    ("key = 3", "no [[key]] tables"),
    ("key = [1]", "key 1 is not a table"),
    ("[[key]\n", "see docs/daemon.md"),
    ("a = " + "[" * 5000 + "]" * 5000, "access file"),
    ("[[key]]\nname = 3\nrole = 'admin'\ntoken = '0123456789abcdef'", "name must be"),
    ("[[key]]\nhost = 'h1'\nrole = 'admin'\ntoken = '0123456789abcdef'",
     "a role or a host, not both"),
    ("[[key]]\nhost = 'h1/../x'\ntoken = '0123456789abcdef'", "host must be a host id"),
    ("[[key]]\nhost = 1\ntoken = '0123456789abcdef'", "host must be a host id"),
    ("[[key]]\nhost = 'h1'", "exactly one of token and sha256"),
]


@pytest.mark.parametrize(("text", "words"), BAD_ACCESS)
def test_an_access_file_that_cannot_be_used_is_a_message(tmp_path: Path, text: str,
                                                         words: str) -> None:
    path = tmp_path / "access.toml"
    path.write_text(text)
    with pytest.raises(AccessError, match=words.replace("[", r"\[")):
        Access.load(path)


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(st.sampled_from(["open_reads", "key", "keys"]),
                            st.one_of(JSONISH, st.lists(st.dictionaries(
                                st.sampled_from(["name", "role", "host", "token", "sha256",
                                                 "x"]),
                                JSONISH | st.sampled_from(["viewer", "admin", "a" * 64, "h1"]),
                                max_size=5), max_size=3)), max_size=3))
def test_any_access_data_is_taken_or_refused_with_a_message(data: dict[str, Any]) -> None:
    try:
        access = Access.parse(data, "fuzz")
    except AccessError as exc:
        assert str(exc).startswith("access file fuzz")
    else:
        assert access.keys and all(len(k.sha256) == 32 for k in access.keys)


# -- labd run's options ----------------------------------------------------------------------
async def labd(*args: str, env: dict[str, str] | None = None
               ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})


async def test_labd_run_takes_keys_from_files_and_warns_of_plain_http_beyond_loopback(
        tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "runopts", switch(switch_ms=1))
    token_file, access_file = tmp_path / "token", tmp_path / "access.toml"
    token_file.write_text("file-token-0123456789\n")
    token_file.chmod(0o644)  # readable by others: said so
    access_file.write_text(f'[[key]]\nrole = "viewer"\ntoken = "{VIEWER}"\n')
    access_file.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = await labd("run", str(lab), "--db", str(tmp_path / "s.sqlite"), "--host",
                      "0.0.0.0", "--port", str(port), "--token-file", str(token_file),
                      "--access", str(access_file))
    assert proc.stdout is not None
    try:
        printed = ""
        async with asyncio.timeout(60):
            while "emulators' control endpoint" not in printed:
                line = (await proc.stdout.readline()).decode()
                assert line, f"labd run ended early: {printed}"
                printed += line
        assert "without TLS" in printed and "--tls-cert" in printed
        assert f"{token_file} can be read by other users" in printed
        assert "reads and changes need 'Authorization: Bearer <token>'" in printed
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/v1/health", headers=bearer(VIEWER))).status_code == 200
            assert (await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]},
                                    headers=bearer(VIEWER))).status_code == 403
            assert (await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]},
                                    headers=bearer("file-token-0123456789"))
                    ).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert "Traceback" not in err.decode()


@pytest.mark.parametrize(("args", "words"), [
    (("--token", "secret"), "No such option: --token"),
    (("--access", "{dir}/nowhere.toml"), "access file {dir}/nowhere.toml"),
    (("--access", "{dir}/bad.toml"), "role must be one of viewer, operator, admin"),
    (("--token-file", "{dir}/nowhere"), "token file {dir}/nowhere"),
    (("--tls-cert", "{dir}/bad.toml"), "tls_cert and tls_key go together"),
    (("--tls-cert", "{dir}/bad.toml", "--tls-key", "{dir}/bad.toml"),
     "cannot serve HTTPS with certificate"),
])
async def test_labd_run_refuses_settings_it_cannot_use(tmp_path: Path, args: tuple[str, ...],
                                                       words: str) -> None:
    _, lab = write_lab(tmp_path, "runbad", switch(switch_ms=1))
    (tmp_path / "bad.toml").write_text('[[key]]\nrole = "root"\ntoken = "0123456789abcdef"\n')
    proc = await labd("run", str(lab), "--db", str(tmp_path / "s.sqlite"), "--port", "0",
                      *(a.format(dir=tmp_path) for a in args))
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    printed = " ".join((out + err).decode().split())  # rich wraps long lines
    assert proc.returncode != 0
    assert words.format(dir=tmp_path) in printed, printed
    assert "Traceback" not in printed


async def test_a_request_that_is_not_http_is_the_servers_400_and_documented(
        start_rig: StartRig) -> None:
    """Schemathesis's case (negative mode): a ``Transfer-Encoding`` the HTTP server cannot
    parse is its 400, before labd reads anything; the schema says every operation may give
    it, so a client generated from the schema expects it."""
    async with edge(start_rig) as rig:
        head = ("POST /v1/drills/failover HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                "transfer-encoding: $4&T3{utn]\r\nContent-Length: 2\r\n\r\n")
        status, _ = await raw_request(rig.daemon.url, head, b"{}", 0, first=1)
        assert status == 400
        async with httpx.AsyncClient(base_url=rig.daemon.url) as http:
            schema = (await http.get("/openapi.json")).json()
        operations = [op for item in schema["paths"].values() for op in item.values()]
        assert operations and all("400" in op["responses"] for op in operations)
        assert rig.daemon.engine.intended["ocs1"] == {}
