"""How an agent reaches the daemon: over MQTT (the lab's broker: a last will says when the
host drops) or, where a lab has no broker, over HTTP to the daemon's API (heartbeats and
events are POSTed; commands are long-polled; a lost host shows as missed heartbeats).

Either way the agent sends the same messages (``status``, ``heartbeat``, ``events``) and
receives the same job commands; a link that fails raises :class:`LinkDown` and the agent
reconnects.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiomqtt
import httpx

from labd.client.api import call_json
from labd.errors import LinkDown
from labd.mqtt import NO_DELAY, parse_url, publish

#: How long one command poll waits at the daemon for a command (HTTP).
POLL_S = 20.0


class AgentLink(Protocol):
    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        """Send one message: ``status``, ``heartbeat`` or ``events``."""
        ...

    def commands(self) -> AsyncIterator[bytes]:
        """The daemon's job commands, as they come."""
        ...


class MqttLink:
    def __init__(self, client: aiomqtt.Client, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        try:
            await publish(self.client, f"{self.prefix}/{kind}", payload,
                          qos=1 if reliable else 0, retain=kind == "status")
        except aiomqtt.MqttError as exc:
            raise LinkDown(f"MQTT: {exc}") from None

    async def commands(self) -> AsyncIterator[bytes]:
        try:
            async for message in self.client.messages:
                payload = message.payload
                yield payload if isinstance(payload, bytes) else str(payload).encode()
        except aiomqtt.MqttError as exc:
            raise LinkDown(f"MQTT: {exc}") from None


@contextlib.asynccontextmanager
async def mqtt_link(url: str, lab: str, host: str) -> AsyncIterator[MqttLink]:
    prefix = f"labd/{lab}/hosts/{host}"
    will = aiomqtt.Will(f"{prefix}/status", "offline", qos=1, retain=True)
    try:
        # One session per host of a lab: a second agent for it takes over.
        async with aiomqtt.Client(*parse_url(url), will=will, socket_options=NO_DELAY,
                                  identifier=f"labd-agent-{lab}-{host}") as client:
            link = MqttLink(client, prefix)
            await link.publish("status", b"online")
            await client.subscribe(f"{prefix}/job", qos=1)
            yield link
    except aiomqtt.MqttError as exc:
        raise LinkDown(f"MQTT broker {url}: {exc}") from None


class HttpLink:
    def __init__(self, http: httpx.AsyncClient, host: str) -> None:
        self.http, self.host = http, host

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await call_json(self.http, method, f"/v1/agents/{self.host}/{path}", LinkDown,
                               **kwargs)

    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        await self._call("POST", kind, content=payload)

    async def commands(self) -> AsyncIterator[bytes]:
        while True:
            commands = await self._call("GET", "commands", params={"wait_s": POLL_S},
                                        timeout=POLL_S + 10)
            for command in commands:
                yield json.dumps(command).encode()


@contextlib.asynccontextmanager
async def http_link(url: str, token: str, host: str) -> AsyncIterator[HttpLink]:
    async with httpx.AsyncClient(base_url=url, timeout=10,
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        link = HttpLink(http, host)
        await link.publish("status", b"online")
        yield link
