"""What a test holds of the session's lab, made on the test's own event loop: the daemon's
API client (labd.client.api.DaemonClient) and, where the lab is emulated, the emulators'
control endpoint (:class:`Emulators`); and what the plugin puts back after each test
(:class:`LabState`), so that every test starts from the lab as the session found it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from labd import deadlines
from labd.client.api import DaemonClient
from labd.client.control import Backdoor
from labd.errors import DaemonError

#: The timing fields the control endpoint takes back (``PUT /v1/emulators/{id}/timing``).
TIMING_FIELDS = ("switch_time_ms", "jitter_ms", "per_pair_ms", "seed")


class Emulators(Backdoor):
    """The emulators' control endpoint (docs/emulators.md): faults (``inject``,
    ``clear_faults``), ground truth (``truth``, ``light``), timing, power and the emulated
    GPU hosts, and where each emulated instrument listens (``addresses``)."""

    def __init__(self, url: str, addresses: Mapping[str, str]) -> None:
        super().__init__(url)
        self.addresses = dict(addresses)
        """Instrument id → the address its emulator listens on (what the daemon dials)."""

    async def emulators(self) -> list[dict[str, Any]]:
        """Every emulator: kind, endpoints, timing, faults, power and state."""
        result: list[dict[str, Any]] = await self._call("GET", "/v1/emulators")
        return result

    async def hosts(self) -> list[dict[str, Any]]:
        """The emulated GPU hosts: alive, failures, heartbeats, links."""
        result: list[dict[str, Any]] = await self._call("GET", "/v1/hosts")
        return result


async def wait_for_state(client: DaemonClient, instruments: Iterable[str],
                         state: str = "online", *, timeout: float | None = None) -> None:
    """Return once every one of ``instruments`` is in ``state`` as the daemon's event stream
    tells it (its snapshot, then ``instrument.*`` events); DaemonError once ``timeout`` s
    (default: the ``resync`` deadline, labd.deadlines) pass first, naming those behind."""
    wanted = set(instruments)
    timeout = deadlines.current().of("resync") if timeout is None else timeout
    states: dict[str, str] = {}
    # The stream's socket closed on leaving, not whenever the generator is collected.
    stream = cast("AsyncGenerator[dict[str, Any], None]", client.events())
    try:
        async with asyncio.timeout(timeout):
            async with contextlib.aclosing(stream):
                async for message in stream:
                    data = message.get("data") or {}
                    if message.get("kind") == "snapshot":
                        states = {i["id"]: i["state"] for i in message["instruments"]}
                    elif str(message.get("kind")).startswith("instrument.") and data.get(
                            "state"):
                        states[str(data["instrument"])] = str(data["state"])
                    if all(states.get(i) == state for i in wanted):
                        return
    except TimeoutError:
        behind = ", ".join(f"{i} ({states.get(i, 'unknown')})" for i in sorted(wanted)
                           if states.get(i) != state)
        raise DaemonError(deadlines.timed_out(timeout, f"{behind} to be {state}")) from None


@dataclass
class LabState:
    """What a test may change, read before it: which instruments were online, the circuits
    the daemon intended on each switch, and (emulated) every emulator's and emulated host's
    state."""

    online: set[str]
    intended: dict[str, list[list[int]]]
    emulators: list[dict[str, Any]] | None = None
    hosts: list[dict[str, Any]] | None = None

    @classmethod
    async def read(cls, client: DaemonClient, emulators: Emulators | None) -> LabState:
        instruments = await client.get("/v1/instruments")
        intended = {}
        for item in instruments:
            if item["kind"] == "switch":
                intended[item["id"]] = (await client.get(f"/v1/switches/{item['id']}"))[
                    "intended"]
        online = {i["id"] for i in instruments if i["state"] == "online"}
        if emulators is None:
            return cls(online, intended)
        return cls(online, intended, await emulators.emulators(), await emulators.hosts())

    async def put_back(self, client: DaemonClient, emulators: Emulators | None) -> None:
        """Undo what a test changed: faults cleared, emulators powered on again with their
        timing and failed ports restored, emulated hosts healed and revived; then, once
        every instrument that was online is online again, each switch's circuits as they
        were (one whole-map replacement where they differ)."""
        if emulators is not None:
            await self._put_back_emulators(emulators)
        states = {i["id"]: i["state"] for i in await client.get("/v1/instruments")}
        if any(states.get(i) != "online" for i in self.online):
            await wait_for_state(client, self.online)
        for switch, pairs in self.intended.items():
            now = (await client.get(f"/v1/switches/{switch}"))["intended"]
            if now == pairs:
                continue
            result = await client.put(f"/v1/switches/{switch}/connections",
                                      {"pairs": pairs, "verify_light": False})
            if result.get("outcome") != "ok":
                raise DaemonError(f"{switch}: its circuits could not be put back after the "
                                  f"test: {result.get('outcome')}: {result.get('error')}")

    async def _put_back_emulators(self, emulators: Emulators) -> None:
        now = {e["id"]: e for e in await emulators.emulators()}
        for before in self.emulators or []:
            key, after = before["id"], now.get(before["id"])
            if after is None:
                continue
            # Always: a meter's fault and a dead heater are state, not a queued fault.
            await emulators.clear_faults(key)
            if before.get("powered", True) and not after.get("powered", True):
                await emulators.power(key, True)
            timing_was, timing_now = before.get("timing"), after.get("timing")
            if timing_was and timing_now and any(
                    timing_was.get(f) != timing_now.get(f) for f in TIMING_FIELDS):
                await emulators.set_timing(key, **{f: timing_was[f] for f in TIMING_FIELDS
                                                   if timing_was.get(f) is not None})
            ports_was = (before.get("state") or {}).get("ports") or {}
            ports_now = (after.get("state") or {}).get("ports") or {}
            for port, state in ports_now.items():
                if state == "F" and ports_was.get(port) != "F":
                    await emulators.inject(key, {"kind": "restore_port", "port": int(port)})
        hosts_now = {h["id"]: h for h in await emulators.hosts()}
        for before in self.hosts or []:
            after = hosts_now.get(before["id"])
            if after is None:
                continue
            if before["alive"] and not after["alive"]:
                await emulators.revive_host(before["id"])
            elif after["failures"] and not before["failures"]:
                await emulators.heal(before["id"])
