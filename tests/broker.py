"""What the tests that use the real MQTT broker share: the broker's address, a clear
failure when none is listening, and waiting for a message. (A lab file with a name no other
run uses, as retained topics outlive a test: tests.labs.write_lab.)"""

import asyncio
import socket

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
