"""MQTT: the daemon's events on ``labd/<lab>/events/<kind>``, retained state on
``labd/<lab>/state/...``, the daemon's liveness on ``labd/<lab>/daemon`` (``online``, and
``offline`` as its last will), and commands on ``labd/<lab>/command/<switch>`` answered on
``labd/<lab>/command/<switch>/result``.

A command payload is JSON: ``{"token": "...", "connect": [[a, b], ...]}``, or
``"disconnect": [ports]``, or ``"replace": [[a, b], ...]``; an optional ``"id"`` comes back
in the result as ``request_id``. A bad payload gets a result with ``"error"`` and changes nothing.
The bridge reconnects to the broker by itself, with backoff, and republishes its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
from typing import TYPE_CHECKING, Any

import aiomqtt
from pydantic import BaseModel, ConfigDict, ValidationError

from labd.errors import BusError, RequestError
from labd.mqtt import NO_DELAY, parse_url, publish

if TYPE_CHECKING:
    from labd.daemon.services import Services

log = logging.getLogger(__name__)


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str
    id: str | int | None = None
    connect: list[tuple[int, int]] | None = None
    disconnect: list[int] | None = None
    replace: list[tuple[int, int]] | None = None
    verify_light: bool = True


class MqttBridge:
    """The daemon on the broker at ``url``, for as long as ``run()`` runs."""

    def __init__(self, services: Services, url: str) -> None:
        self.services = services
        self.host, self.port = parse_url(url)
        self.prefix = f"labd/{services.lab.lab.name}"
        self.connected = asyncio.Event()
        self.sessions = 0
        """Broker sessions so far (a reconnection makes a new one)."""
        self._session_started = asyncio.Condition()
        self._client: aiomqtt.Client | None = None

    async def wait_sessions(self, count: int, timeout: float) -> None:
        """Wait until the bridge has had ``count`` broker sessions."""
        async with asyncio.timeout(timeout), self._session_started:
            await self._session_started.wait_for(lambda: self.sessions >= count)

    async def send_to_host(self, host: str, message: dict[str, Any]) -> None:
        """A command for a host's agent (``labd/<lab>/hosts/<host>/job``)."""
        client = self._client
        if client is None or not self.connected.is_set():
            raise BusError(f"cannot reach host {host}: the daemon is not connected to the "
                           f"MQTT broker {self.host}:{self.port}")
        try:
            await publish(client, f"{self.prefix}/hosts/{host}/job", json.dumps(message), qos=1)
        except aiomqtt.MqttError as exc:
            raise BusError(f"cannot reach host {host}: {exc}") from None

    async def say_offline(self) -> None:
        """Say ``offline`` before leaving: a clean disconnect sends no last will."""
        if self._client is not None and self.connected.is_set():
            with contextlib.suppress(aiomqtt.MqttError):
                await publish(self._client, f"{self.prefix}/daemon", "offline", qos=1,
                              retain=True)

    async def run(self) -> None:
        """Stay on the broker, reconnecting with backoff, until cancelled."""
        delay = 0.1
        will = aiomqtt.Will(f"{self.prefix}/daemon", "offline", qos=1, retain=True)
        while True:
            try:
                async with aiomqtt.Client(self.host, self.port, will=will,
                                          socket_options=NO_DELAY,
                                          identifier=f"labd-{secrets.token_hex(4)}") as client:
                    delay = 0.1
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                self.connected.clear()
                log.warning("MQTT broker %s:%d: %s; retrying in %.1f s", self.host, self.port,
                            exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 10.0)

    async def _session(self, client: aiomqtt.Client) -> None:
        snapshot, subscription = self.services.hub.subscribe()
        self._client = client
        try:
            await publish(client, f"{self.prefix}/daemon", "online", qos=1, retain=True)
            await self._publish_state(client, snapshot)
            await client.subscribe(f"{self.prefix}/command/+")
            await client.subscribe(f"{self.prefix}/hosts/+/+")
            self.connected.set()
            async with self._session_started:
                self.sessions += 1
                self._session_started.notify_all()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._forward(client, subscription))
                group.create_task(self._commands(client))
        except* aiomqtt.MqttError as group_error:
            raise group_error.exceptions[0] from None
        finally:
            self._client = None
            subscription.close()

    async def _publish_state(self, client: aiomqtt.Client, snapshot: dict[str, Any]) -> None:
        for instrument in snapshot["instruments"]:
            await publish(client, f"{self.prefix}/state/instruments/{instrument['id']}",
                          json.dumps(instrument), qos=1, retain=True)
        for switch, pairs in snapshot["intended"].items():
            await publish(client, f"{self.prefix}/state/switches/{switch}",
                          json.dumps({"intended": pairs}), qos=1, retain=True)

    async def _forward(self, client: aiomqtt.Client, subscription: Any) -> None:
        while True:
            event = await subscription.next()
            if event is None:  # fell behind: start over from a snapshot
                raise aiomqtt.MqttError("event stream overflowed; resyncing")
            await publish(client, f"{self.prefix}/events/{event.kind}",
                          json.dumps(event.as_dict()), qos=0)
            if event.kind == "reconfiguration":
                switch = event.data["switch"]
                intended = self.services.engine.intended.get(switch, {})
                await publish(client, f"{self.prefix}/state/switches/{switch}",
                              json.dumps({"intended": sorted(intended.items())}),
                              qos=1, retain=True)
            elif event.kind == "instrument.state":
                # Keep the retained picture current: a late subscriber sees who is offline.
                name = event.data["instrument"]
                for instrument in self.services.instruments_state():
                    if instrument["id"] == name:
                        await publish(client, f"{self.prefix}/state/instruments/{name}",
                                      json.dumps(instrument), qos=1, retain=True)

    async def _commands(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            parts = topic.split("/")
            if len(parts) == 5 and parts[2] == "hosts":  # labd/<lab>/hosts/<host>/<kind>
                payload = message.payload if isinstance(message.payload, bytes) else str(
                    message.payload).encode()
                self.services.hosts.handle(parts[3], parts[4], payload)
                continue
            switch = parts[-1]
            reply = await self.handle(switch, message.payload)
            await publish(client, f"{topic}/result", json.dumps(reply), qos=1)

    async def handle(self, switch: str, payload: Any) -> dict[str, Any]:
        """Carry out one command; every mistake is a result with ``error``."""
        try:
            data = json.loads(payload)
        except (ValueError, TypeError) as exc:
            return {"error": f"payload is not JSON: {exc}"}
        try:
            command = Command.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            return {"error": f"{where}: {first['msg']}"}
        if not secrets.compare_digest(command.token, self.services.token):
            return {"request_id": command.id, "error": "wrong token"}
        actions = [a for a in ("connect", "disconnect", "replace")
                   if getattr(command, a) is not None]
        if len(actions) != 1:
            return {"request_id": command.id,
                    "error": "give exactly one of 'connect', 'disconnect' or 'replace'"}
        try:
            result = await self.services.engine.reconfigure(
                switch, connect=command.connect or (), disconnect=command.disconnect or (),
                replace=dict(command.replace) if command.replace is not None else None,
                cause="api", verify_light=command.verify_light)
        except RequestError as exc:
            return {"request_id": command.id, "error": str(exc)}
        return {"request_id": command.id, **result.as_dict()}
