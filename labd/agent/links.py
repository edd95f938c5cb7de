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
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiomqtt
import httpx

from labd.client.api import call_json
from labd.errors import LinkDown, RefusedMessage
from labd.mqtt.client import publish, session
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Opener, Sealer
from labd.mqtt.topics import host_root

log = logging.getLogger(__name__)

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
    """One broker session of a host's agent. With the host's key, everything it sends is
    sealed (labd.mqtt.envelope) and only commands sealed by the daemon with that key are
    taken; without one, the broker's ACL is all that binds the host to its topics."""

    def __init__(self, client: aiomqtt.Client, prefix: str, sealer: Sealer | None) -> None:
        self.client, self.prefix, self.sealer = client, prefix, sealer
        key = sealer.key if sealer is not None else None
        self._opener = Opener(lambda sender: key if sender == "daemon" else None)

    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        topic = f"{self.prefix}/{kind}"
        if self.sealer is not None:
            payload = self.sealer.seal(topic, payload)
        try:
            await publish(self.client, topic, payload, qos=1 if reliable else 0,
                          retain=kind == "status")
        except aiomqtt.MqttError as exc:
            raise LinkDown(f"MQTT: {exc}") from None

    async def commands(self) -> AsyncIterator[bytes]:
        try:
            async for message in self.client.messages:
                payload = message.payload
                raw = payload if isinstance(payload, bytes) else str(payload).encode()
                if self.sealer is not None:
                    try:
                        _, body = self._opener.open(str(message.topic), raw, sender="daemon")
                    except RefusedMessage as exc:
                        log.warning("command on %s refused: %s", message.topic, exc)
                        continue
                    raw = body.encode()
                yield raw
        except aiomqtt.MqttError as exc:
            raise LinkDown(f"MQTT: {exc}") from None


@contextlib.asynccontextmanager
async def mqtt_link(settings: BusSettings, lab: str, host: str) -> AsyncIterator[MqttLink]:
    prefix = host_root(lab, host, settings.instance)
    key = settings.credentials.hosts.get(host)
    # A new session each connection; its last will is sealed now, as its last word.
    sealer = Sealer(host, key) if key is not None else None
    will_payload = (sealer.seal(f"{prefix}/status", b"offline", last=True)
                    if sealer is not None else b"offline")
    will = aiomqtt.Will(f"{prefix}/status", will_payload, qos=1, retain=True)
    try:
        # One session per host of a lab: a second agent for it takes over.
        name = f"labd-agent-{prefix.removeprefix('labd/')}"
        async with session(**settings.login(), will=will, identifier=name) as client:
            link = MqttLink(client, prefix, sealer)
            await link.publish("status", b"online")
            await client.subscribe(f"{prefix}/job", qos=1)
            yield link
    except aiomqtt.MqttError as exc:
        raise LinkDown(f"MQTT broker {settings.url}: {exc}") from None


class HttpLink:
    def __init__(self, http: httpx.AsyncClient, host: str) -> None:
        self.http, self.host = http, host

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await call_json(self.http, method, f"/v1/agents/{self.host}/{path}", LinkDown,
                               **kwargs)

    async def publish(self, kind: str, payload: bytes, *, reliable: bool = True) -> None:
        await self._call("POST", kind, content=payload,
                         headers={"Content-Type": "application/json"})

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
