"""Whatever arrives on a switch's command topic gets an answer, never an exception: raw
bytes, forged seals, and sealed JSON of every shape (the bridge's ``handle``, on a running
daemon's engine)."""

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from labd.daemon.bus import MqttBridge
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer, new_key
from tests.broker import MQTT
from tests.labs import switch
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
