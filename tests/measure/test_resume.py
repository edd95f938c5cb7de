"""``--resume`` goes on where a run began: its lab or daemon, never whatever answers on the
default port, and never another daemon named on the command line."""

from pathlib import Path

import pytest

from labd.errors import RunError
from labd.measure.reconfig import resume_target
from labd.measure.runs import RunStore
from tests.commands.test_cli import run
from tests.labs import instrument, write_lab
from tests.measure.test_measure import OCS1, within
from tests.rigs import rig_on


def kept(tmp_path: Path, *, target: str, params: dict[str, object]) -> RunStore:
    store = RunStore(tmp_path / "runs.sqlite")
    made = store.create(name="r1", kind="reconfig", params=params, labd_version="0",
                        target=target, lab_name="first", lab_sha256="", planned=4)
    store.finish(made, "interrupted")
    return store


def test_a_run_keeps_its_target_and_another_is_refused(tmp_path: Path) -> None:
    store = kept(tmp_path, target="http://127.0.0.1:9001",
                 params={"target": {"url": "http://127.0.0.1:9001", "control": None}})
    measured = store.get("r1")
    assert resume_target(measured, lab=None, url=None, control=None)["url"] == \
        "http://127.0.0.1:9001"
    with pytest.raises(RunError, match=r"leave out --url http://127.0.0.1:9002"):
        resume_target(measured, lab=None, url="http://127.0.0.1:9002", control=None)
    with pytest.raises(RunError, match="leave out --lab demo"):
        resume_target(measured, lab="demo", url=None, control=None)
    # The same URL written another way is the same daemon.
    assert resume_target(measured, lab=None, url="http://127.0.0.1:9001/", control=None)
    store.close()


def test_a_url_run_kept_before_targets_were_kept_takes_its_control_again(
        tmp_path: Path) -> None:
    store = kept(tmp_path, target="http://127.0.0.1:9001", params={})
    measured = store.get("r1")
    assert resume_target(measured, lab=None, url=None, control="http://127.0.0.1:9100") == {
        "url": "http://127.0.0.1:9001", "control": "http://127.0.0.1:9100"}
    store.close()


def test_a_run_kept_before_targets_were_kept_goes_on_where_it_says(tmp_path: Path) -> None:
    lab = tmp_path / "lab.toml"
    lab.write_text("")
    store = kept(tmp_path, target=f"lab {lab} (emulated)", params={})
    measured = store.get("r1")
    assert resume_target(measured, lab=None, url=None, control=None) == {"lab": str(lab)}
    # The same file named another way is the same lab.
    same = resume_target(measured, lab=str(tmp_path / "." / "lab.toml"), url=None,
                         control=None)
    assert same == {"lab": str(lab)}
    with pytest.raises(RunError, match="leave out --lab"):
        resume_target(measured, lab="demo", url=None, control=None)
    store.close()


@pytest.mark.timeout(240)  # its waits together (tests/conftest.py scales it)
async def test_resume_talks_to_the_runs_own_daemon_and_refuses_another(tmp_path: Path
                                                                       ) -> None:
    runs, key = tmp_path / "runs.sqlite", tmp_path / "key"
    key.write_text("tok\n")
    key.chmod(0o600)
    common = ["--runs", str(runs), "--token-file", str(key)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with rig_on(tmp_path / "a", "first", OCS1, token="tok", name="first") as first, \
            rig_on(tmp_path / "b", "second", OCS1, token="tok", name="second") as second:
        code, out, err = await run("measure", "reconfig", "--url", first.daemon.url,
                                   "--rounds", "4", "--name", "r1", *common,
                                   timeout=within(120))
        assert code == 0, out + err
        store = RunStore(runs)
        measured = store.get("r1")
        assert measured.params["target"] == {"url": first.daemon.url, "control": None}
        store.finish(measured, "interrupted")
        store.close()

        code, out, err = await run("measure", "reconfig", "--resume", "r1", "--url",
                                   second.daemon.url, *common, timeout=within(60))
        said = " ".join((out + err).split())
        assert code == 2 and f"leave out --url {second.daemon.url}" in said, said
        assert "Traceback" not in said

        # No --url: the run's own daemon, not whatever answers on the default port.
        code, out, err = await run("measure", "reconfig", "--resume", "r1", *common,
                                   timeout=within(60))
        said = " ".join((out + err).split())
        assert code == 0, said
        assert f"on {first.daemon.url} (first)" in said and "4 already measured" in said

        # A run that says it was on the second daemon's URL, but measured the first lab:
        # whatever answers there now is another daemon.
        store = RunStore(runs)
        moved = store.create(name="r2", kind="reconfig", params={
            **measured.params, "target": {"url": second.daemon.url, "control": None}},
            labd_version="0", target=second.daemon.url, lab_name="first", lab_sha256="",
            planned=4)
        store.finish(moved, "interrupted")
        store.close()
        code, out, err = await run("measure", "reconfig", "--resume", "r2", *common,
                                   timeout=within(60))
        said = " ".join((out + err).split())
        assert code == 2 and "runs lab 'second'" in said and "another daemon" in said, said


MESH = instrument("mesh1", "qontrol-mesh", size="8x8", v_pi=5.0,
                  emulator={"technology": "thermo-optic"})


@pytest.mark.timeout(240)  # its waits together (tests/conftest.py scales it)
async def test_a_mesh_without_a_timing_model_is_said_once_not_refused(tmp_path: Path
                                                                      ) -> None:
    """--switch-ms sets the switches' timing model; a mesh has none (its heaters' settling
    is its time): said in one line, not a 422 from the emulators' endpoint."""
    _, lab = write_lab(tmp_path, "meshed", OCS1, MESH)
    code, out, err = await run("measure", "reconfig", "--lab", str(lab), "--rounds", "2",
                               "--switch-ms", "4", "--no-light", "--runs",
                               str(tmp_path / "runs.sqlite"), timeout=within(120))
    said = " ".join((out + err).split())
    assert code == 0, said
    assert "422" not in said and "PUT /v1/emulators" not in said
    assert "measured as set in the lab: mesh1" in said
    store = RunStore(tmp_path / "runs.sqlite")
    [(measured, rows)] = store.all()
    store.close()
    assert measured.params["timing"]["switches"] == ["ocs1"] and rows == 4
