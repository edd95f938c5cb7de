"""Whatever arrives on a switch's command topic gets an answer, never an exception: raw
bytes, forged seals, and sealed JSON of every shape (the bridge's ``handle``, on a running
daemon's engine)."""

import asyncio
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from labd.daemon.bus import MqttBridge
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer, new_key
from tests.broker import MQTT
from tests.labs import endpoint, host, switch
from tests.rigs import background_rig

KEY = new_key()
TOPIC_OF = "labd/{}/command/ocs1"
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 20)
                      | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
COMMANDS = st.dictionaries(st.sampled_from(["connect", "disconnect", "replace", "id",
                                            "verify_light", "token", "x"]), VALUES, max_size=3)


def test_any_command_payload_is_answered(tmp_path: Path) -> None:
    with background_rig(tmp_path, "cmdfuzz", switch(technology="ideal")) as bg:
        bridge = MqttBridge(bg.daemon.services, BusSettings(MQTT).with_keys(clients={"c": KEY}))
        topic = f"{bridge.prefix}/command/ocs1"
        sealer = Sealer("c", KEY)

        def answer(payload: bytes) -> dict[str, object]:
            async def handle(_: object) -> dict[str, object]:
                return await bridge.handle("ocs1", payload, topic=topic)
            reply: dict[str, object] = bg.run(handle)
            json.dumps(reply)  # goes back out as JSON
            assert reply.get("error") or reply.get("outcome"), reply
            return reply

        @settings(max_examples=150, deadline=None)
        @given(st.binary(max_size=400))
        def raw(payload: bytes) -> None:
            assert "sealed" in str(answer(payload)["error"])

        @settings(max_examples=300, deadline=None)
        @given(COMMANDS)
        def sealed(command: dict[str, object]) -> None:
            answer(sealer.seal(topic, json.dumps(command)))

        raw()
        sealed()


TOPICS = st.sampled_from(["hosts/h1/heartbeat", "hosts/h1/status", "hosts/h1/events",
                          "hosts/h2/heartbeat", "hosts/h1", "hosts/h1/job", "daemon/probe",
                          "hosts//", "x", ""])


def test_any_batch_of_host_messages_changes_nothing_unsealed(tmp_path: Path) -> None:
    """Whatever the feed hands over (any topic under the root, any bytes, too large,
    retained or not): handled without an exception, and nothing about the lab's host
    changes unless its key sealed it; the probe is believed only for its own tokens."""
    parts = (endpoint("h1.nic0"), host("h1", emulate=False))
    with background_rig(tmp_path, "feedfuzz", *parts) as bg:
        bridge = MqttBridge(bg.daemon.services,
                            BusSettings(MQTT).with_keys(hosts={"h1": KEY}))
        monitor = bg.daemon.hosts

        @settings(max_examples=300, deadline=None)
        @given(st.lists(st.tuples(TOPICS, st.none() | st.binary(max_size=200),
                                  st.booleans()), max_size=8))
        def batch(messages: list[tuple[str, bytes | None, bool]]) -> None:
            async def take(_: object) -> None:
                bridge._take([(f"{bridge.prefix}/{t}", p, r) for t, p, r in messages])
                async with asyncio.timeout(10):
                    await bridge.drained.wait()
            heard = monitor.heard_ns
            bg.run(take)
            state = monitor.hosts["h1"]
            assert state.status == "unknown" and state.last_beat_ns is None
            assert state.gpus == [] and monitor.heard_ns == heard
            assert set(monitor.hosts) == {"h1"}

        batch()
        # Sealed with h1's key, the same path takes it.
        sealer = Sealer("h1", KEY)
        topic = f"{bridge.prefix}/hosts/h1/heartbeat"
        body = json.dumps({"gpus": [{"index": 0, "health": "healthy"}], "interval_s": 5,
                           "sent_ns": 1})

        async def sealed(_: object) -> None:
            bridge._take([(topic, sealer.seal(topic, body), False)])
            async with asyncio.timeout(10):
                await bridge.drained.wait()
        bg.run(sealed)
        assert monitor.hosts["h1"].status == "online"
        assert bridge.complain.count > 0  # the fuzzed ones were refused, and said so
