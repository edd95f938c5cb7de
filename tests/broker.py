"""What the tests that use the real MQTT broker share: the broker's address, a clear
failure when none is listening, waiting for a message, and a lab file with a name no other
run uses (retained topics outlive a test)."""

import asyncio
import socket
import uuid
from pathlib import Path

import aiomqtt
import pytest

BROKER = ("127.0.0.1", 1883)
MQTT = "mqtt://127.0.0.1:1883"


def require_broker() -> None:
    try:
        socket.create_connection(BROKER, timeout=2).close()
    except OSError:
        pytest.fail("these tests need an MQTT broker on 127.0.0.1:1883 (Mosquitto; .ci/run "
                    "starts one): none is listening")


async def next_message(messages: aiomqtt.MessagesIterator, topic: str) -> aiomqtt.Message:
    async with asyncio.timeout(10):
        async for message in messages:
            if message.topic.matches(topic):
                return message
    raise AssertionError("unreachable")


def unique_lab(tmp_path: Path, tag: str, body: str = "") -> tuple[str, Path]:
    """Write ``lab.toml`` with a fresh lab name (``tag`` + random) before ``body``."""
    name = f"{tag}{uuid.uuid4().hex[:8]}"
    path = tmp_path / "lab.toml"
    path.write_text(f'[lab]\nname = "{name}"\n{body}')
    return name, path
