"""How an agent reaches the daemon: over MQTT (the lab's broker: a last will says when the
host drops) or, where a lab has no broker, over HTTP to the daemon's API (heartbeats and
events are POSTed; commands are long-polled; a lost host shows as missed heartbeats).

Either way the agent sends the same messages (``status``, ``heartbeat``, ``events``) and
receives the same job commands; a link that fails raises :class:`LinkDown` and the agent
reconnects.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiomqtt
import httpx

from labd.client.api import call_json
from labd.errors import BusError, LinkDown
from labd.mqtt.client import publish, session, subscribe
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Opener, Sealer
from labd.mqtt.payload import check
from labd.mqtt.topics import host_root
from labd.repeats import Repeats

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
    taken. Without one, the daemon refuses what the host sends (docs/daemon.md)."""

    def __init__(self, client: aiomqtt.Client, prefix: str, sealer: Sealer | None,
                 opener: Opener | None, host: str = "") -> None:
        self.client, self.prefix, self.sealer, self._opener = client, prefix, sealer, opener
        self.host = host
        self._refused = Repeats()

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
                try:
                    if self._opener is not None:
                        _, body = self._opener.open(str(message.topic), raw, sender="daemon")
                        raw = body.encode()
                    else:
                        check(raw, what="job command")
                except BusError as exc:  # anyone on the broker may publish here
                    told = self._refused.tell(type(exc).__name__)
                    if told is not None:
                        log.warning("host %s: command on %s refused: %s%s", self.host,
                                    message.topic, exc, told.suffix(),
                                    extra={"host": self.host})
                    continue
                yield raw
        except aiomqtt.MqttError as exc:
            raise LinkDown(f"MQTT: {exc}") from None


def command_opener(settings: BusSettings, host: str) -> Opener | None:
    """What checks the daemon's commands to ``host``: one per agent, not per connection, so
    that a command taken before a reconnect cannot be played again after it."""
    key = settings.credentials.hosts.get(host)
    return Opener(lambda sender: key if sender == "daemon" else None) if key else None


def client_id(prefix: str, key: bytes | None) -> str:
    """The agent's broker session name. One per host, so that a second agent for it (or the
    same one reconnecting) takes the session over; derived from the host's key, because a
    client that guessed it could take the session over too, and the broker would publish
    the real agent's last will: the host would look lost."""
    if key is None:
        return f"labd-agent-{secrets.token_hex(8)}"
    tag = hmac.new(key, f"client-id {prefix}".encode(), hashlib.sha256).hexdigest()[:24]
    return f"labd-agent-{tag}"


@contextlib.asynccontextmanager
async def mqtt_link(settings: BusSettings, lab: str, host: str,
                    opener: Opener | None = None) -> AsyncIterator[MqttLink]:
    prefix = host_root(lab, host, settings.instance)
    key = settings.credentials.hosts.get(host)
    # A new session each connection; its last will is sealed now, as its last word.
    sealer = Sealer(host, key) if key is not None else None
    will_payload = (sealer.seal(f"{prefix}/status", b"offline", last=True)
                    if sealer is not None else b"offline")
    will = aiomqtt.Will(f"{prefix}/status", will_payload, qos=1, retain=True)
    if opener is None:
        opener = command_opener(settings, host)
    try:
        async with session(**settings.login(), will=will,
                           identifier=client_id(prefix, key)) as client:
            link = MqttLink(client, prefix, sealer, opener, host)
            # Listening before saying online: the daemon may answer "online" with a job
            # command at once (a degraded job healing), and it must not be missed.
            await subscribe(client, f"{prefix}/job", qos=1)
            await link.publish("status", b"online")
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
