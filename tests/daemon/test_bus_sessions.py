"""What a new broker session reads again is no fault: a host's retained status, taken
before and read again by the next session (after a reconnect, a resync or a takeover), is
ignored without a warning; the same message played live is still refused as a replay."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from labd.daemon.bus import MqttBridge
from labd.errors import AlreadyTaken, RefusedMessage
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Opener, Sealer, new_key
from tests.broker import MQTT
from tests.labs import endpoint, host
from tests.rigs import background_rig

KEY = new_key()


def test_a_message_taken_again_is_already_taken_and_an_older_one_a_replay() -> None:
    sealer = Sealer("h1", KEY)
    opener = Opener(lambda sender: KEY if sender == "h1" else None)
    topic = "labd/lab/hosts/h1/status"
    first = sealer.seal(topic, b"online")
    later = sealer.seal(topic, b"online")
    opener.open(topic, first, sender="h1", retained=True)
    with pytest.raises(AlreadyTaken):
        opener.open(topic, first, sender="h1", retained=True)
    opener.open(topic, later, sender="h1")
    with pytest.raises(RefusedMessage) as older:
        opener.open(topic, first, sender="h1")
    assert not isinstance(older.value, AlreadyTaken)


def test_a_retained_status_read_again_is_no_complaint(tmp_path: Path) -> None:
    parts = (endpoint("h1.nic0"), host("h1", emulate=False))
    with background_rig(tmp_path, "retained", *parts) as bg:
        bridge = MqttBridge(bg.daemon.services,
                            BusSettings(MQTT).with_keys(hosts={"h1": KEY}))
        sealer = Sealer("h1", KEY)
        status = f"{bridge.prefix}/hosts/h1/status"
        beat = f"{bridge.prefix}/hosts/h1/heartbeat"
        kept = sealer.seal(status, b"online")
        heartbeat = sealer.seal(beat, json.dumps({"gpus": [], "interval_s": 5, "sent_ns": 1}))

        async def feed(messages: list[tuple[str, bytes | None, bool]]) -> None:
            bridge._take(messages)
            async with asyncio.timeout(10):
                await bridge.drained.wait()

        bg.run(lambda _: feed([(status, kept, True), (beat, heartbeat, False)]))
        assert bg.daemon.hosts.hosts["h1"].status == "online"
        # A new session: the broker hands the same retained status over again.
        bg.run(lambda _: feed([(status, kept, True)]))
        assert bridge.complain.count == 0
        # Played live, the same message is a replay, refused and said so.
        bg.run(lambda _: feed([(status, kept, False)]))
        assert bridge.complain.count == 1
