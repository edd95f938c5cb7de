"""Emulated GPU hosts under `labd emulate`: their agents report to the daemon over the real
broker; the control endpoint fails a GPU and kills a host."""

import asyncio
import json
import sys
from pathlib import Path

import httpx

from instruments.polatis_scpi import PolatisScpi
from labd.daemon.core import Daemon
from labd.emulation.emulators import emulated_hosts, emulated_lab, endpoint_of, run_together
from labd.emulation.rig import clear_retained
from labd.lab.loader import load_lab
from labd.mqtt.credentials import BusSettings, Credentials
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import new_instance
from tests.broker import MQTT, require_broker
from tests.labs import endpoint, fiber, host, switch, write_lab
from tests.rigs import AUTH, StartRig, next_event


async def test_emulated_hosts_fail_and_die_on_command(tmp_path: Path) -> None:
    require_broker()
    # A start-up of its own, not the rig's: the hosts are played by a `labd emulate` process
    # started once the daemon listens, whose ready lines are checked.
    name, path = write_lab(tmp_path, "eh", endpoint("h0.nic0"), endpoint("h1.nic0"),
                           host("h0", gpus=4), host("h1", gpus=2))
    lab = load_lab(path)
    # The hosts' keys, in the file the emulated agents read them from.
    keys = tmp_path / "keys.toml"
    Credentials(hosts={"h0": new_key(), "h1": new_key()}).write(keys)
    bus = BusSettings.load(MQTT, keys, new_instance())
    try:
        async with Daemon(lab, db=str(tmp_path / "s.sqlite"), port=0, token="t",
                          mqtt=bus) as daemon:
            _, sub = daemon.hub.subscribe()
            assert daemon.bus is not None
            await daemon.bus.wait_sessions(1, timeout=10)
            emulator = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "labd", "emulate", str(path), "--mqtt", MQTT,
                "--mqtt-credentials", str(keys), "--instance", bus.instance,
                stdout=asyncio.subprocess.PIPE)
            assert emulator.stdout is not None
            try:
                lines = []
                while not lines or "ready" not in lines[-1]:
                    lines.append(json.loads(await asyncio.wait_for(emulator.stdout.readline(), 30)))
                assert [(x["id"], x["driver"]) for x in lines[:-1]] == [("h0", "agent"),
                                                                       ("h1", "agent")]
                control = lines[-1]["control"]
                seen = set()
                while len(seen) < 6:  # every GPU announced healthy
                    event = await next_event(sub, "gpu.health")
                    seen.add((event.data["host"], event.data["gpu"]))
                async with httpx.AsyncClient(base_url=control) as http:
                    r = await http.post("/v1/hosts/h0/fail", json={"gpu": 1, "signal": "ecc"})
                    assert r.status_code == 200 and r.json()["failures"] == {"1": "ecc"}
                    failed = await next_event(sub, "gpu.health")
                    assert (failed.data["host"], failed.data["gpu"], failed.data["health"]) == (
                        "h0", 1, "failed")
                    bad = await http.post("/v1/hosts/h0/fail", json={"gpu": 9, "signal": "ecc"})
                    assert bad.status_code == 422 and "GPUs 0..3" in bad.text
                    bad = await http.post("/v1/hosts/h0/fail",
                                          json={"gpu": 0, "signal": "gremlins"})
                    assert bad.status_code == 422 and "expected one of" in bad.text
                    assert (await http.post("/v1/hosts/h9/kill")).status_code == 404
                    await http.post("/v1/hosts/h1/kill")
                    lost = await next_event(sub, "host.lost")
                    assert (lost.data["host"], lost.data["status"]) == ("h1", "lost")
                async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as api:
                    hosts = {h["id"]: h for h in (await api.get("/v1/hosts")).json()}
                assert hosts["h0"]["status"] == "online" and hosts["h1"]["status"] == "lost"
                assert [g["health"] for g in hosts["h0"]["gpus"]] == [
                    "healthy", "failed", "healthy", "healthy"]
            finally:
                emulator.terminate()
                await emulator.wait()
                sub.close()
    finally:
        await clear_retained(bus, name, ["h0", "h1"])


async def test_nic_links_follow_the_light(start_rig: StartRig) -> None:
    parts = (switch(switch_ms=10), endpoint("h0.nic0", launch_dbm=0),
             endpoint("h1.nic0", launch_dbm=0), fiber("h0.nic0", "ocs1:1"),
             fiber("ocs1:9", "h1.nic0"), host("h0"), host("h1", link_up_ms=20))
    # The hosts are started here, not by the rig: once the test listens for their first
    # word on the NICs' links.
    async with start_rig("nic", *parts, mqtt=MQTT, token="t", hosts=False) as rig:
        daemon, emulated = rig.daemon, rig.emulated
        assert emulated is not None
        _, sub = daemon.hub.subscribe()
        assert daemon.bus is not None
        await daemon.bus.wait_sessions(1, timeout=10)
        hosts = emulated_hosts(daemon.lab, rig.bus, emulated)
        fleet = run_together(hosts)
        fleet.start()
        try:
            first = await next_event(sub, "nic.link")  # each NIC reports its first state
            second = await next_event(sub, "nic.link")
            assert {(e.data["nic"], e.data["up"]) for e in (first, second)} == {
                ("h0.nic0", False), ("h1.nic0", False)}
            async with httpx.AsyncClient(base_url=daemon.url,
                                         headers={"Authorization": "Bearer t"}) as http:
                r = await http.post("/v1/circuits", json={"from": "h0.nic0", "to": "h1.nic0"})
                assert r.status_code == 200, r.text
            up = await next_event(sub, "nic.link")
            assert (up.data["host"], up.data["nic"], up.data["up"]) == ("h1", "h1.nic0", True)
            (light,) = [c for c in emulated.light() if c["node"] == "h1.nic0"]
            # The link came up no sooner than the light arrived plus the link-up delay.
            assert up.data["at_ns"] >= light["at_ns"] + 20_000_000
            async with httpx.AsyncClient(base_url=emulated.control_url) as ctl:
                await ctl.post("/v1/hosts/h1/nics/h1.nic0", json={"up": False})
            down = await next_event(sub, "nic.link")
            assert (down.data["nic"], down.data["up"]) == ("h1.nic0", False)
            async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH) as api:
                state = {h["id"]: h for h in (await api.get("/v1/hosts")).json()}
            assert state["h1"]["nics"] == {"h1.nic0": False}
        finally:
            await fleet.stop()
            sub.close()


async def test_a_pods_nics_are_read_by_one_watch_and_only_when_light_can_have_moved(
        tmp_path: Path) -> None:
    # 96 hosts on one switch, each NIC fibred to an ingress and from an egress: one watch
    # reads them all (no timer per host), and not at all while nothing can have changed.
    count = 96
    parts = [switch(size="96x96")]
    for i in range(count):
        parts += [endpoint(f"h{i}.nic0", launch_dbm=0), fiber(f"h{i}.nic0", f"ocs1:{i + 1}"),
                  fiber(f"ocs1:{count + 1 + i}", f"h{i}.nic0"), host(f"h{i}", gpus=1)]
    _, path = write_lab(tmp_path, "pod", *parts)
    lab = load_lab(path)
    emulated, entries = emulated_lab(lab)
    async with emulated:
        # Agents that are never started: the watch alone is under test.
        hosts = emulated_hosts(lab, None, emulated, daemon=("http://127.0.0.1:9", "t"))
        fleet = run_together(hosts)
        watch = asyncio.create_task(fleet.watch())
        try:
            await asyncio.wait_for(fleet.wait_ticks(1), 10)
            assert all(h.agent.links == {f"{h.id}.nic0": False} for h in hosts)
            assert fleet.reads == 1
            await asyncio.wait_for(fleet.wait_ticks(fleet.ticks + 20), 10)
            assert fleet.reads == 1  # nothing moved: no NIC read, no pass of the optics
            driver = PolatisScpi(endpoint_of(emulated, entries[0]), name="ocs1")
            await driver.open()
            try:
                await driver.connect([(1, count + 2)])  # h0's light to h1's NIC
            finally:
                await driver.close()
            async with asyncio.timeout(10):
                while not hosts[1].agent.links["h1.nic0"]:
                    await fleet.wait_ticks(fleet.ticks + 1)
            assert fleet.reads >= 2
            assert [h.id for h in hosts if any(h.agent.links.values())] == ["h1"]
            assert hosts[1].agent.queued() == 2  # its first state, then the link up
            hosts[5].nic_down("h5.nic0", True)  # no light moved, yet a read is due
            reads = fleet.reads
            await asyncio.wait_for(fleet.wait_ticks(fleet.ticks + 2), 10)
            assert fleet.reads > reads
        finally:
            watch.cancel()
            await fleet.stop()
