"""What the daemon knows of the GPU hosts, from their agents over MQTT: status, heartbeats,
each GPU's health. A host is lost when its agent's last will says ``offline`` or when its
heartbeats stop for 1.5 intervals; a GPU whose verdict turns ``failed`` is a failure report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from labd.hub import EventHub

MISSED = 1.5


@dataclass
class HostState:
    id: str
    status: str = "unknown"  # online, offline, lost, unknown
    last_beat_ns: int | None = None
    interval_s: float | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    nics: dict[str, bool] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "last_beat_ns": self.last_beat_ns,
                "interval_s": self.interval_s, "gpus": self.gpus, "nics": self.nics,
                "error": self.error}


class HostMonitor:
    def __init__(self, hub: EventHub, hosts: list[str]) -> None:
        self.hub = hub
        self.hosts = {h: HostState(h) for h in hosts}
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name="labd-host-watchdog")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    def handle(self, host: str, kind: str, payload: bytes) -> None:
        """One agent message (``status``, ``heartbeat`` or ``events``); a malformed one is
        reported as a warning event and changes nothing."""
        state = self.hosts.setdefault(host, HostState(host))
        if kind == "status":
            text = payload.decode(errors="replace").strip()
            if text not in ("online", "offline"):
                if text:
                    self._bad(host, kind, f"status {text!r} is not online or offline")
                return
            self._set_status(state, text)
            return
        try:
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self._bad(host, kind, f"not JSON: {exc}")
            return
        if kind == "heartbeat":
            gpus = data.get("gpus")
            if not isinstance(gpus, list):
                self._bad(host, kind, "'gpus' must be a list")
                return
            state.last_beat_ns = time.monotonic_ns()
            interval = data.get("interval_s")
            state.interval_s = float(interval) if isinstance(interval, int | float) else None
            state.gpus, state.error = gpus, data.get("error")
            nics = data.get("nics")
            if isinstance(nics, dict):
                state.nics = {str(k): bool(v) for k, v in nics.items()}
            if state.status != "online":
                self._set_status(state, "online")
        elif kind == "events" and "nic" in data:
            if not isinstance(data.get("up"), bool) or not isinstance(data["nic"], str):
                self._bad(host, kind, "a NIC event needs 'nic' (a name) and 'up' (true/false)")
                return
            state.nics[data["nic"]] = data["up"]
            self.hub.publish("nic.link", {"host": host, "nic": data["nic"], "up": data["up"],
                                          "was": data.get("was"), "at_ns": data.get("at_ns")})
        elif kind == "events":
            if data.get("health") not in ("healthy", "degraded", "failed") or not isinstance(
                    data.get("gpu"), int):
                self._bad(host, kind, "expected 'gpu' (an index) and 'health'")
                return
            self.hub.publish("gpu.health", {"host": host, **{k: data.get(k) for k in (
                "gpu", "health", "was", "reasons", "at_ns")}})

    def _set_status(self, state: HostState, status: str) -> None:
        if state.status == status:
            return
        before, state.status = state.status, status
        kind = "host.lost" if status in ("offline", "lost") and before == "online" else \
            "host.status"
        self.hub.publish(kind, {"host": state.id, "status": status, "was": before})

    def _bad(self, host: str, kind: str, why: str) -> None:
        self.hub.publish("warning", {"detail": f"bad {kind} message from host {host}: {why}"})

    async def _watch(self) -> None:
        """Declare hosts lost whose heartbeats stopped for 1.5 intervals."""
        while True:
            now = time.monotonic_ns()
            for state in self.hosts.values():
                if (state.status == "online" and state.last_beat_ns is not None
                        and state.interval_s
                        and now - state.last_beat_ns > MISSED * state.interval_s * 1e9):
                    self._set_status(state, "lost")
            intervals = [s.interval_s for s in self.hosts.values() if s.interval_s]
            await asyncio.sleep(min(intervals, default=1.0) / 10)
