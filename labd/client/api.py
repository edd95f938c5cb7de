"""The client side of labd's HTTP API: an async client for the daemon (what the TUI and
scripts use; docs/architecture.md) and the one way labd's HTTP clients read an answer."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import websockets

from labd.errors import DaemonError


async def call_json(http: httpx.AsyncClient, method: str, path: str,
                    error: type[Exception], **kwargs: Any) -> Any:
    """One request; its JSON answer, or ``error`` naming the service and what it said
    (labd's services answer errors as ``{"detail": ...}``)."""
    try:
        response = await http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise error(f"{http.base_url}: {exc or type(exc).__name__}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        raise error(f"{method} {path}: {response.status_code} {detail}")
    return response.json()


#: How long a meter reading may take to come back (s): a series of up to 5 s, and the
#: meter's own exchanges.
READ_TIMEOUT_S = 30.0


class DaemonClient:
    """The daemon's API with one key (the token), sent on every request and on the event
    stream; ``ca``: the certificate (or CA) to trust for an ``https://`` daemon whose
    certificate the system does not know."""

    def __init__(self, url: str, token: str | None = None, *, ca: str | None = None
                 ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = ssl.create_default_context(cafile=ca) if self.url.startswith(
            "https:") else None
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=5,
                                       verify=self._ssl or True)

    def move(self, url: str) -> None:
        """Talk to the daemon at ``url`` from now on (the lab's leader, under ``--ha``)."""
        self.url = url.rstrip("/")
        self._http.base_url = httpx.URL(self.url)

    async def close(self) -> None:
        await self._http.aclose()

    async def get(self, path: str, **params: Any) -> Any:
        return await call_json(self._http, "GET", path, DaemonError, params=params)

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await self.request("POST", path, body)

    async def put(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await self.request("PUT", path, body)

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None
                      ) -> Any:
        return await call_json(self._http, method, path, DaemonError, json=body or {})

    async def meters(self) -> list[dict[str, Any]]:
        """Each power meter: driver, state, channels, ``logging`` (whether it takes a
        series at a set rate), and what each wired channel is fed from (``sees``)."""
        result: list[dict[str, Any]] = await self.get("/v1/meters")
        return result

    async def read_power(self, meter: str, channels: Sequence[int] | None = None, *,
                         points: int = 1, interval_s: float | None = None
                         ) -> dict[str, Any]:
        """Readings taken now (``POST /v1/meters/{meter}/read``, docs/api.md): every
        channel, or those named; ``points`` per channel, ``interval_s`` apart on a meter
        that logs. The answer's ``channels`` maps each channel (a string) to its readings
        in dBm, ``None`` where over range."""
        body: dict[str, Any] = {"points": points}
        if channels is not None:
            body["channels"] = list(channels)
        if interval_s is not None:
            body["interval_s"] = interval_s
        # A series takes up to the daemon's bound (5 s) on top of the exchange itself.
        result: dict[str, Any] = await call_json(
            self._http, "POST", f"/v1/meters/{meter}/read", DaemonError, json=body,
            timeout=READ_TIMEOUT_S)
        return result

    async def delete(self, path: str) -> Any:
        return await call_json(self._http, "DELETE", path, DaemonError)

    async def hold(self, switch: str, ports: Sequence[int], holder: str, *,
                   ttl_s: float | None = None) -> dict[str, Any]:
        """Hold ``ports`` of ``switch`` (``POST /v1/holds``): changes to them by anyone
        else are refused until the hold ends. Renew it (:meth:`renew_hold`) within its
        ``ttl_s``; the answer's ``id`` goes with the holder's own changes (``"hold"``)."""
        body: dict[str, Any] = {"switch": switch, "ports": list(ports), "holder": holder}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        result: dict[str, Any] = await self.post("/v1/holds", body)
        return result

    async def renew_hold(self, hold: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.put(f"/v1/holds/{hold}")
        return result

    async def release_hold(self, hold: str) -> None:
        await self.delete(f"/v1/holds/{hold}")

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The snapshot, then every event, until the connection ends (DaemonError)."""
        ws_url = "ws" + self.url[len("http"):] + "/v1/events"
        try:
            async with websockets.connect(ws_url, open_timeout=5, ssl=self._ssl,
                                          additional_headers=self._headers) as socket:
                async for message in socket:
                    yield json.loads(message)
        except (OSError, websockets.WebSocketException) as exc:
            raise DaemonError(f"event stream {ws_url}: {exc or type(exc).__name__}") from None
        raise DaemonError("the daemon closed the event stream")
