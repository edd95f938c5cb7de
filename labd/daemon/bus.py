"""The daemon on its MQTT broker: events out, retained state, liveness, and what comes in.

Topics under ``<root>`` (``labd/<lab>`` or ``labd/<lab>@<instance>``, labd.mqtt.topics):
events on ``events/<kind>``, retained state on ``state/...``, the daemon's liveness on
``daemon`` (``online``; ``offline`` as its last will), switch commands on
``command/<switch>`` answered on ``command/<switch>/result`` (labd.daemon.bus_commands).
Nothing heard is believed unless sealed (labd.mqtt.envelope); a refused host message is a
warning event, rate-limited per sender (:class:`~labd.daemon.bus_commands.Complaints`).

Agent messages come in on a connection of their own (labd.hosts.feed) and are worked off
in slices of the loop's time; commands run as tasks of their own, at most
:data:`MAX_COMMANDS` at once. A probe through the broker every :data:`PROBE_S` is the
watchdog's evidence that the daemon hears its hosts in time (labd.hosts.watchdog). The
bridge reconnects by itself, with backoff; an error in its own loops restarts them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiomqtt

from labd.daemon.bus_commands import Complaints, SwitchCommands
from labd.errors import AlreadyTaken, BusError, unwrap
from labd.events import Event, Subscription
from labd.hosts.feed import PAUSE_AT, FeedProtocol, HostFeed, Message
from labd.mqtt.client import backoff, publish, session, subscribe
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Opener, Sealer
from labd.mqtt.topics import lab_root
from labd.repeats import Repeats

if TYPE_CHECKING:
    from labd.daemon.services import Services

log = logging.getLogger(__name__)

#: The most switch commands from the bus carried out at once; one more is refused.
MAX_COMMANDS = 64
#: How long one slice of agent messages may hold the loop before others get their turn.
SLICE_S = 0.002
#: How often the bridge probes its own path through the broker.
PROBE_S = 0.05
#: Events the bridge may have waiting for the broker before it starts over from a snapshot.
EVENT_QUEUE = 10_000


class MqttBridge:
    """The daemon on the broker ``settings`` name, for as long as ``run()`` runs."""

    def __init__(self, services: Services, settings: str | BusSettings) -> None:
        self.services = services
        self.settings = BusSettings.of(settings)
        self.host, self.port = self.settings.login()["hostname"], self.settings.login()["port"]
        self.prefix = lab_root(services.lab.lab.name, self.settings.instance)
        creds = self.settings.credentials
        self.connected = asyncio.Event()
        self.sessions = 0
        """Broker sessions so far (a reconnection makes a new one)."""
        self.restarts = 0
        """Times the bridge's own loops failed and were started again."""
        self._session_started = asyncio.Condition()
        self._client: aiomqtt.Client | None = None
        self._leaving = False
        # Seals are checked across reconnections: a replay after one is still a replay.
        self._hosts = Opener(creds.hosts.get)
        self._sealers: dict[str, Sealer] = {}
        self.complain = Complaints(services)
        self.switch_commands = SwitchCommands(services, Opener(creds.clients.get),
                                              self.complain)
        self._outage = Repeats(60.0)
        self._overflow = Repeats(60.0)
        self.queue_size = EVENT_QUEUE
        """Events waiting for the broker before the observers' stream starts over."""
        self.overflows = 0
        """Times the observers' stream fell behind and started over from a snapshot (the
        host feed and the session stay)."""
        self._confirming: dict[str, asyncio.Future[None]] = {}
        # Agent messages read off the broker and not yet handled, oldest first.
        self._inbox: collections.deque[Message] = collections.deque()
        # Per heartbeat topic, how many of its heartbeats wait in the inbox: all but the
        # newest are passed over (a heartbeat is the host's state, not a change).
        self._beats: dict[str, int] = {}
        self.passed_over = 0
        """Heartbeats not handled because a newer one of the same host was waiting."""
        self._draining = False
        self.drained = asyncio.Event()
        """Set while no agent message waits to be handled."""
        self.drained.set()
        self._feed: FeedProtocol | None = None
        services.hosts.backlog(lambda: len(self._inbox))
        self._probe_asked = asyncio.Event()
        services.hosts.prober(self._probe_asked.set)
        self._commands: set[asyncio.Task[None]] = set()
        self.max_commands = MAX_COMMANDS
        """The most commands from the bus carried out at once."""
        self._probes: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.taken = 0
        """Agent messages handled so far."""
        self.refused_commands = 0
        """Commands refused because :data:`MAX_COMMANDS` were in flight."""
        self.leading: Callable[[], bool] = lambda: True
        """Whether this daemon leads its lab (``--ha``): a standby only listens to the
        hosts (its watchdog stays warm) and says nothing on the lab's topics."""
        self._lead = asyncio.Event()

    async def wait_sessions(self, count: int, timeout: float) -> None:
        """Wait until the bridge has had ``count`` broker sessions."""
        async with asyncio.timeout(timeout), self._session_started:
            await self._session_started.wait_for(lambda: self.sessions >= count)

    async def send_to_host(self, host: str, message: dict[str, Any]) -> None:
        """A command for a host's agent (``<root>/hosts/<host>/job``), sealed with the
        host's key where the daemon has one."""
        client = self._client
        if client is None or not self.connected.is_set():
            raise BusError(f"cannot reach host {host}: the daemon is not connected to the "
                           f"MQTT broker {self.host}:{self.port}")
        topic = f"{self.prefix}/hosts/{host}/job"
        body = json.dumps(message)
        sealer = self._sealers.get(host)
        payload = sealer.seal(topic, body) if sealer is not None else body.encode()
        try:
            await publish(client, topic, payload, qos=1)
        except aiomqtt.MqttError as exc:
            raise BusError(f"cannot reach host {host}: {exc}") from None

    def lead(self) -> None:
        """This daemon took the lead: the next session is the leader's (the lab's topics,
        its state, commands and the last will), started at once."""
        self._lead.set()

    async def say_offline(self) -> None:
        """Say ``offline`` before leaving: a clean disconnect sends no last will. Not said
        by a daemon that does not lead (it would be false of the one that does)."""
        self._leaving = True
        if not self.leading():
            return
        if self._client is not None and self.connected.is_set():
            with contextlib.suppress(aiomqtt.MqttError):
                await publish(self._client, f"{self.prefix}/daemon", "offline", qos=1,
                              retain=True)

    async def run(self) -> None:
        """Stay on the broker until cancelled: reconnect with backoff when it goes, and
        start again (with a warning event) when the bridge's own code fails."""
        try:
            await self._run()
        finally:
            for task in list(self._commands):
                task.cancel()
            await asyncio.gather(*self._commands, return_exceptions=True)

    async def _run(self) -> None:
        tries = 0
        lost_at: float | None = None
        will = aiomqtt.Will(f"{self.prefix}/daemon", "offline", qos=1, retain=True)
        while True:
            leading = self.leading()
            try:
                async with session(**self.settings.login(), will=will if leading else None,
                                   identifier=f"labd-{secrets.token_hex(4)}") as client:
                    tries = 0
                    if lost_at is not None:
                        log.warning("MQTT broker %s:%d: back after %.1f s", self.host,
                                    self.port, time.monotonic() - lost_at)
                        lost_at = None
                    await self._session(client, leading)
            except _Leading:
                # At once, as the leader; deaf until its feed is back (heartbeats sent
                # meanwhile are gone): judged as any other time the link was down, or a host
                # whose heartbeat fell in the gap is lost as the watchdog starts.
                self.services.hosts.link_down("taking over: the bridge reconnects as the "
                                              "leader", agents_connected=True)
                continue
            except aiomqtt.MqttError as exc:
                # One line as the broker goes, one as it comes back; the tries between
                # are for whoever asks with -v (and a reminder now and then).
                told = self._outage.tell("broker")
                level = logging.WARNING if lost_at is None or told else logging.INFO
                log.log(level, "MQTT broker %s:%d: %s; %s", self.host, self.port, exc,
                        "still trying" if lost_at is not None else
                        "the daemon reconnects by itself, and judges no host until its "
                        "agents have had time to come back")
                lost_at = time.monotonic() if lost_at is None else lost_at
                self.services.hosts.link_down(str(exc) or type(exc).__name__)
            except Exception as exc:  # our own bug must not silence the bus for good
                self.restarts += 1
                log.exception("the MQTT bridge failed; starting it again")
                self.services.hub.publish("warning", {
                    "detail": f"the MQTT bridge failed ({type(exc).__name__}: {exc}); it "
                              "starts again by itself", "source": "mqtt"})
                self.services.hosts.link_down(f"the bridge failed: {type(exc).__name__}")
            self.connected.clear()
            await asyncio.sleep(backoff(tries))
            tries += 1

    async def _session(self, client: aiomqtt.Client, leading: bool = True) -> None:
        """One broker session. A standby's (not ``leading``) hears the hosts' topics and
        the probe, publishes nothing on the lab's topics and takes no commands; it ends
        (:class:`_Leading`) once the daemon leads."""
        snapshot, subscription = self.services.hub.subscribe(self.queue_size, who="mqtt") \
            if leading else ({}, None)
        self._client = client
        self._sealers = {host: Sealer("daemon", key)
                         for host, key in self.settings.credentials.hosts.items()}
        feed = HostFeed(self.settings, [f"{self.prefix}/hosts/+/+",
                                        f"{self.prefix}/daemon/probe"], self._take)
        try:
            if leading:
                await publish(client, f"{self.prefix}/daemon", "online", qos=1, retain=True)
                await self._publish_state(client, snapshot)
                await subscribe(client, f"{self.prefix}/command/+")
                await subscribe(client, f"{self.prefix}/daemon")
            async with feed.connected() as protocol:
                self._feed = protocol
                self.connected.set()
                async with self._session_started:
                    self.sessions += 1
                    self._session_started.notify_all()
                self.services.hosts.link_up()
                async with asyncio.TaskGroup() as group:
                    group.create_task(HostFeed.keep(protocol))
                    group.create_task(self._probe(client))
                    if subscription is not None:
                        group.create_task(self._forward(client, subscription))
                        group.create_task(self._messages(client))
                    else:
                        group.create_task(self._until_leading())
        except BaseExceptionGroup as group_error:  # one failure says why it ended
            raise unwrap(group_error, (aiomqtt.MqttError, _Leading)) from None
        finally:
            self._client = None
            self._feed = None
            if subscription is not None:
                subscription.close()

    async def _until_leading(self) -> None:
        await self._lead.wait()
        raise _Leading

    async def _publish_state(self, client: aiomqtt.Client, snapshot: dict[str, Any]) -> None:
        for instrument in snapshot["instruments"]:
            await publish(client, f"{self.prefix}/state/instruments/{instrument['id']}",
                          json.dumps(instrument), qos=1, retain=True)
        for switch, pairs in snapshot["intended"].items():
            await publish(client, f"{self.prefix}/state/switches/{switch}",
                          json.dumps({"intended": pairs}), qos=1, retain=True)

    async def _forward(self, client: aiomqtt.Client, subscription: Subscription) -> None:
        try:
            while True:
                event = await subscription.next()
                if event is None:  # fell behind: start over from a snapshot, same session
                    subscription = await self._resync(client, subscription)
                    continue
                await self._send_event(client, event)
        finally:
            subscription.close()

    async def _resync(self, client: aiomqtt.Client, dropped: Subscription) -> Subscription:
        """The observers' stream overflowed (a burst of events faster than the broker
        takes them): a fresh snapshot and subscription on the same session. The host feed
        is not touched, and no event is published about it: a warning event would go
        back into the very queue that overflowed, and overflow it again."""
        dropped.close()
        self.overflows += 1
        told = self._overflow.tell("overflow")
        if told is not None:
            log.warning("MQTT: the daemon's events came faster than the broker took them "
                        "(more than %d waiting); observers on the bus missed some and the "
                        "retained state was published again%s", self.queue_size,
                        told.suffix())
        snapshot, subscription = self.services.hub.subscribe(self.queue_size, who="mqtt")
        await self._publish_state(client, snapshot)
        return subscription

    async def _send_event(self, client: aiomqtt.Client, event: Event) -> None:
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

    async def _messages(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            payload = message.payload if isinstance(message.payload, bytes) else str(
                message.payload).encode()
            parts = topic.removeprefix(self.prefix + "/").split("/")
            try:
                if parts == ["daemon"]:
                    await self._about_us(client, payload)
                elif parts[0] == "command" and len(parts) == 2:
                    if len(self._commands) >= self.max_commands:
                        most = self.max_commands
                        self.refused_commands += 1
                        self.complain("commands in flight", f"command on {topic} refused: "
                                      f"{most} are being carried out")
                        await publish(client, f"{topic}/result", json.dumps({
                            "error": f"refused: the daemon is carrying out {most} "
                                     "commands from the bus already, the most it takes at "
                                     "once; nothing was changed: send it again once one "
                                     "is answered"}), qos=1)
                        continue
                    # A task of its own: a reconfiguration takes 100 ms or more with light
                    # verification, and nothing else on the bus may wait behind it.
                    task = asyncio.create_task(self._command(parts[1], payload, topic),
                                               name=f"labd-mqtt-command-{parts[1]}")
                    self._commands.add(task)
                    task.add_done_callback(self._commands.discard)
            except aiomqtt.MqttError:
                raise
            except Exception as exc:  # one message's trouble is not the bridge's end
                log.exception("MQTT message on %s could not be handled", topic,
                              extra={"topic": topic})
                self.complain(f"failed {parts[0]}", f"message on {topic} could not be "
                                                    f"handled: {type(exc).__name__}: {exc}")

    async def _command(self, switch: str, payload: bytes, topic: str) -> None:
        try:
            reply = await self.handle(switch, payload, topic=topic)
        except Exception as exc:  # answered, so that no sender waits forever
            log.exception("MQTT command on %s failed", topic,
                          extra={"instrument": switch, "topic": topic})
            reply = {"error": f"the daemon failed on this command: "
                              f"{type(exc).__name__}: {exc}"}
        client = self._client  # the session now, which may not be the one it came on
        if client is None or not self.connected.is_set():
            log.warning("the result of the command on %s is lost: the daemon is not "
                        "connected to the MQTT broker", topic,
                        extra={"instrument": switch, "topic": topic})
            return
        try:
            await publish(client, f"{topic}/result", json.dumps(reply), qos=1)
        except aiomqtt.MqttError as exc:
            log.warning("the result of the command on %s is lost: %s", topic, exc,
                        extra={"instrument": switch, "topic": topic})

    def _take(self, batch: list[Message]) -> None:
        """A batch of agent messages from the feed: kept in order, handled soon, in slices."""
        beats = self._beats
        for topic, _, _ in batch:
            if topic.endswith("/heartbeat"):
                beats[topic] = beats.get(topic, 0) + 1
        self._inbox.extend(batch)
        self.drained.clear()
        if len(self._inbox) >= PAUSE_AT and self._feed is not None:
            self._feed.pause(True)  # the broker holds the rest until we catch up
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Handle agent messages for up to :data:`SLICE_S`, then give the loop back (and
        come back for the rest): a backlog is worked off between the API's requests, not
        instead of them."""
        inbox, beats = self._inbox, self._beats
        end = time.perf_counter() + SLICE_S
        count = 0
        while inbox:
            topic, payload, retained = inbox.popleft()
            waiting = beats.get(topic)
            if waiting is not None:
                if waiting > 1:
                    # A daemon a heartbeat interval behind (a burst, a starved core) works
                    # off each host's newest heartbeat only: the backlog shrinks, however
                    # far behind it is, instead of being read in full, stale by the end.
                    beats[topic] = waiting - 1
                    self.passed_over += 1
                    continue
                del beats[topic]
            self.taken += 1
            try:
                self._from_feed(topic, payload, retained)
            except Exception as exc:  # one message's trouble is not the bridge's end
                log.exception("MQTT message on %s could not be handled", topic,
                              extra={"topic": topic})
                self.complain("failed hosts", f"message on {topic} could not be handled: "
                                              f"{type(exc).__name__}: {exc}")
            count += 1
            if count % 32 == 0 and time.perf_counter() > end:
                break
        if self._feed is not None and self._feed.paused and len(inbox) < PAUSE_AT // 2:
            self._feed.pause(False)
        if inbox:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._draining = False
            self.drained.set()

    def _from_feed(self, topic: str, payload: bytes | None, retained: bool) -> None:
        parts = topic.removeprefix(self.prefix + "/").split("/")
        if parts == ["daemon", "probe"]:
            self._probe_heard(payload or b"")
        elif len(parts) == 3 and parts[0] == "hosts":  # <root>/hosts/<host>/<kind>
            if payload is None:
                self.complain(f"host {parts[1]}", f"message on {topic} refused: larger than "
                                                  "the bus takes")
                return
            self._from_host(topic, parts[1], parts[2], payload, retained)

    async def _probe(self, client: aiomqtt.Client) -> None:
        """A word to ourselves through the broker every :data:`PROBE_S`, or at once when
        the watchdog asks (a host's time is up); heard back, it is the watchdog's evidence
        that what is sent now is read in time."""
        while True:
            self._probe_asked.clear()
            token = secrets.token_hex(8)
            self._probes[token] = time.monotonic_ns()
            while len(self._probes) > 64:  # the answers that never came are forgotten
                self._probes.popitem(last=False)
            await publish(client, f"{self.prefix}/daemon/probe", token, qos=0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_S):
                    await self._probe_asked.wait()

    def _probe_heard(self, payload: bytes) -> None:
        # Only our own, once each: anyone may publish here on an open broker, but only the
        # daemon knows the tokens (a replay of one already heard says nothing new).
        token = payload.decode(errors="replace")
        sent = self._probes.pop(token, None)
        if sent is not None:
            self.services.hosts.heard(sent)
        waiter = self._confirming.pop(token, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _round_trip(self, client: aiomqtt.Client) -> bool:
        """Whether a probe sent now comes back within a second: the broker delivers what
        is sent from now on (it is not, say, shutting down)."""
        token = secrets.token_hex(8)
        waiter = self._confirming[token] = asyncio.get_running_loop().create_future()
        try:
            await publish(client, f"{self.prefix}/daemon/probe", token, qos=0)
            async with asyncio.timeout(1.0):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            self._confirming.pop(token, None)

    def _from_host(self, topic: str, host: str, kind: str, payload: bytes,
                   retained: bool) -> None:
        if kind == "job" or (kind == "status" and not payload):
            return  # our own commands to the agent; a retained status being cleared
        if host not in self.services.hosts.hosts:
            # One key for them all: made-up host ids never grow the limiter's table.
            self.complain("unknown hosts", f"message on {topic} refused: the lab has no "
                                           f"host {host!r}")
            return
        if retained and kind != "status":
            # Only a status is kept by the broker for a late subscriber; a retained report
            # would be taken without the freshness check, so a caught one could be played.
            self.complain(f"host {host}", f"retained {kind} message on {topic} ignored: "
                                          "only a host's status is retained")
            return
        try:
            _, body = self._hosts.open(topic, payload, sender=host, retained=retained)
        except BusError as exc:  # refused, or too large or too deep to read
            if retained and isinstance(exc, AlreadyTaken):
                return  # the broker's copy of a status already taken, read again
            hint = "" if self.settings.credentials.hosts.get(host) else (
                f"; the daemon has no key for host {host}: give it --mqtt-credentials "
                "(labd broker-config LAB)")
            self.complain(f"host {host}", f"{kind} message for host {host} refused: {exc}"
                                          f"{hint}")
            return
        self.services.hosts.handle(host, kind, body.encode())

    async def _about_us(self, client: aiomqtt.Client, payload: bytes) -> None:
        """Someone else said the daemon is offline while it runs (an impostor, or a will
        delivered late): say it again, so that the lab's subscribers see the truth."""
        if payload == b"offline" and self.connected.is_set() and not self._leaving:
            # A broker shutting down delivers every client's last will, ours too: only
            # one that still delivers afterwards has been told something false.
            if not await self._round_trip(client):
                return
            self.complain("daemon topic", f"{self.prefix}/daemon was set to 'offline' (by "
                                          "another client, or a late last will of an earlier "
                                          "connection); said 'online' again")
            await publish(client, f"{self.prefix}/daemon", "online", qos=1, retain=True)

    async def handle(self, switch: str, payload: bytes | str, *,
                     topic: str | None = None) -> dict[str, Any]:
        """Carry out one sealed command (labd.daemon.bus_commands)."""
        return await self.switch_commands.handle(
            switch, payload, topic or f"{self.prefix}/command/{switch}")


class _Leading(Exception):
    """A standby's session ends: the daemon leads now, and the leader's session begins."""
