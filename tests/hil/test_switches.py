"""Hardware-in-the-loop: the same capability checks on every switch of a lab, through the
daemon, with labd's pytest plugin (docs/hil.md). They run against the emulated demo lab by
default, and unchanged against a real lab with ``pytest tests/hil --labd-lab FILE``.

On a real lab they only read, unless ``LABD_HIL_PAIR=<switch-id>:<a>,<b>`` names one pair,
free and safe to light on that switch, to make and break; the checks against the
emulators' ground truth and the dropped-link drill are skipped there.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from labd.client.api import DaemonClient
from labd.lab.loader import SWITCH_ENTRIES
from labd.testing.clients import Emulators, wait_for_state
from labd.testing.plugin import lab_of
from labd.testing.running import LabdDaemon

pytestmark = pytest.mark.hil


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "switch_id" in metafunc.fixturenames:
        lab = lab_of(metafunc.config)
        metafunc.parametrize("switch_id", [e.id for e in lab.instrument
                                           if isinstance(e, SWITCH_ENTRIES)])


def sides(size: str) -> tuple[range, range]:
    """The ports a pair joins: ingress and egress of an NxM switch (``16x16``), or any two
    of a switch that connects any port to any (a CALIENT's ``320``)."""
    ingress, _, egress = size.partition("x")
    if not egress:
        return range(1, int(ingress) + 1), range(1, int(ingress) + 1)
    return range(1, int(ingress) + 1), range(int(ingress) + 1, int(ingress) + int(egress) + 1)


def port_count(size: str) -> int:
    ingress, _, egress = size.partition("x")
    return int(ingress) + int(egress or 0)


def has(pairs: list[list[int]], pair: tuple[int, int]) -> bool:
    return set(pair) in [set(p) for p in pairs]


def held_by(truth: dict[str, Any]) -> list[list[int]]:
    """The pairs an emulated switch holds: its cross-connects, or a mesh's routes."""
    state = truth["state"]
    held: list[list[int]] = state["connections"] if "connections" in state else state["routes"]
    return held


async def free_pair(client: DaemonClient, switch_id: str,
                    joined: list[list[int]] | None = None) -> tuple[int, int]:
    """A pair of ports no intended circuit uses (nor joined already: a mesh routes every
    input somewhere)."""
    switch = await client.get(f"/v1/switches/{switch_id}")
    used = {p for pair in switch["intended"] for p in pair}
    ingress, egress = sides(switch["size"])
    return next((a, b) for a in ingress if a not in used for b in egress
                if b not in used and b != a and not has(joined or [], (a, b)))


async def pair_to_change(client: DaemonClient, daemon: LabdDaemon, switch_id: str
                         ) -> tuple[int, int]:
    """``LABD_HIL_PAIR`` where it names this switch; on the emulators, any free pair."""
    named = os.environ.get("LABD_HIL_PAIR")
    if named:
        target, _, pair = named.partition(":")
        if target != switch_id:
            pytest.skip(f"LABD_HIL_PAIR names {target}, not {switch_id}")
        a, b = (int(x) for x in pair.split(","))
        return a, b
    if not daemon.emulated:
        pytest.skip("on a real lab, set LABD_HIL_PAIR=<switch-id>:<a>,<b> (a free pair, "
                    "safe to light) to make and break it")
    return await free_pair(client, switch_id)


async def change(client: DaemonClient, switch_id: str, path: str, body: dict[str, Any]
                 ) -> dict[str, Any]:
    result: dict[str, Any] = await client.post(f"/v1/switches/{switch_id}/{path}",
                                               {**body, "verify_light": False})
    return result


async def test_identify_and_read(switch_id: str, labd_client: DaemonClient) -> None:
    instrument = await labd_client.get(f"/v1/instruments/{switch_id}")
    assert instrument["state"] == "online", instrument["last_error"]
    assert instrument["identity"]["vendor"] and instrument["identity"]["model"]
    switch = await labd_client.get(f"/v1/switches/{switch_id}")
    ports = await labd_client.get(f"/v1/switches/{switch_id}/ports")
    # A state read for every port of the size the switch says it has.
    assert [p["port"] for p in ports] == list(range(1, port_count(switch["size"]) + 1))
    assert all(p["state"] != "unknown" for p in ports), ports
    assert all(1 <= p <= len(ports) for pair in switch["observed"] for p in pair)


async def test_make_and_break_one_pair(switch_id: str, labd_client: DaemonClient,
                                       labd_daemon: LabdDaemon) -> None:
    a, b = await pair_to_change(labd_client, labd_daemon, switch_id)
    made = await change(labd_client, switch_id, "connections", {"pairs": [[a, b]]})
    assert made["outcome"] == "ok", made["error"]
    assert has((await labd_client.get(f"/v1/switches/{switch_id}"))["observed"], (a, b))
    broken = await change(labd_client, switch_id, "disconnect", {"ports": [a]})
    assert broken["outcome"] == "ok", broken["error"]
    observed = (await labd_client.get(f"/v1/switches/{switch_id}"))["observed"]
    assert all(a not in pair for pair in observed), observed


async def test_the_daemon_times_what_the_device_did(switch_id: str, labd_client: DaemonClient,
                                                    labd_emulators: Emulators) -> None:
    """The emulator's ground truth holds the pair the daemon reports, and the daemon's
    phases bracket the device's own: dispatched before the command arrived, acknowledged
    after it did."""
    before = await labd_emulators.truth(switch_id)
    seq = before["changes"][-1]["seq"] if before["changes"] else 0
    a, b = await free_pair(labd_client, switch_id, held_by(before))
    made = await change(labd_client, switch_id, "connections", {"pairs": [[a, b]]})
    assert made["outcome"] == "ok", made["error"]
    truth = await labd_emulators.truth(switch_id, since=seq)
    assert has(held_by(truth), (a, b)), truth["state"]
    moved = [c for c in truth["changes"] if has(c["connected"], (a, b))]
    assert moved, truth["changes"]
    phases = made["phases"]
    assert phases["dispatched"] <= moved[-1]["arrived_ns"] <= phases["acknowledged"]


async def test_a_dropped_link_is_recovered(labd_lab: Any, labd_client: DaemonClient,
                                           labd_emulators: Emulators) -> None:
    """A switch that cuts the daemon's connection mid-request: the change fails (and says
    so), the daemon reconnects by itself, and the next change goes through."""
    switch_id = next(e.id for e in labd_lab.instrument if isinstance(e, SWITCH_ENTRIES)
                     and labd_emulators.addresses[e.id].startswith("tcp://"))
    a, b = await free_pair(labd_client, switch_id)
    # The daemon probes a link left idle (an instrument's watch_interval_s): read from
    # just now, the link's next command is this test's, so the drop meets the change.
    await labd_client.get(f"/v1/switches/{switch_id}/ports")
    await labd_emulators.inject(switch_id, {"kind": "drop"})
    failed = await change(labd_client, switch_id, "connections", {"pairs": [[a, b]]})
    assert failed["outcome"] == "failed" and failed["error"], failed
    assert not has(held_by(await labd_emulators.truth(switch_id)), (a, b))
    await wait_for_state(labd_client, [switch_id], "online")
    made = await change(labd_client, switch_id, "connections", {"pairs": [[a, b]]})
    assert made["outcome"] == "ok", made["error"]
    assert has(held_by(await labd_emulators.truth(switch_id)), (a, b))
