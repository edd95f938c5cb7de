"""The switch commands the MQTT bridge carries out, and its complaints about what it refuses.

A command's body is JSON: ``{"connect": [[a, b], ...]}``, or ``"disconnect": [ports]``, or
``"replace": [[a, b], ...]``; an optional ``"id"`` comes back in the result as
``request_id``. It is believed only sealed with the key of a client the daemon knows
(labd.mqtt.envelope); whatever is wrong with it changes nothing and is answered with
``"error"``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from labd.daemon.api.bodies import MAX_PAIRS, Port
from labd.errors import BusError, RequestError
from labd.mqtt.envelope import Opener
from labd.mqtt.payload import loads
from labd.repeats import Repeats

if TYPE_CHECKING:
    from labd.daemon.services import Services

log = logging.getLogger("labd.daemon.bus")

#: One warning event per sender (or kind of mistake) at most this often.
COMPLAINT_EVERY_S = 10.0
# The same ports, pairs and bounds as the API's bodies: one change, two ways to ask.
Pair = tuple[Port, Port]


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(max_length=128)] | StrictInt | None = None
    connect: Annotated[list[Pair], Field(min_length=1, max_length=MAX_PAIRS)] | None = None
    disconnect: Annotated[list[Port], Field(min_length=1, max_length=MAX_PAIRS)] | None = None
    replace: Annotated[list[Pair], Field(max_length=MAX_PAIRS)] | None = None
    verify_light: StrictBool = True


class Complaints:
    """Warning events (and log lines) about refused messages, through one limiter
    (labd.repeats): at most one per ``who`` every :data:`COMPLAINT_EVERY_S` and a bounded
    number in all, each with how many were held back, so that a flood of bad messages, from
    however many made-up senders, does not become a flood of events (which go back out on
    the bus)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        # A key per host of the lab and a few for the kinds of mistake: every sender is
        # remembered, so a fleet past the default table is still told once per sender.
        self.repeats = Repeats(COMPLAINT_EVERY_S,
                               keys=max(4096, len(services.hosts.hosts) + 64))
        self.count = 0
        """Messages refused so far."""

    @property
    def held(self) -> int:
        """Complaints held back so far (per sender or by the overall budget)."""
        return self.repeats.held

    def __call__(self, who: str, detail: str) -> None:
        self.count += 1
        told = self.repeats.tell(who)
        if told is None:
            return
        detail += told.suffix()
        log.warning("MQTT: %s", detail, extra={"host": who.removeprefix("host ")}
                    if who.startswith("host ") else None)
        self.services.hub.publish("warning", {"detail": detail, "source": "mqtt"})


class SwitchCommands:
    """Commands on ``<root>/command/<switch>``: opened with the clients' keys (across
    reconnections: a replay after one is still a replay), checked, carried out."""

    def __init__(self, services: Services, clients: Opener, complain: Complaints) -> None:
        self.services, self.clients, self.complain = services, clients, complain

    async def handle(self, switch: str, payload: bytes | str, topic: str) -> dict[str, Any]:
        """Carry out one command that came on ``topic``; every mistake is a result with
        ``error``."""
        raw = payload.encode() if isinstance(payload, str) else payload
        try:
            _, body = self.clients.open(topic, raw)
            data = loads(body, what="command")
        except BusError as exc:  # refused, or too large or too deep to read
            self.complain("commands", f"command for {switch} refused: {exc}")
            return {"error": f"{exc}; commands must be sealed with a client key "
                             "(labd broker-config; docs/daemon.md)"}
        if isinstance(data, dict) and "token" in data:
            return {"error": "tokens are not taken over MQTT (a subscriber would read it): "
                             "seal the command with a client key instead"}
        try:
            command = Command.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            return {"error": f"{where}: {first['msg']}"}
        actions = [a for a in ("connect", "disconnect", "replace")
                   if getattr(command, a) is not None]
        if len(actions) != 1:
            return {"request_id": command.id,
                    "error": "give exactly one of 'connect', 'disconnect' or 'replace'"}
        try:
            result = await self.services.engine.reconfigure(
                switch, connect=command.connect or (), disconnect=command.disconnect or (),
                replace=command.replace,
                cause="api", verify_light=command.verify_light)
        except RequestError as exc:
            return {"request_id": command.id, "error": str(exc)}
        return {"request_id": command.id, **result.as_dict()}
