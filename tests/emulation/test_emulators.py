"""From a lab file to running emulators and drivers, in-process."""

from pathlib import Path

import pytest

from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.errors import LabFileError
from labd.fabric.drivers import make_switch
from labd.lab.loader import load_lab

LAB = """
[lab]
name = "mixed"

[[instrument]]
id = "console"
driver = "polatis-scpi"
emulate = true
size = "8x8"
timeout = 1.0
[instrument.emulator]
technology = "ideal"
serve = "pty"

[[instrument]]
id = "core"
driver = "calient-tl1"
emulate = true
size = "96"
user = "ops"
password_env = "LABD_TEST_CALIENT_PASSWORD"
ports_per_slot = 48
[instrument.emulator]
technology = "ideal"
options = { prompt = "agent> " }
"""


async def test_lab_file_emulators_and_drivers_meet(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABD_TEST_CALIENT_PASSWORD", "s3cret")
    path = tmp_path / "mixed.toml"
    path.write_text(LAB)
    lab = load_lab(path)
    emulated, entries = emulated_lab(lab)
    async with emulated:
        console, core = entries
        assert endpoint_of(emulated, console).startswith("serial:///dev/pts/")
        async with make_switch(console, endpoint_of(emulated, console)) as sw:
            await sw.connect([(1, 9)])
            assert await sw.cross_connects() == {1: 9}
        async with make_switch(core, endpoint_of(emulated, core)) as sw:
            assert sw.info is not None and sw.info.ports == 96
            await sw.connect([(48, 49)])  # 1.1.48 and 1.2.1 with 48 ports per slot
        assert emulated.truth("core")["state"]["connections"] == [[48, 49]]
        assert emulated.device("core").crs["1.1.48-1.2.1"].active  # type: ignore[attr-defined]


def test_bad_emulator_options_are_lab_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(LAB.replace('options = { prompt = "agent> " }',
                                'options = { promt = "agent> " }').replace(
        'password_env = "LABD_TEST_CALIENT_PASSWORD"', 'password = "x"'))
    with pytest.raises(LabFileError) as info:
        emulated_lab(load_lab(path))
    (problem,) = info.value.problems
    assert "[[instrument]] #2 (id 'core'), field 'emulator'" in problem
    assert "unknown option(s) ['promt']" in problem


def test_missing_password_variable_is_named(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABD_TEST_CALIENT_PASSWORD", raising=False)
    path = tmp_path / "mixed.toml"
    path.write_text(LAB)
    with pytest.raises(LabFileError) as info:
        emulated_lab(load_lab(path))
    (problem,) = info.value.problems
    assert problem == (f"{path}: [[instrument]] #2 (id 'core'), field 'password_env': "
                       "environment variable LABD_TEST_CALIENT_PASSWORD is not set; "
                       "export it, or give 'password'")
