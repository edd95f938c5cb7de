"""The MQTT brokers of the tests: Mosquitto processes the session starts on ports of their
own (labd.mqtt.private), never a broker the machine runs on 1883. (A lab file with a name
no other test uses, as retained topics outlive a test: tests.labs.write_lab.)

- ``MQTT`` / ``BROKER``: the URL and ``(host, port)`` of the session's shared broker, fixed
  at import and started on first need: by :func:`require_broker`, which every test that
  connects to it calls (``rig_on`` does for a rig with ``mqtt``), or by the ``mqtt_url``
  and ``shared_broker`` fixtures (conftest.py). It is stopped when the session ends.
- ``Mosquitto``: a broker of a test's own, to stop (SIGTERM or SIGKILL) and start again on
  the same port, or to give a config (password and ACL files, persistence):

      async with Mosquitto(tmp_path, config=["persistence true"]) as broker:
          async with aiomqtt.Client(*broker.address): ...
          await broker.stop(signal.SIGKILL)
          await broker.start()                 # the same port; its log: broker.log

  (or the ``private_broker`` fixture: one started in the test's tmp_path).
"""

from __future__ import annotations

import asyncio
import atexit

import aiomqtt
import pytest

from labd.mqtt.private import Mosquitto, MosquittoError, free_port

__all__ = ["BROKER", "MQTT", "SHARED", "Mosquitto", "MosquittoError", "next_message",
           "require_broker"]

#: The session's shared broker: its port is fixed now, as MQTT and BROKER name it; started
#: by require_broker.
SHARED = Mosquitto(name="shared-broker", port=free_port())
BROKER = SHARED.address
MQTT = SHARED.url
# Where the session ends without conftest's teardown (a module imported outside pytest).
atexit.register(SHARED.close)


def require_broker() -> Mosquitto:
    """The session's shared broker, started if it is not running (again on the same port,
    should it have died); a clear failure, not a hang, where Mosquitto cannot start."""
    if not SHARED.running:
        try:
            SHARED.start_blocking()
        except MosquittoError as exc:
            pytest.fail(f"these tests need an MQTT broker of their own: {exc}", pytrace=False)
    return SHARED


async def next_message(messages: aiomqtt.MessagesIterator, topic: str) -> aiomqtt.Message:
    async with asyncio.timeout(10):
        async for message in messages:
            if message.topic.matches(topic):
                return message
    raise AssertionError("unreachable")
