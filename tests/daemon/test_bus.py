"""MQTT against a real Mosquitto (the session's, tests.broker): events, retained state, liveness,
commands, and bad command payloads."""

import asyncio
import json
import logging
import time

import aiomqtt
import httpx
import pytest

from labd.emulation.drill import hosts_ready, wait_for
from labd.emulation.rig import RIG_CLIENT, clear_retained
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer, new_key
from labd.mqtt.topics import lab_root, new_instance
from tests.broker import BROKER, MQTT, next_message, require_broker
from tests.labs import endpoint, host, switch, unique_name
from tests.rigs import StartRig, next_event

TOKEN = "bus-token"


async def test_events_state_liveness_and_commands(start_rig: StartRig) -> None:
    require_broker()
    name = unique_name("bus")  # known before the daemon starts, to watch it say online
    bus = BusSettings(MQTT, new_instance())
    prefix = lab_root(name, bus.instance)
    async with aiomqtt.Client(*BROKER) as watcher:
        await watcher.subscribe(f"{prefix}/#")
        messages = watcher.messages
        async with start_rig("bus", switch(technology="ideal"), name=name, mqtt=bus,
                             token=TOKEN) as rig:
            daemon, emulated = rig.daemon, rig.emulated
            assert emulated is not None
            assert (await next_message(messages, f"{prefix}/daemon")).payload == b"online"
            assert daemon.bus is not None
            await asyncio.wait_for(daemon.bus.connected.wait(), 10)
            async with httpx.AsyncClient(base_url=daemon.url,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
            event = json.loads((await next_message(
                messages, f"{prefix}/events/reconfiguration")).payload)
            assert event["data"]["connected"] == [[1, 9]]
            state = json.loads((await next_message(
                messages, f"{prefix}/state/switches/ocs1")).payload)
            assert state == {"intended": [[1, 9]]}

            topic = f"{prefix}/command/ocs1"
            assert rig.bus is not None
            sealer = Sealer(RIG_CLIENT, rig.bus.credentials.clients[RIG_CLIENT])
            stranger = Sealer(RIG_CLIENT, new_key())

            async def command(payload: bytes) -> dict:
                await watcher.publish(topic, payload)
                return json.loads((await next_message(messages, f"{topic}/result")).payload)

            def sealed(body: object) -> bytes:
                return sealer.seal(topic, json.dumps(body))

            replayed = sealed({"disconnect": [3]})
            await command(replayed)  # taken once (port 3 is in no circuit: an error)
            bad = [
                (b"{not json", "unsigned message"),
                (json.dumps({"token": TOKEN, "connect": [[2, 10]]}).encode(), "no 'mac'"),
                (stranger.seal(topic, json.dumps({"connect": [[2, 10]]})), "bad signature"),
                (replayed, "replayed message"),
                (sealer.seal(f"{prefix}/command/ocs2", json.dumps({"connect": [[2, 10]]})),
                 "bad signature"),  # moved to another switch's topic
                (sealed({"token": TOKEN, "connect": [[2, 10]]}), "tokens are not taken"),
                (sealed({"connect": "2-10"}), "connect"),
                (sealed({"connect": [["2", "10"]]}), "connect"),
                (sealed({"connect": [[True, 10]]}), "connect"),
                (sealed({"connect": []}), "connect"),
                (sealed({}), "exactly one of"),
                (sealed({"connect": [[2, 99]]}), "port 99 is not on this 8x8"),
                (sealed({"connect": [[2, 9]]}), "port 9 is already in circuit"),
                (b'["' * 100_000, "nests"),
                (sealer.seal(topic, "[" * 5_000), "nests"),
                (b"x" * 300_000, "at most"),
            ]
            for payload, words in bad:
                reply = await command(payload)
                assert words in (reply["error"] or ""), (payload[:80], reply)
            assert daemon.engine.intended["ocs1"] == {1: 9}  # nothing changed
            reply = await command(sealed({"id": 7, "connect": [[2, 10]]}))
            assert reply["request_id"] == 7 and reply["outcome"] == "ok"
            assert daemon.bus.restarts == 0 and daemon.bus.sessions == 1
            assert emulated.device("ocs1").model.connections == {1: 9, 2: 10}  # type: ignore[attr-defined]
        assert (await next_message(messages, f"{prefix}/daemon")).payload == b"offline"
        # Leave no retained messages behind on the shared broker.
        for topic in (f"{prefix}/daemon", f"{prefix}/state/switches/ocs1",
                      f"{prefix}/state/instruments/ocs1"):
            await watcher.publish(topic, b"", retain=True)


class CuttableProxy:
    """A TCP proxy to the broker whose connections a test can cut (a broker restart, a
    pulled cable), so that the bridge's reconnection is exercised on the real broker."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*BROKER)
        self.writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()


async def test_the_bridge_reconnects_by_itself(start_rig: StartRig,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A broker outage and return: the bridge is back by itself, and nothing was logged as
    an error on the way (no paho callback trouble, no unretrieved future, no traceback)."""
    require_broker()
    caplog.set_level(logging.WARNING)
    name = unique_name("bus")
    proxy = CuttableProxy()
    port = await proxy.start()
    try:
        instance = new_instance()
        async with start_rig("bus", name=name, token=TOKEN,
                             mqtt=BusSettings(f"mqtt://127.0.0.1:{port}", instance)) as rig:
            daemon = rig.daemon
            assert daemon.bus is not None
            await daemon.bus.wait_sessions(1, timeout=10)
            proxy.cut()  # the broker goes away under the bridge (a restart, a pulled cable)
            await daemon.bus.wait_sessions(2, timeout=15)  # and it is back, by itself
            assert daemon.bus.connected.is_set()
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
            assert not errors, [r.getMessage() for r in errors]
    finally:
        await proxy.stop()
        await clear_retained(BusSettings(MQTT, instance), name, [])


async def test_two_runs_of_one_lab_on_one_broker_never_hear_each_other(
        start_rig: StartRig) -> None:
    """Two rigs of a lab of the same name (two `labd demo`s, two CI runners) share the
    broker: each has an instance of its own, so one's host going silent is the other's
    business only, and neither refuses the other's messages (it never hears them)."""
    require_broker()
    name = unique_name("twin")
    parts = (endpoint("h0.nic0"), host("h0"))
    async with start_rig("twin", *parts, name=name, mqtt=MQTT) as a, \
            start_rig("twin", *parts, name=name, mqtt=MQTT) as b:
        assert a.daemon.bus is not None and b.daemon.bus is not None
        assert a.daemon.bus.prefix != b.daemon.bus.prefix
        _, a_events = a.daemon.hub.subscribe()
        _, b_events = b.daemon.hub.subscribe()
        for rig in (a, b):
            await wait_for(rig.daemon.hub, lambda r=rig: hosts_ready(r.daemon), 20, "h0 online")
        killed = await b.backdoor.kill_host("h0")
        lost = await next_event(b_events, "host.lost")
        assert lost.data["host"] == "h0"
        # a's h0 still beats, after b's went silent, and a lost nothing.
        await wait_for(a.daemon.hub, lambda: (a.daemon.hosts.hosts["h0"].last_beat_ns or 0)
                       > killed, 10, "a heartbeat of a's own h0")
        assert a.daemon.hosts.hosts["h0"].status == "online"
        seen = [a_events.queue.get_nowait() for _ in range(a_events.queue.qsize())]
        assert not [e for e in seen if e is not None and e.kind == "host.lost"]
        assert a.daemon.bus.complain.count == b.daemon.bus.complain.count == 0


async def test_a_failure_in_the_bridge_restarts_it_and_the_bus_carries_on(
        start_rig: StartRig) -> None:
    """An event the bridge cannot send (here, data that is not JSON) fails its loop: the
    bridge says so in a warning event and starts again, and later events still go out."""
    require_broker()
    async with start_rig("bus", switch(technology="ideal"), mqtt=MQTT, token=TOKEN) as rig, \
            aiomqtt.Client(*BROKER) as watcher:
        daemon = rig.daemon
        assert daemon.bus is not None
        await daemon.bus.wait_sessions(1, timeout=10)
        _, sub = daemon.hub.subscribe()
        await watcher.subscribe(f"{daemon.bus.prefix}/events/#")
        daemon.hub.publish("odd", {"value": object()})
        warning = await next_event(sub, "warning")
        assert "the MQTT bridge failed (TypeError" in warning.data["detail"]
        await daemon.bus.wait_sessions(2, timeout=15)
        assert daemon.bus.restarts == 1
        daemon.hub.publish("note", {"detail": "after the restart"})
        note = await next_message(watcher.messages, f"{daemon.bus.prefix}/events/note")
        assert json.loads(note.payload)["data"] == {"detail": "after the restart"}


async def test_agent_messages_never_wait_behind_a_command(start_rig: StartRig) -> None:
    """A command on a slow switch (1.5 s to switch) is carried out as a task of its own:
    the host's heartbeats go on being read while the switch works; and a command beyond
    the bridge's limit of commands in flight is refused at once, changing nothing."""
    require_broker()
    parts = (switch(switch_ms=1500, light_window_ms=2000), endpoint("h0.nic0"), host("h0"))
    async with start_rig("busy", *parts, mqtt=MQTT, token=TOKEN) as rig, \
            aiomqtt.Client(*BROKER) as watcher:
        daemon = rig.daemon
        assert daemon.bus is not None and rig.bus is not None
        await wait_for(daemon.hub, lambda: hosts_ready(daemon), 20, "h0 online")
        daemon.bus.max_commands = 1
        topic = f"{daemon.bus.prefix}/command/ocs1"
        await watcher.subscribe(f"{topic}/result")
        sealer = Sealer(RIG_CLIENT, rig.bus.credentials.clients[RIG_CLIENT])
        beats: set[int] = set()

        async def watch_beats() -> None:  # what the daemon took, while the switch works
            while True:
                beats.add(daemon.hosts.hosts["h0"].last_beat_ns or 0)
                await asyncio.sleep(0.02)

        watching = asyncio.create_task(watch_beats())
        try:
            await watcher.publish(topic, sealer.seal(topic, json.dumps(
                {"id": 1, "connect": [[1, 9]], "verify_light": False})))
            await watcher.publish(topic, sealer.seal(topic, json.dumps(
                {"id": 2, "connect": [[2, 10]], "verify_light": False})))
            first = json.loads((await next_message(watcher.messages, f"{topic}/result")).payload)
            second = json.loads((await next_message(watcher.messages,
                                                    f"{topic}/result")).payload)
        finally:
            watching.cancel()
        # The second was refused while the first ran (its answer came first).
        assert "refused" in first["error"] and "1 commands" in first["error"], first
        assert second["request_id"] == 1 and second["outcome"] == "ok", second
        assert daemon.engine.intended["ocs1"] == {1: 9}
        assert daemon.bus.refused_commands == 1
        phases = second["phases"]
        during = [b for b in beats if phases["dispatched"] < b < phases["acknowledged"]]
        assert len(during) >= 2, (sorted(beats), phases)


async def test_the_bridge_probes_at_once_when_the_watchdog_asks(
        start_rig: StartRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A silent host's verdict waits for a probe sent after its time was up (labd.hosts.
    monitor): asked, the bridge sends one at once, not at its next round (here an hour
    away), and the watchdog hears it back through the broker."""
    require_broker()
    monkeypatch.setattr("labd.daemon.bus.PROBE_S", 3600.0)
    name = unique_name("probe")
    bus = BusSettings(MQTT, new_instance())
    topic = f"{lab_root(name, bus.instance)}/daemon/probe"
    async with aiomqtt.Client(*BROKER) as watcher:
        await watcher.subscribe(topic)
        async with start_rig("probe", switch(technology="ideal"), name=name, mqtt=bus,
                             token=TOKEN) as rig:
            first = (await next_message(watcher.messages, topic)).payload  # the session's
            monitor = rig.daemon.services.hosts
            heard: list[int] = []
            back = asyncio.Event()

            def hear(sent_ns: int) -> None:  # the watchdog's, noting what it is told
                heard.append(sent_ns)
                back.set()

            monkeypatch.setattr(monitor, "heard", hear)
            asked = monitor._ask_probe  # what the watchdog calls when a host's time is up
            assert asked is not None
            before = time.monotonic_ns()
            asked()
            second = (await next_message(watcher.messages, topic)).payload
            assert second != first
            await asyncio.wait_for(back.wait(), 10)
            assert heard[-1] >= before  # sent when asked, and heard back
