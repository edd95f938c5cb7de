"""Nobody speaks for a host but its agent: on the real broker, a failure report that is not
sealed with the host's key, is sealed with another host's, or is played again changes
nothing; the real agent's report still recovers the job."""

import asyncio
import json
import random

import aiomqtt

from labd.emulation.drill import run_drill
from labd.emulation.rig import RIG_CLIENT
from labd.mqtt.envelope import Sealer
from tests.broker import BROKER, MQTT, next_message
from tests.hosts.test_failover import bounded, running
from tests.labs import ring_lab
from tests.rigs import StartRig


@bounded(60)
async def test_a_spoofed_host_failure_changes_nothing_and_a_real_one_recovers(
        start_rig: StartRig) -> None:
    async with start_rig("spoof", ring_lab(), mqtt=MQTT) as rig, \
            aiomqtt.Client(*BROKER) as stranger:
        await running(rig)
        daemon, bus = rig.daemon, rig.bus
        assert daemon.bus is not None and bus is not None
        prefix, keys = daemon.bus.prefix, bus.credentials.hosts
        job = daemon.jobs.job("ring4")
        epoch, members = job.epoch, list(job.members)
        events = f"{prefix}/hosts/h1/events"
        report = json.dumps({"host": "h1", "gpu": 0, "health": "failed", "was": "healthy",
                             "reasons": ["Xid 79"], "at_ns": 1, "since_ns": 1})
        # A real message of h1's, caught on the way, to play again.
        await stranger.subscribe(f"{prefix}/hosts/h1/heartbeat")
        caught = (await next_message(stranger.messages, f"{prefix}/hosts/h1/heartbeat")).payload
        assert isinstance(caught, bytes)
        spoofs = [
            (events, report.encode()),                                   # anonymous
            (events, Sealer("h2", keys["h2"]).seal(events, report)),     # h2 speaks for h1
            (events, Sealer("h1", keys["h2"]).seal(events, report)),     # h1's name, h2's key
            (f"{prefix}/hosts/h1/heartbeat", caught),                    # played again
        ]
        for topic, payload in spoofs:
            await stranger.publish(topic, payload)
        # h1's own report, as if caught and kept by the broker, delivered as retained (as it
        # would be at the daemon's next start): not taken, it would skip the freshness check.
        daemon.bus._from_host(events, "h1", "events",
                              Sealer("h1", keys["h1"]).seal(events, report), retained=True)
        # Too deep for the agent to read, on its command topic: refused, the agent lives on.
        await stranger.publish(f"{prefix}/hosts/h1/job", b"[" * 40)
        # The agent's session name is not to be guessed from its topics: a client taking
        # it over would make the broker publish the real agent's last will.
        root = f"{prefix}/hosts/h1"
        async with aiomqtt.Client(*BROKER, identifier=f"labd-agent-{root.removeprefix('labd/')}"):
            pass
        # A command after them, answered: the bridge has read every spoof by then.
        command = f"{prefix}/command/ocs1"
        await stranger.subscribe(f"{command}/result")
        await stranger.publish(command, Sealer(RIG_CLIENT, bus.credentials.clients[RIG_CLIENT])
                               .seal(command, json.dumps({"disconnect": [99]})))
        await next_message(stranger.messages, f"{command}/result")
        assert daemon.bus.complain.count == len(spoofs) + 1  # and the retained report
        assert daemon.hosts.hosts["h1"].gpu_health(0) == "healthy"
        assert daemon.hosts.hosts["h1"].status == "online"
        assert (job.epoch, job.members) == (epoch, members)
        assert daemon.bus.restarts == 0

        # The real agent's report is believed: h1 is swapped for a spare.
        result = await run_drill(rig, "ring4", random.Random(3), member="h1.nic0", timeout=30)
        assert result.timeline["outcome"] == "recovered", result.timeline
        assert "h1.nic0" not in job.members and job.epoch > epoch


async def test_a_daemon_said_offline_by_someone_else_says_online_again(
        start_rig: StartRig) -> None:
    async with start_rig("liar", ring_lab(), mqtt=MQTT, hosts=False) as rig, \
            aiomqtt.Client(*BROKER) as stranger:
        assert rig.daemon.bus is not None
        topic = f"{rig.daemon.bus.prefix}/daemon"
        await stranger.subscribe(topic)
        assert (await next_message(stranger.messages, topic)).payload == b"online"
        await stranger.publish(topic, b"offline", qos=1, retain=True)
        assert (await next_message(stranger.messages, topic)).payload == b"offline"
        async with asyncio.timeout(10):
            assert (await next_message(stranger.messages, topic)).payload == b"online"
