"""The one assembly decides each setting once: the liveness watch of an entry that sets
none comes from the lab's [daemon] table, LABD_* and flags in that order, for ``labd run``
and for the emulated rig alike; under --ha the store is the lease's database unless named."""

from __future__ import annotations

from pathlib import Path

import pytest

from labd.commands.run import effective_settings
from labd.daemon.assembly import assemble, from_settings, lab_settings
from labd.emulation.rig import emulated_rig
from labd.lab.loader import Lab, load_lab
from tests.labs import instrument, switch, write_lab

DEFAULT_WATCH_S = 2.0  # the lab entry's own default (labd/lab/loader.py)


def watches(lab: Lab) -> dict[str, float]:
    return {e.id: e.watch_interval_s for e in lab.instrument}


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    _, path = write_lab(tmp_path, "asm", switch("own", watch_interval_s=3.0), switch("ocs1"),
                        "[daemon]\nwatch_interval_s = 0.5\n")
    return load_lab(str(path))


def test_the_watch_comes_from_the_entry_then_the_settings(lab: Lab) -> None:
    assert watches(assemble(lab, db="x.sqlite", env={}).lab) == {"own": 3.0, "ocs1": 0.5}
    over = {"LABD_WATCH_INTERVAL_S": "0.25"}
    assert watches(assemble(lab, db="x.sqlite", env=over).lab) == {"own": 3.0, "ocs1": 0.25}
    flagged = lab_settings(lab, env=over, flags={"watch_interval_s": 0.125})
    assert watches(from_settings(lab, flagged).lab) == {"own": 3.0, "ocs1": 0.125}
    plain = lab.model_copy(update={"daemon": {}})
    assert watches(assemble(plain, db="x.sqlite", env={}).lab) == {
        "own": 3.0, "ocs1": DEFAULT_WATCH_S}


def test_labd_run_and_a_program_get_the_same_answer(lab: Lab, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LABD_WATCH_INTERVAL_S", "LABD_DB", "LABD_HA_URL"):
        monkeypatch.delenv(name, raising=False)
    resolved = effective_settings(lab.source, None, {})
    assert resolved.where["watch_interval_s"] == f"file {lab.source}"
    assert watches(from_settings(lab, resolved).lab) == watches(
        assemble(lab, db="x.sqlite").lab)


def test_under_ha_the_store_is_the_lease_database_unless_named(lab: Lab) -> None:
    url = "postgresql://u@127.0.0.1/labd"
    alone = from_settings(lab, lab_settings(lab, env={}, flags={"ha_url": url}))
    assert alone.db == url and alone.ha is not None and alone.ha.url == url
    named = from_settings(lab, lab_settings(lab, env={}, flags={"ha_url": url,
                                                               "db": "other.sqlite"}))
    assert named.db == "other.sqlite"


def test_a_lab_emulates_when_an_entry_says_so(lab: Lab, tmp_path: Path) -> None:
    assert assemble(lab, db="x.sqlite", env={}).emulates
    _, path = write_lab(tmp_path, "real", instrument(
        "ocs1", "polatis-scpi", emulate=False, address="tcp://127.0.0.1:9"), file="real.toml")
    assert not assemble(load_lab(str(path)), db="x.sqlite", env={}).emulates


async def test_the_rig_drivers_watch_as_the_lab_file_says(lab: Lab, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.delenv("LABD_WATCH_INTERVAL_S", raising=False)
    async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), token="t") as rig:
        drivers = rig.daemon.drivers
        assert drivers["own"].connection.watch_interval_s == 3.0
        assert drivers["ocs1"].connection.watch_interval_s == 0.5
