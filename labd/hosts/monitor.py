"""What the daemon knows of the GPU hosts, from their agents: status, heartbeats, each GPU's
health, NIC links and job progress. Each message is read with the typed wire schema
(labd.hostwire); a malformed one is a warning event and changes nothing. Who acts on what
hosts report (the job manager) is called with typed reports (:class:`HostListener`); the
watchdog (labd.hosts.watchdog) says when a host is lost.

Built for a pod's thousands of hosts on one event loop: each host's JSON for
``GET /v1/hosts`` is kept and made again only when something in it but the heartbeat's
stamp changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from labd.errors import PayloadError
from labd.events import EventHub
from labd.hosts.commands import CommandQueues
from labd.hosts.state import STATUSES, HostState
from labd.hosts.watchdog import (
    LAG_SHARE,
    LATE_NS,
    MASS_HOSTS,
    MASS_SHARE,
    MISSED,
    RECONNECT_GRACE_S,
    SETTLE_S,
    TICK_S,
    UNSURE_AFTER,
    Watchdog,
)
from labd.hostwire import (
    HEALTH,
    MAX_GPUS,
    PROGRESS,
    GpuHealth,
    GpuVerdict,
    Heartbeat,
    JobError,
    JobProgress,
    NicLink,
    RunState,
    read_event,
    read_heartbeat,
)
from labd.vocabulary import EventKind

__all__ = ["HEALTH", "LAG_SHARE", "LATE_NS", "MASS_HOSTS", "MASS_SHARE", "MAX_GPUS", "MISSED",
           "RECONNECT_GRACE_S", "SETTLE_S", "STATUSES", "TICK_S", "UNSURE_AFTER",
           "CommandQueues", "HostListener", "HostMonitor", "HostState"]

log = logging.getLogger(__name__)

Tell = Callable[["HostListener", int], None]


class HostListener:
    """Who acts on what hosts report (the job manager): called with each report as its
    event is published, so that nothing it must act on can be lost to a slow event
    stream. ``at_ns`` is when the daemon learnt it (the event's stamp). Each does nothing
    here: a listener takes what it needs."""

    def gpu_health(self, host: HostState, report: GpuHealth, at_ns: int) -> None:
        """A GPU's verdict changed (``failed``: a failure report)."""

    def host_status(self, host: HostState, was: str, at_ns: int) -> None:
        """The host's status changed (``host.status`` is ``online``, or the host is lost:
        ``offline`` or ``lost`` after ``online``)."""

    def nic_link(self, host: HostState, report: NicLink, at_ns: int) -> None:
        """A NIC's link went up or down."""

    def job_progress(self, host: HostState, report: JobProgress, at_ns: int) -> None:
        """A rank of a job made progress."""


class HostMonitor(Watchdog):
    def __init__(self, hub: EventHub, hosts: list[str]) -> None:
        super().__init__(hub, hosts)
        self._listeners: list[HostListener] = []
        self._order = {h: i for i, h in enumerate(self.hosts)}

    def listen(self, listener: HostListener) -> None:
        """Tell ``listener`` every host report from now on."""
        self._listeners.append(listener)

    def unlisten(self, listener: HostListener) -> None:
        """No more host reports for ``listener`` (a run that is ending: its hosts' goodbyes
        are no failures)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def select(self, status: str | None = None, after: str | None = None,
               limit: int | None = None) -> Iterator[HostState]:
        """Hosts in lab-file order, those with ``status`` only, from the one after host
        ``after`` (KeyError if the lab has none), at most ``limit`` of them."""
        states = list(self.hosts.values())
        start = 0 if after is None else self._order[after] + 1
        taken = 0
        for state in states[start:]:
            if limit is not None and taken >= limit:
                return
            if status is None or state.status == status:
                taken += 1
                yield state

    def as_json(self, states: Iterator[HostState] | None = None) -> bytes:
        """A JSON array of hosts (default: all), each as ``HostState.as_json``."""
        chosen = self.hosts.values() if states is None else states
        parts = [b"["]
        for state in chosen:
            parts.extend(state.json_parts())
            parts.append(b", ")
        parts[-1] = b"]" if len(parts) > 1 else b"[]"
        return b"".join(parts)


    def _publish(self, kind: EventKind, data: dict[str, Any], tell: Tell | None = None) -> None:
        event = self.hub.publish(kind, data)
        if tell is None:
            return
        for listener in self._listeners:
            try:
                tell(listener, event.at_ns)
            except Exception as exc:  # a listener's bug must not stop the agents' messages
                log.exception("a listener of host events failed on %s from host %s", kind,
                              data.get("host"), extra={"host": data.get("host")})
                self.hub.publish(EventKind.WARNING, {"detail": (
                    f"{kind} from host {data.get('host')} was not acted on: "
                    f"{type(exc).__name__}: {exc}")})

    def handle(self, host: str, kind: str, payload: bytes) -> str | None:
        """One agent message (``status``, ``heartbeat`` or ``events``); a malformed one is
        reported as a warning event, changes nothing, and its problem is returned."""
        if kind == "job":
            return None  # the daemon's own commands to the agent
        state = self.hosts.get(host)
        if state is None:  # nothing kept for names a sender makes up
            return self._bad(host, kind, "the lab has no such host")
        try:
            if kind == "status":
                self._status(state, payload)
            elif kind == "heartbeat":
                self._heartbeat(state, read_heartbeat(payload))
            else:
                message = read_event(payload)
                state._saw(message.sent_ns)
                if isinstance(message, GpuHealth):
                    self._gpu_event(state, message)
                elif isinstance(message, NicLink):
                    self._nic_event(state, message)
                elif isinstance(message, JobError):
                    self._publish(EventKind.JOB_ERROR, {
                        "host": host, "job": message.job, "epoch": message.epoch,
                        "rank": message.rank, "error": message.error})
                else:
                    key = (message.job, message.run or "", message.rank, message.progress)
                    if key in state.heard and message.progress != "step":
                        return None  # told already, by a heartbeat that overtook it
                    if state.jobs is not None and message.run:
                        state.heard.add(key)
                    self._tell_progress(state, message)
        except PayloadError as exc:
            return self._bad(host, kind, str(exc))
        return None

    def _status(self, state: HostState, payload: bytes) -> None:
        text = payload.decode(errors="replace").strip()
        if not text:
            return  # a retained status being cleared
        if text not in ("online", "offline"):
            raise PayloadError(f"status {text!r} is not online or offline")
        if text == "offline" and state.status == "online" and self.probed:
            self._said_offline(state)
            return
        self._offline.pop(state.id, None)
        self._set_status(state, text)

    def _tell_progress(self, state: HostState, message: JobProgress, **more: Any) -> None:
        self._publish(EventKind.JOB_PROGRESS, {"host": state.id, **message.model_dump(
            include={"job", "epoch", "run", "rank", "progress", "step", "code", "at_ns"}),
            **more}, lambda who, at: who.job_progress(state, message, at))

    def _nic_event(self, state: HostState, message: NicLink) -> None:
        if message.at_ns is not None:
            state.nic_since_ns[message.nic] = message.at_ns
        if state.nics.get(message.nic, not message.up) == message.up:
            return  # told already, by a heartbeat that overtook this event (its time kept)
        state.nics[message.nic] = message.up
        state.version += 1
        self._tell_nic(state, message)

    def _tell_nic(self, state: HostState, message: NicLink, **more: Any) -> None:
        self._publish(EventKind.NIC_LINK, {"host": state.id, "nic": message.nic,
                                           "up": message.up, "was": message.was,
                                           "at_ns": message.at_ns, **more},
                      lambda who, at: who.nic_link(state, message, at))

    def _gpu_event(self, state: HostState, message: GpuHealth) -> None:
        # The verdict holds from now, before the next heartbeat repeats it.
        entry = next((g for g in state.gpus if g["index"] == message.gpu), None)
        if entry is not None and entry["health"] == message.health:
            return  # told already, by a heartbeat that overtook this event
        if entry is None:
            if len(state.gpus) >= MAX_GPUS:
                raise PayloadError(f"more than {MAX_GPUS} GPUs")
            state.gpus.append({"index": message.gpu, "health": message.health})
        else:
            entry["health"] = message.health
        state.version += 1
        self._tell_gpu(state, message)

    def _tell_gpu(self, state: HostState, message: GpuHealth, **more: Any) -> None:
        self._publish(EventKind.GPU_HEALTH, {"host": state.id, **message.model_dump(
            include={"gpu", "health", "was", "reasons", "at_ns", "since_ns"}), **more},
                      lambda who, at: who.gpu_health(state, message, at))

    def _heartbeat(self, state: HostState, beat: Heartbeat) -> None:
        sent = beat.sent_ns
        state._saw(sent)
        now = time.monotonic_ns()
        state.last_beat_ns = now
        state.last_sent_ns = state.to_daemon_clock(sent)
        if state.last_sent_ns is not None:
            # How late this one came (never less than nothing: the offset is a bound).
            state.slow_ns = max(now - state.last_sent_ns, state.slow_ns // 2)
            self._heard_at(min(state.last_sent_ns, now))
        else:
            state.slow_ns //= 2
        state.deaf_mark_ns = self.deaf_ns
        if self._awaited and self.link_down_since is None:
            self._awaited.discard(state.id)
            if not self._awaited and self._grace_until:
                self._grace_over(now)  # every host is back
        gpus, error, interval_s = beat.gpus, beat.error, beat.interval_s
        nic_map = state.nics if beat.nics is None else beat.nics
        # What most heartbeats say is what the last one said: kept as it is, so that the
        # host's JSON is not made again.
        told: list[GpuHealth] = []
        links: list[NicLink] = []
        if (gpus != state.gpus or nic_map != state.nics or error != state.error
                or interval_s != state.interval_s):
            if gpus != state.gpus:
                told = self._learnt(state.gpus, gpus)
            if nic_map != state.nics:
                # Heard first here when its event was lost (the broker died between
                # acknowledging it and delivering it): a recovery may wait for it. When
                # it changed is known to the heartbeat's send at most.
                links = [NicLink(nic=nic, up=up, was=state.nics.get(nic), at_ns=sent)
                         for nic, up in nic_map.items() if state.nics.get(nic) != up]
                if sent is not None:
                    for link in links:
                        state.nic_since_ns[link.nic] = sent
            state.gpus, state.nics, state.error = gpus, nic_map, error
            if interval_s != state.interval_s:
                self._unwatch(state)
                state.interval_s = interval_s
            state.version += 1
        if state.status != "online":
            self._set_status(state, "online")
        else:
            self._rewatch(state)
        progress: list[JobProgress] = []
        if beat.jobs is not None:  # said in some heartbeats only (None: no news)
            state.jobs_sent_ns = state.last_sent_ns
            if beat.jobs != state.jobs:
                progress = self._progress(state, beat.jobs)
        for verdict in told:
            self._tell_gpu(state, verdict, source="heartbeat")
        for link in links:
            self._tell_nic(state, link, source="heartbeat")
        for report in progress:
            self._tell_progress(state, report, source="heartbeat")

    @staticmethod
    def _progress(state: HostState, runs: list[RunState]) -> list[JobProgress]:
        """The progress a heartbeat tells the daemon first (its event was lost, or is still
        on its way), told as the event would have told it; what the daemon keeps of what
        it was told follows the runs the host lists."""
        state.jobs = runs
        listed = {(r["job"], r["run"]) for r in runs}
        heard = {k for k in state.heard if (k[0], k[1]) in listed}
        learnt = []
        for run in runs:
            for rank in run["ranks"]:
                at = rank["at"]
                for progress in PROGRESS:
                    key = (run["job"], run["run"], rank["rank"], progress)
                    if progress in at and key not in heard:
                        heard.add(key)
                        learnt.append(JobProgress(
                            job=run["job"], epoch=run["epoch"], run=run["run"],
                            rank=rank["rank"], progress=progress, at_ns=at[progress],
                            code=rank.get("code") if progress == "exited" else None))
        state.heard = heard
        return learnt

    @staticmethod
    def _learnt(before: list[GpuVerdict], now: list[GpuVerdict]) -> list[GpuHealth]:
        """The verdicts a heartbeat tells the daemon first (their event was sent while the
        daemon was not listening: it started after the agent, or the broker was away),
        told as the event would have told them."""
        known = {g["index"]: g["health"] for g in before}
        return [GpuHealth(gpu=g["index"], health=g["health"], was=known.get(g["index"]),
                          reasons=g.get("reasons") or [])
                for g in now if known.get(g["index"]) != g["health"]]

    def _set_status(self, state: HostState, status: str) -> None:
        if state.status == status:
            return
        before, state.status = state.status, status
        state.version += 1
        self._rewatch(state)
        lost = status in ("offline", "lost") and before == "online"
        if lost:
            self.lost_count += 1
        self._publish(EventKind.HOST_LOST if lost else EventKind.HOST_STATUS, {
            "host": state.id, "status": status, "was": before,
            "last_beat_ns": state.last_beat_ns, "last_sent_ns": state.last_sent_ns},
                      lambda who, at: who.host_status(state, before, at))

    def _bad(self, host: str, kind: str, why: str) -> str:
        detail = f"bad {kind} message from host {host}: {why}"
        self._publish(EventKind.WARNING, {"detail": detail})
        return detail
