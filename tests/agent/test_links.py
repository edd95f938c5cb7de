"""The agent's MQTT link takes only the daemon's sealed commands: a forged one on its job
topic (anyone on the broker may publish there) is refused in a log line that names the
host, and the link goes on to the next."""

from __future__ import annotations

import asyncio
import logging

import aiomqtt
import pytest

from labd.agent.links import mqtt_link
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer, new_key
from labd.mqtt.topics import host_root, new_instance
from tests.broker import BROKER, MQTT, require_broker


async def test_a_forged_command_is_refused_naming_the_host(
        caplog: pytest.LogCaptureFixture) -> None:
    require_broker()
    key = new_key()
    settings = BusSettings(MQTT, new_instance()).with_keys(hosts={"h1": key})
    topic = f"{host_root('links', 'h1', settings.instance)}/job"
    caplog.set_level(logging.WARNING, logger="labd.agent.links")
    async with mqtt_link(settings, "links", "h1") as link:
        commands = link.commands()
        async with aiomqtt.Client(*BROKER) as intruder:
            await intruder.publish(topic, b'{"op": "start", "job": "j"}', qos=1)
            # Then the daemon's own: the link yields it, so the forgery before it was read.
            await intruder.publish(topic, Sealer("daemon", key).seal(topic, b'{"op": "stop"}'),
                                   qos=1)
        taken = await asyncio.wait_for(anext(commands), 10)
        await commands.aclose()
    assert taken == b'{"op": "stop"}'
    [refusal] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert getattr(refusal, "host", None) == "h1" and "host h1" in refusal.getMessage()
