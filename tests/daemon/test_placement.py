"""The daemon's event loop held on one CPU (``labd run --cpu``, labd/daemon/placement.py),
on this machine's own scheduler: placed while the daemon runs, its worker threads left on
every CPU, all given back when it stops; and a CPU the process may not use refused before
anything is served."""

import os
from pathlib import Path

import pytest

from labd.daemon.core import Daemon
from labd.daemon.placement import PlacementError
from labd.lab.loader import Lab, load_lab
from tests.labs import instrument, write_lab

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="placing threads on a CPU is Linux's")


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    _, path = write_lab(tmp_path, "placed", instrument(
        "gone", "polatis-scpi", emulate=False, address="tcp://127.0.0.1:1"), name="placed")
    return load_lab(path)


async def test_the_loop_runs_on_one_cpu_while_the_daemon_runs_and_its_readers_do_not(
        lab: Lab, tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    async with Daemon(lab, db=str(tmp_path / "s.sqlite"), port=0, token="t",
                      cpu="auto") as daemon:
        (cpu,) = os.sched_getaffinity(0)  # this thread runs the daemon's loop
        assert cpu in before
        # The writer still takes work (where it commits: tests/store/test_affinity.py).
        assert await daemon.store.run_write(lambda session: 42) == 42
        # A reader (a worker thread started now) runs where the loop could before.
        assert await daemon.store.read(lambda session: os.sched_getaffinity(0)) == before
    assert os.sched_getaffinity(0) == before


async def test_a_cpu_the_process_may_not_use_is_refused_before_anything_is_served(
        lab: Lab, tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    outside = max(before) + 1
    daemon = Daemon(lab, db=str(tmp_path / "s.sqlite"), port=0, token="t", cpu=outside)
    with pytest.raises(PlacementError) as refused:
        async with daemon:
            pytest.fail("the daemon started on a CPU it may not use")
    allowed = ", ".join(str(c) for c in sorted(before))
    assert str(refused.value) == (f"cpu = {outside}: this process may run on CPUs "
                                  f"{allowed} only; name one of them, or \"auto\"")
    assert os.sched_getaffinity(0) == before
    assert daemon.store.writer_id is None  # the store it opened is closed again
