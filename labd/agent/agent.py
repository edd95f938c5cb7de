"""``labd agent``: runs on each GPU host and reports over MQTT.

Topics (``<lab>`` and ``<host>`` as in the lab file):

``labd/<lab>/hosts/<host>/status``     retained: ``online``; ``offline`` as the last will
``labd/<lab>/hosts/<host>/heartbeat``  every ``interval`` s: the host's GPUs and verdicts
``labd/<lab>/hosts/<host>/events``     when a GPU's verdict changes, a NIC's link changes,
                                       or a job makes progress (labd.agent.jobs)
``labd/<lab>/hosts/<host>/job``        the daemon's commands: start/stop a job (subscribed)

The daemon reads them: a GPU that turns ``failed`` is a failure report; a host whose status
goes ``offline`` or whose heartbeats stop for 1.5 intervals is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiomqtt

from labd.agent.backends import Backend
from labd.agent.health import Health, Verdict, classify_host
from labd.agent.jobs import JobRunner
from labd.agent.nics import Nics
from labd.agent.smi import SmiError
from labd.bus import NO_DELAY, parse_url


class Agent:
    def __init__(self, *, lab: str, host: str, mqtt: str, backend: Backend,
                 interval: float = 1.0, expected_gpus: int | None = None,
                 nics: Nics | None = None, nic_poll_s: float = 0.005,
                 jobs: dict[str, list[str]] | None = None) -> None:
        self.lab, self.host = lab, host
        self.broker = parse_url(mqtt)
        self.backend = backend
        self.interval = interval
        self.expected = expected_gpus
        self.prefix = f"labd/{lab}/hosts/{host}"
        self.verdicts: dict[int, Verdict] = {}
        self.nics = nics
        self.nic_poll_s = nic_poll_s
        self.links: dict[str, bool] = {}
        self.beats = 0
        self.ready = asyncio.Event()
        self.jobs = JobRunner(host, jobs or {}, self.emit)
        # Events wait here while the broker is away and go out in order once it is back.
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def emit(self, event: dict[str, Any]) -> None:
        self._outbox.put_nowait({"host": self.host, "at_ns": time.monotonic_ns(), **event})

    def stamp(self, message: dict[str, Any]) -> bytes:
        """The message as sent, with when (lets the daemon place our clock on its own)."""
        return json.dumps({**message, "sent_ns": time.monotonic_ns()}).encode()

    async def snapshot(self) -> dict[str, Any]:
        try:
            gpus, lost = await self.backend.gpus()
            error = None
        except SmiError as exc:
            gpus, lost, error = [], exc.lost, str(exc)
        verdicts = classify_host(gpus, self.expected)
        by_index = {g.index: g for g in gpus}
        return {
            "host": self.host, "at_ns": time.monotonic_ns(), "lost_gpu": lost,
            "error": error, "interval_s": self.interval,
            "gpus": [{"index": i, "health": v.health.value, "reasons": list(v.reasons),
                      "uuid": by_index[i].uuid if i in by_index else None}
                     for i, v in sorted(verdicts.items())],
            "_verdicts": verdicts,
        }

    async def run(self) -> None:
        """Report until cancelled; reconnect to the broker by itself."""
        will = aiomqtt.Will(f"{self.prefix}/status", "offline", qos=1, retain=True)
        delay = 0.1
        while True:
            try:
                async with aiomqtt.Client(*self.broker, will=will, socket_options=NO_DELAY,
                                          identifier=f"labd-agent-{self.host}") as client:
                    delay = 0.1
                    await client.publish(f"{self.prefix}/status", "online", qos=1, retain=True)
                    self.ready.set()
                    try:
                        await self._session(client)
                    except asyncio.CancelledError:
                        # A clean stop sends no last will: say it ourselves.
                        with contextlib.suppress(aiomqtt.MqttError):
                            await client.publish(f"{self.prefix}/status", "offline", qos=1,
                                                 retain=True)
                        raise
            except aiomqtt.MqttError:
                self.ready.clear()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _session(self, client: aiomqtt.Client) -> None:
        try:
            await client.subscribe(f"{self.prefix}/job", qos=1)
            async with asyncio.TaskGroup() as group:
                group.create_task(self._report(client))
                group.create_task(self._send_events(client))
                group.create_task(self._commands(client))
                if self.nics is not None:
                    group.create_task(self._watch_links())
        except* aiomqtt.MqttError as errors:
            raise errors.exceptions[0] from None  # the broker went away: reconnect

    async def _send_events(self, client: aiomqtt.Client) -> None:
        while True:
            event = await self._outbox.get()
            try:
                await client.publish(f"{self.prefix}/events", self.stamp(event), qos=1)
            finally:
                self._outbox.task_done()

    async def _commands(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload
            await self.jobs.handle(payload if isinstance(payload, bytes) else
                                   str(payload).encode())

    async def _report(self, client: aiomqtt.Client) -> None:
        while True:
            snap = await self.snapshot()
            verdicts: dict[int, Verdict] = snap.pop("_verdicts")
            for index, verdict in sorted(verdicts.items()):
                before = self.verdicts.get(index)
                if before is None or before.health != verdict.health:
                    await self.emit({
                        "gpu": index, "health": verdict.health.value,
                        "reasons": list(verdict.reasons), "at_ns": snap["at_ns"],
                        "since_ns": self.backend.since_ns(index),
                        "was": before.health.value if before else None})
            self.verdicts = verdicts
            # Events first: a message right behind another to the same subscriber can wait
            # for a delayed ACK at a broker without TCP_NODELAY; a heartbeat can afford it.
            await self._outbox.join()
            snap["nics"] = dict(self.links)
            await client.publish(f"{self.prefix}/heartbeat", self.stamp(snap), qos=0)
            self.beats += 1
            await self.backend.wait_change(self.interval)

    async def _watch_links(self) -> None:
        """Poll carrier often (a link coming up is a recovery milestone worth timing) and
        report each change at once."""
        assert self.nics is not None
        while True:
            now = time.monotonic_ns()
            for nic, up in self.nics.links().items():
                if self.links.get(nic) != up:
                    was = self.links.get(nic)
                    self.links[nic] = up
                    await self.emit({"nic": nic, "up": up, "was": was, "at_ns": now})
            await asyncio.sleep(self.nic_poll_s)

    def failed(self) -> list[int]:
        return [i for i, v in self.verdicts.items() if v.health is Health.FAILED]


async def run_agent(agent: Agent, stop: asyncio.Event) -> None:
    task = asyncio.create_task(agent.run(), name=f"agent-{agent.host}")
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await agent.jobs.close()
