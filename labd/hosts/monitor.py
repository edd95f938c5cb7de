"""What the daemon knows of the GPU hosts, from their agents over MQTT: status, heartbeats,
each GPU's health. A host is lost when its agent's last will says ``offline`` or when its
heartbeats stop for 1.5 intervals; a GPU whose verdict turns ``failed`` is a failure report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from labd.errors import PayloadError
from labd.events import Event, EventHub
from labd.mqtt.payload import loads

log = logging.getLogger(__name__)

MISSED = 1.5
#: A watchdog this late (or less) was on time: timers are not exact.
LATE_NS = 5_000_000
#: How long an overdue host is given for messages already on their way in to be read.
SETTLE_S = 0.02
HEALTH = ("healthy", "degraded", "failed")
#: The most GPUs a heartbeat may list (a lab file allows 64 per host).
MAX_GPUS = 256


@dataclass
class HostState:
    id: str
    status: str = "unknown"  # online, offline, lost, unknown
    last_beat_ns: int | None = None
    """When the last heartbeat arrived (daemon clock)."""
    last_sent_ns: int | None = None
    """When the agent sent it, on the daemon's clock (see ``offset_ns``)."""
    interval_s: float | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    nics: dict[str, bool] = field(default_factory=dict)
    nic_since_ns: dict[str, int] = field(default_factory=dict)
    """When each NIC's link last changed, by the agent's clock."""
    error: str | None = None
    offset_ns: int | None = None
    """Daemon clock minus the agent's, at most: the smallest (received - sent) seen. Agents
    stamp what they observe on their own CLOCK_MONOTONIC, which another machine does not
    share; this puts those moments on the daemon's clock (late by the fastest delivery)."""

    def to_daemon_clock(self, agent_ns: Any) -> int | None:
        if not isinstance(agent_ns, int):
            return None
        return agent_ns + (self.offset_ns or 0)

    def _saw(self, sent_ns: Any) -> None:
        if isinstance(sent_ns, int):
            lag = time.monotonic_ns() - sent_ns
            self.offset_ns = lag if self.offset_ns is None else min(self.offset_ns, lag)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "last_beat_ns": self.last_beat_ns,
                "interval_s": self.interval_s, "gpus": self.gpus, "nics": self.nics,
                "error": self.error}

    def gpu_health(self, index: int) -> str | None:
        """The GPU's latest verdict from the heartbeats, if reported."""
        return next((g.get("health") for g in self.gpus if g.get("index") == index), None)


class HostListener(Protocol):
    """Who acts on what hosts report (the job manager): called with every host event as it
    is published, so that nothing it must act on can be lost to a slow event stream."""

    def host_event(self, event: Event) -> None: ...


class HostMonitor:
    def __init__(self, hub: EventHub, hosts: list[str]) -> None:
        self.hub = hub
        self._listeners: list[HostListener] = []
        self.hosts = {h: HostState(h) for h in hosts}

    def listen(self, listener: HostListener) -> None:
        """Call ``listener.host_event`` with every host event from now on."""
        self._listeners.append(listener)

    def unlisten(self, listener: HostListener) -> None:
        """No more host events for ``listener`` (a run that is ending: its hosts' goodbyes
        are no failures)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _publish(self, kind: str, data: dict[str, Any]) -> None:
        event = self.hub.publish(kind, data)
        for listener in self._listeners:
            try:
                listener.host_event(event)
            except Exception as exc:  # a listener's bug must not stop the agents' messages
                log.exception("a listener of host events failed on %s", event.kind)
                self.hub.publish("warning", {"detail": (
                    f"{event.kind} from host {event.data.get('host')} was not acted on: "
                    f"{type(exc).__name__}: {exc}")})

    def handle(self, host: str, kind: str, payload: bytes) -> str | None:
        """One agent message (``status``, ``heartbeat`` or ``events``); a malformed one is
        reported as a warning event, changes nothing, and its problem is returned."""
        if kind == "job":
            return None  # the daemon's own commands to the agent
        state = self.hosts.get(host)
        if state is None:  # nothing kept for names a sender makes up
            return self._bad(host, kind, "the lab has no such host")
        if kind == "status":
            text = payload.decode(errors="replace").strip()
            if not text:
                return None  # a retained status being cleared
            if text not in ("online", "offline"):
                return self._bad(host, kind, f"status {text!r} is not online or offline")
            self._set_status(state, text)
            return None
        try:
            data = loads(payload, what="it")
        except PayloadError as exc:
            return self._bad(host, kind, str(exc))
        if not isinstance(data, dict):
            return self._bad(host, kind, "not a JSON object")
        state._saw(data.get("sent_ns"))
        if kind == "heartbeat":
            gpus = data.get("gpus")
            if not isinstance(gpus, list) or len(gpus) > MAX_GPUS or not all(
                    isinstance(g, dict) and type(g.get("index")) is int
                    and g.get("health") in HEALTH for g in gpus):
                return self._bad(host, kind, f"'gpus' must be a list of at most {MAX_GPUS} "
                                             "{'index': n, 'health': ...}")
            state.last_beat_ns = time.monotonic_ns()
            state.last_sent_ns = state.to_daemon_clock(data.get("sent_ns"))
            interval = data.get("interval_s")
            # Bounded: the loss deadline is worked out from it (inf would stop the watch).
            state.interval_s = float(interval) if isinstance(interval, int | float) and (
                0 < interval <= 3600) else None
            error = data.get("error")
            state.gpus, state.error = gpus, None if error is None else str(error)[:1000]
            nics = data.get("nics")
            if isinstance(nics, dict):
                state.nics = {str(k): bool(v) for k, v in nics.items()}
            if state.status != "online":
                self._set_status(state, "online")
        elif kind == "events" and "job" in data:
            return self._job_event(host, data)
        elif kind == "events" and "nic" in data:
            if not isinstance(data.get("up"), bool) or not isinstance(data["nic"], str):
                return self._bad(host, kind,
                                 "a NIC event needs 'nic' (a name) and 'up' (true/false)")
            state.nics[data["nic"]] = data["up"]
            if isinstance(data.get("at_ns"), int):
                state.nic_since_ns[data["nic"]] = data["at_ns"]
            self._publish("nic.link", {"host": host, "nic": data["nic"], "up": data["up"],
                                          "was": data.get("was"), "at_ns": data.get("at_ns")})
        elif kind == "events":
            if data.get("health") not in HEALTH or type(data.get("gpu")) is not int:
                return self._bad(host, kind, "expected 'gpu' (an index) and 'health'")
            # The verdict holds from now, before the next heartbeat repeats it.
            entry = next((g for g in state.gpus if g.get("index") == data["gpu"]), None)
            if entry is None:
                state.gpus.append({"index": data["gpu"], "health": data["health"]})
            else:
                entry["health"] = data["health"]
            self._publish("gpu.health", {"host": host, **{k: data.get(k) for k in (
                "gpu", "health", "was", "reasons", "at_ns", "since_ns")}})
        return None

    def _job_event(self, host: str, data: dict[str, Any]) -> str | None:
        if data.get("error") is not None:
            self._publish("job.error", {"host": host, "job": data.get("job"),
                                           "epoch": data.get("epoch"), "rank": data.get("rank"),
                                           "error": str(data["error"])})
            return None
        if (not isinstance(data.get("job"), str) or not isinstance(data.get("rank"), int)
                or not isinstance(data.get("epoch"), int)
                or data.get("progress") not in ("started", "ready", "step", "exited")):
            return self._bad(host, "events", "a job event needs 'job', 'epoch', 'rank' and "
                                             "'progress' (started, ready, step or exited)")
        self._publish("job.progress", {"host": host, **{k: data.get(k) for k in (
            "job", "epoch", "rank", "progress", "step", "code", "at_ns")}})
        return None

    def _set_status(self, state: HostState, status: str) -> None:
        if state.status == status:
            return
        before, state.status = state.status, status
        kind = "host.lost" if status in ("offline", "lost") and before == "online" else \
            "host.status"
        self._publish(kind, {"host": state.id, "status": status, "was": before,
                                "last_beat_ns": state.last_beat_ns,
                                "last_sent_ns": state.last_sent_ns})

    def _bad(self, host: str, kind: str, why: str) -> str:
        detail = f"bad {kind} message from host {host}: {why}"
        self._publish("warning", {"detail": detail})
        return detail

    async def run(self) -> None:
        """Declare hosts lost 1.5 intervals after their last heartbeat was sent, until
        cancelled (the daemon runs it among its background loops): the timer is set for the
        earliest such moment, so a host that dies is declared lost within 1.5 intervals of
        its death, not a polling period later.

        Silence the daemon could not hear is not the host's: when this loop wakes later
        than it asked (a loaded machine gave the process no CPU, or the loop was busy), that
        lateness is added to every host's allowance until its next heartbeat; so is the
        delay its recent heartbeats took to arrive (a busy broker), up to one more
        allowance; and a host past its deadline gets one more look once the messages
        already received are read."""
        watches: dict[str, _Watch] = {}
        planned = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            late = max(0, now - planned - LATE_NS)
            due: list[int] = []
            overdue: list[tuple[HostState, int]] = []
            for state in self.hosts.values():
                last = state.last_sent_ns or state.last_beat_ns
                if state.status != "online" or last is None or not state.interval_s:
                    watches.pop(state.id, None)
                    continue
                watch = watches.get(state.id)
                if watch is None or watch.last != last:
                    lag = max(0, (state.last_beat_ns or last) - last)
                    watch = watches[state.id] = _Watch(
                        last, slow_ns=max(lag, watch.slow_ns // 2 if watch else 0))
                watch.deaf_ns += late
                allowance = int(MISSED * state.interval_s * 1e9)
                deadline = last + allowance + watch.deaf_ns + min(watch.slow_ns, allowance)
                if now >= deadline:
                    overdue.append((state, last))
                else:
                    due.append(deadline)
            if overdue:
                # What the bridge has received but not yet handed over is read first.
                await asyncio.sleep(SETTLE_S)
                for state, last in overdue:
                    if (state.last_sent_ns or state.last_beat_ns) == last \
                            and state.status == "online":
                        self._set_status(state, "lost")
                now = time.monotonic_ns()
            # Look again at the earliest deadline (a heartbeat meanwhile only moves it on).
            wait_ns = min(due, default=now + 1_000_000_000) - now
            wait_s = min(max(wait_ns / 1e9, 0.001), 1.0)
            planned = now + int(wait_s * 1e9)
            await asyncio.sleep(wait_s)


@dataclass
class _Watch:
    """The watchdog's view of one host since its last heartbeat."""

    last: int
    """When that heartbeat was sent (daemon clock)."""
    deaf_ns: int = 0
    """How much later than planned the watchdog woke since: time it could not listen."""
    slow_ns: int = 0
    """How late heartbeats have been arriving lately (halved at each new one)."""


class CommandQueues:
    """Job commands for agents that reach the daemon over HTTP: each host's agent
    long-polls ``GET /v1/agents/{host}/commands`` and gets them in order."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}

    def _queue(self, host: str) -> asyncio.Queue[dict[str, Any] | None]:
        return self._queues.setdefault(host, asyncio.Queue())

    async def send(self, host: str, message: dict[str, Any]) -> None:
        self._queue(host).put_nowait(message)

    def close(self) -> None:
        """The daemon is stopping: answer every waiting poll now (with nothing)."""
        for queue in self._queues.values():
            queue.put_nowait(None)

    async def take(self, host: str, wait_s: float) -> list[dict[str, Any]]:
        """What is waiting for ``host``, waiting up to ``wait_s`` for the first."""
        queue = self._queue(host)
        try:
            async with asyncio.timeout(wait_s):
                first = await queue.get()
        except TimeoutError:
            return []
        out = [first]
        while not queue.empty():
            out.append(queue.get_nowait())
        return [m for m in out if m is not None]
