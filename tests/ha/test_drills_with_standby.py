"""``labd measure failover --ha``: the drills' daemon leads by a lease on PostgreSQL while a
standby (``labd run --ha``, a process of its own) stands by on the same lab, broker and
database; a drill is carried out beside it, and the standby refuses changes meanwhile."""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import httpx
from rich.console import Console

from labd.emulation.campaign import measure_failover, standby
from labd.emulation.drill import hosts_ready, job_stepping, run_drill, wait_for
from labd.emulation.rig import emulated_rig, rig_bus
from labd.errors import DrillError
from labd.ha.role import HaSettings
from labd.lab.loader import load_lab
from tests import labs
from tests.broker import MQTT, require_broker
from tests.databases import postgres_database


async def test_a_drill_beside_a_standby(tmp_path: Path) -> None:
    require_broker()
    _, path = labs.write_lab(tmp_path, "hadrill", labs.ring_lab())
    lab = load_lab(path)
    bus = rig_bus(lab, MQTT)
    with postgres_database() as url:
        async with contextlib.AsyncExitStack() as stack:
            rig = await stack.enter_async_context(emulated_rig(lab, db=url, mqtt=bus,
                                                               ha=HaSettings(url)))
            assert rig.daemon.role is not None and rig.daemon.role.name == "leader"
            standing = await stack.enter_async_context(standby(rig, lab, url, bus, tmp_path))
            daemon = rig.daemon
            await wait_for(daemon.hub, lambda: hosts_ready(daemon), "hosts_online", "hosts")
            await daemon.jobs.start_job("ring4")
            await wait_for(daemon.hub, lambda: job_stepping(daemon, "ring4"), "first_step",
                           "the job's first step")
            result = await run_drill(rig, "ring4", random.Random(1), kind="gpu",
                                     signal="xid79")
            assert result.timeline["outcome"] == "recovered", result.timeline
            async with httpx.AsyncClient(
                    base_url=standing.url,
                    headers={"Authorization": f"Bearer {standing.token}"}) as http:
                health = (await http.get("/v1/health")).json()
                refused = await http.post("/v1/switches/ocs1/disconnect",
                                          json={"ports": [1]})
            assert health["ha"]["role"] == "standby"
            assert health["ha"]["leader"] == daemon.url
            assert refused.status_code == 503 and daemon.url in refused.text
            # It never led: the lease is still in the drills' daemon's first epoch.
            assert daemon.role is not None and daemon.role.lease.epoch == 1


async def test_drills_with_ha_but_no_broker_are_refused_before_anything_starts(
        tmp_path: Path) -> None:
    _, path = labs.write_lab(tmp_path, "hanobroker", labs.ring_lab())
    try:
        await measure_failover(load_lab(path), drills=1, lost=0, mqtt=None,
                               console=Console(file=io.StringIO()),
                               ha="postgresql+psycopg://nobody@127.0.0.1:1/none")
    except DrillError as exc:
        assert "--ha needs a broker" in str(exc)
    else:
        raise AssertionError("drills with --ha and no broker were not refused")
