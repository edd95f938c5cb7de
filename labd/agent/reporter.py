"""``labd agent``: runs on each GPU host and reports to the daemon over MQTT (or, where a
lab has no broker, over HTTP: labd.agent.links).

Topics (``<lab>`` and ``<host>`` as in the lab file):

``labd/<lab>/hosts/<host>/status``     retained: ``online``; ``offline`` as the last will
``labd/<lab>/hosts/<host>/heartbeat``  every ``interval`` s: the host's GPUs and verdicts,
                                       its NICs' links and its jobs' runs (what the
                                       events announced, for a daemon that lost some)
``labd/<lab>/hosts/<host>/events``     when a GPU's verdict changes, a NIC's link changes,
                                       or a job makes progress (labd.agent.runner)
``labd/<lab>/hosts/<host>/job``        the daemon's commands: start/stop a job (subscribed)

Each message is a model of labd.hostwire, and the daemon reads it with the same model: a
GPU that turns ``failed`` is a failure report; a host whose status goes ``offline`` or whose
heartbeats stop for 1.5 intervals is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from labd.agent.backends import Backend
from labd.agent.health import Health, Verdict, classify_host
from labd.agent.links import AgentLink, command_opener, http_link, mqtt_link
from labd.agent.nics import NIC_POLL_S, Nics
from labd.agent.runner import JobRunner
from labd.errors import AgentError, LinkDown, SmiError, unwrap
from labd.hostwire import Event, GpuHealth, Heartbeat, Message, NicLink
from labd.mqtt.client import backoff
from labd.mqtt.credentials import BusSettings

log = logging.getLogger(__name__)

NEWS_BEATS = 3
"""Heartbeats that carry the jobs' runs after they changed, and after each new link: those
the daemon may have missed the events of (the broker died with them)."""
JOBS_EVERY = 10
"""And one heartbeat in this many, whatever happened: a daemon that lost its own link, or a
start the host never heard, is put right within as many intervals. In between the field
is left out (it would be read 4,096 times a second at a pod's size for no news)."""

OUTBOX_MAX = 10_000
"""Events kept for the daemon while it is out of reach; a minute-long outage on a busy
host queues tens (a few NIC changes, job progress at most once a second per rank)."""


class Agent:
    """One host's agent. It reports over MQTT (``mqtt``) or, where the lab has no broker,
    over HTTP to the daemon (``daemon`` URL and ``token``)."""

    def __init__(self, *, lab: str, host: str, backend: Backend,
                 mqtt: str | BusSettings | None = None,
                 daemon: str | None = None, token: str | None = None,
                 interval: float = 1.0, expected_gpus: int | None = None,
                 nics: Nics | None = None, nic_poll_s: float = NIC_POLL_S,
                 watch_links: bool = True,
                 jobs: dict[str, list[str]] | None = None) -> None:
        if (mqtt is None) == (daemon is None):
            raise AgentError("give the agent one way to the daemon: an MQTT broker, or the "
                             "daemon's URL (and token) where the lab has no broker")
        self.lab, self.host = lab, host
        # A bad URL is a clear error now, not a retry loop later.
        self.mqtt = BusSettings.of(mqtt) if mqtt is not None else None
        self._opener = command_opener(self.mqtt, host) if self.mqtt is not None else None
        self.daemon, self.token = daemon, token or ""
        self.backend = backend
        self.interval = interval
        self.expected = expected_gpus
        self.verdicts: dict[int, Verdict] = {}
        self.nics = nics
        self.nic_poll_s = nic_poll_s
        self.watch_links = watch_links
        """False: something else calls :meth:`check_links` (emulation, for many hosts at
        once: labd.emulation.emulators.EmulatedHosts)."""
        self.links: dict[str, bool] = {}
        self.beats = 0
        self.ready = asyncio.Event()
        self.jobs = JobRunner(host, jobs or {}, self.emit)
        # Events wait here while the daemon is out of reach and go out in order after.
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._held: Event | None = None
        """The event whose send a lost link cut off: the next session sends it first."""
        self._dropped = 0

    def queued(self) -> int:
        """Events not yet sent (the daemon out of reach, or the link slow)."""
        return self._outbox.qsize() + (self._held is not None)

    async def emit(self, event: Event) -> None:
        self.post(event)

    def post(self, event: Event) -> None:
        """Queue an event for the daemon (what :meth:`emit` does, from synchronous code).
        Past OUTBOX_MAX waiting (a long outage), the oldest goes, and the count is said."""
        if self._outbox.qsize() >= OUTBOX_MAX:
            self._outbox.get_nowait()
            self._outbox.task_done()
            self._dropped += 1
            if self._dropped == 1:
                log.warning("host %s: over %d events wait for the daemon; dropping the "
                            "oldest", self.host, OUTBOX_MAX, extra={"host": self.host})
        self._outbox.put_nowait(event.model_copy(update={
            "host": self.host, "at_ns": event.at_ns or time.monotonic_ns()}))

    def stamp(self, message: Message) -> bytes:
        """The message as sent, with when (lets the daemon place our clock on its own)."""
        return message.stamped(time.monotonic_ns())

    async def snapshot(self) -> tuple[Heartbeat, dict[int, Verdict]]:
        """The heartbeat as of now, and each GPU's verdict in it."""
        try:
            gpus, lost = await self.backend.gpus()
            error = None
        except SmiError as exc:
            gpus, lost, error = [], exc.lost, str(exc)
        verdicts = classify_host(gpus, self.expected)
        by_index = {g.index: g for g in gpus}
        # Built without validation: every field is the agent's own, of its declared type.
        beat = Heartbeat.model_construct(
            host=self.host, sent_ns=None, at_ns=time.monotonic_ns(), interval_s=self.interval,
            lost_gpu=lost, error=error, nics=None,
            gpus=[{"index": i, "health": v.health.value, "reasons": list(v.reasons),
                   "uuid": by_index[i].uuid if i in by_index else None}
                  for i, v in sorted(verdicts.items())])
        return beat, verdicts

    def _connect(self) -> contextlib.AbstractAsyncContextManager[AgentLink]:
        if self.mqtt is not None:
            return mqtt_link(self.mqtt, self.lab, self.host, self._opener)
        assert self.daemon is not None
        return http_link(self.daemon, self.token, self.host)

    async def run(self) -> None:
        """Report until cancelled; reconnect by itself (labd.mqtt.client.backoff). An
        outage is one warning as it begins and one line as it ends, whatever it lasts."""
        tries, said, lost_at = 0, "", None
        while True:
            try:
                async with self._connect() as link:
                    tries, said = 0, ""
                    if lost_at is not None:
                        log.warning("host %s reaches the daemon again, after %.1f s",
                                    self.host, time.monotonic() - lost_at,
                                    extra={"host": self.host})
                        lost_at = None
                    self.ready.set()
                    try:
                        await self._session(link)
                    except asyncio.CancelledError:
                        # A clean stop sends no last will: say it ourselves.
                        with contextlib.suppress(LinkDown):
                            await link.publish("status", b"offline")
                        raise
            except Exception as exc:
                if not isinstance(exc, LinkDown):  # a fault in one session ends only that one
                    log.exception("host %s: the agent's session failed; reconnecting", self.host,
                                  extra={"host": self.host})
                elif str(exc) != said:  # once per reason: a refused key must show, not spam
                    log.log(logging.WARNING if lost_at is None else logging.INFO,
                            "host %s cannot reach the daemon (%s); retrying", self.host,
                            exc, extra={"host": self.host})
                said = str(exc)
                lost_at = time.monotonic() if lost_at is None else lost_at
                self.ready.clear()
                await asyncio.sleep(backoff(tries))
                tries += 1

    async def _session(self, link: AgentLink) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._report(link))
                group.create_task(self._send_events(link))
                group.create_task(self._commands(link))
                if self.nics is not None and self.watch_links:
                    group.create_task(self._watch_links())
        except BaseExceptionGroup as errors:  # the daemon out of reach, most likely
            raise unwrap(errors, (LinkDown,)) from None

    async def _send_events(self, link: AgentLink) -> None:
        if self._dropped:
            log.warning("host %s: %d events were dropped while the daemon was out of reach",
                        self.host, self._dropped, extra={"host": self.host})
            self._dropped = 0
        while True:
            if self._held is None:
                self._held = await self._outbox.get()
            # Held until sent: a link lost in the send (LinkDown, or this session cancelled)
            # leaves it for the next one, in its place, first. Sent twice at worst, and
            # every report of an event is safe to take twice; lost, a rank's "started" made
            # its "exited" look like a rank that never ran.
            await link.publish("events", self.stamp(self._held))
            self._held = None
            self._outbox.task_done()

    async def _commands(self, link: AgentLink) -> None:
        async for payload in link.commands():
            await self.jobs.handle(payload)

    async def _report(self, link: AgentLink) -> None:
        # Heartbeats keep a fixed cadence (the daemon allows 1.5 intervals between them): the
        # time spent reading the GPUs and sending comes out of the wait, not on top of it.
        deadline = time.monotonic()
        news, told = NEWS_BEATS, self.jobs.version  # a new link: what was sent may be lost
        while True:
            snap, verdicts = await self.snapshot()
            changed = False
            for index, verdict in sorted(verdicts.items()):
                before = self.verdicts.get(index)
                if before is None or before.health != verdict.health:
                    changed = True
                    await self.emit(GpuHealth(
                        gpu=index, health=verdict.health.value,
                        reasons=list(verdict.reasons), at_ns=snap.at_ns,
                        since_ns=self.backend.since_ns(index),
                        was=before.health.value if before else None))
            self.verdicts = verdicts
            if changed:
                # A failure report goes before the heartbeat: a message right behind another
                # to the same subscriber can wait for a delayed ACK at a broker without
                # TCP_NODELAY, and the report is the one that must not wait. Bounded, so
                # that a slow link never costs a heartbeat.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval / 4):
                        await self._outbox.join()
            snap.nics = dict(self.links)
            # As of now: the progress its events announce, for a daemon that lost them.
            if self.jobs.version != told:
                news, told = NEWS_BEATS, self.jobs.version
            if news > 0 or self.beats % JOBS_EVERY == 0:
                snap.jobs = self.jobs.state()
                news -= 1
            await link.publish("heartbeat", self.stamp(snap), reliable=False)
            self.beats += 1
            # An early wake (a change) sends an extra heartbeat; the cadence stays.
            now = time.monotonic()
            while deadline <= now:
                deadline += self.interval
            await self.backend.wait_change(deadline - now)

    async def _watch_links(self) -> None:
        """Poll carrier often (a link coming up is a recovery milestone worth timing) and
        report each change at once."""
        while True:
            self.check_links()
            await asyncio.sleep(self.nic_poll_s)

    def check_links(self) -> None:
        """Read the NICs once; queue an event for each link that changed."""
        if self.nics is None:
            return
        now = time.monotonic_ns()
        for nic, up in self.nics.links().items():
            if self.links.get(nic) != up:
                was = self.links.get(nic)
                self.links[nic] = up
                self.post(NicLink(nic=nic, up=up, was=was, at_ns=now))

    def failed(self) -> list[int]:
        return [i for i, v in self.verdicts.items() if v.health is Health.FAILED]


async def run_agent(agent: Agent, stop: asyncio.Event) -> None:
    task = asyncio.create_task(agent.run(), name=f"agent-{agent.host}")
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await agent.jobs.close()
