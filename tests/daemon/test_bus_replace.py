"""The bus's ``replace`` command on a real broker: a whole map giving a port twice is refused
naming the port, as the API's PUT refuses it, and changes nothing."""

import asyncio
import json

import aiomqtt

from labd.emulation.rig import RIG_CLIENT
from labd.mqtt.credentials import BusSettings
from labd.mqtt.envelope import Sealer
from labd.mqtt.topics import lab_root, new_instance
from tests.broker import BROKER, MQTT, next_message, require_broker
from tests.labs import switch, unique_name
from tests.rigs import StartRig


async def test_a_replace_command_giving_a_port_twice_is_refused(start_rig: StartRig) -> None:
    require_broker()
    name = unique_name("busreplace")
    bus = BusSettings(MQTT, new_instance())
    topic = f"{lab_root(name, bus.instance)}/command/ocs1"
    async with aiomqtt.Client(*BROKER) as client:
        await client.subscribe(f"{topic}/result")
        async with start_rig("busreplace", switch(technology="ideal"), name=name, mqtt=bus,
                             token="t") as rig:
            daemon = rig.daemon
            assert daemon.bus is not None and rig.bus is not None
            await asyncio.wait_for(daemon.bus.connected.wait(), 10)
            sealer = Sealer(RIG_CLIENT, rig.bus.credentials.clients[RIG_CLIENT])

            async def command(body: object) -> dict:
                await client.publish(topic, sealer.seal(topic, json.dumps(body)))
                return json.loads((await next_message(client.messages,
                                                      f"{topic}/result")).payload)

            assert (await command({"connect": [[2, 10]]}))["outcome"] == "ok"
            for pairs, port in [([[1, 9], [1, 10]], 1), ([[3, 11], [4, 12], [3, 13]], 3)]:
                reply = await command({"replace": pairs})
                assert f"port {port} appears twice" in (reply["error"] or ""), reply
            assert daemon.engine.intended["ocs1"] == {2: 10}
            reply = await command({"replace": [[1, 9]]})
            assert reply["outcome"] == "ok" and daemon.engine.intended["ocs1"] == {1: 9}
