"""Deadlines: every wait on another process or the lab is a setting, scaled from the
command line or the environment, and a wait that runs out says what it waited for."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from labd import deadlines
from labd.client.control import spawn_emulators
from labd.commands.main import app
from labd.deadlines import SCALE_ENV, Deadlines
from labd.emulation.drill import wait_for
from labd.errors import BackdoorError, DrillError, LabdError
from labd.events import EventHub


def test_the_scale_multiplies_every_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, " 2.5 ")
    scaled = Deadlines.from_env()
    assert scaled.scale == 2.5
    assert scaled.of("first_step") == 2.5 * Deadlines().first_step
    assert scaled.times(4) == 10
    assert "process_ready 300 s" in scaled.summary()
    # Given on the command line, the option wins over the environment.
    assert Deadlines.from_env(3).scale == 3
    monkeypatch.delenv(SCALE_ENV)
    assert Deadlines.from_env() == Deadlines()
    deadlines.use(Deadlines(scale=7))
    try:
        assert deadlines.current().scale == 7
    finally:
        deadlines.use(None)


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "inf", "nan", "1e9", "1,5", "101"])
def test_a_bad_scale_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(SCALE_ENV, raw)
    with pytest.raises(LabdError, match=r"LABD_DEADLINE_SCALE|deadline scale"):
        Deadlines.from_env()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_environment_value_is_a_scale_or_one_clear_error(raw: str) -> None:
    if "\0" in raw:
        return  # not something an environment can hold
    kept = os.environ.get(SCALE_ENV)
    os.environ[SCALE_ENV] = raw
    try:
        found = Deadlines.from_env()
    except LabdError as exc:
        assert "deadline scale" in str(exc) or SCALE_ENV in str(exc)
    else:
        assert 0 < found.scale <= deadlines.MAX_SCALE
    finally:
        if kept is None:
            del os.environ[SCALE_ENV]
        else:
            os.environ[SCALE_ENV] = kept


async def test_a_wait_that_runs_out_says_what_it_waited_for_and_how_to_wait_longer() -> None:
    with pytest.raises(DrillError) as caught:
        await wait_for(EventHub(), lambda: False, 0.05, "job ring4 to take its first step")
    said = str(caught.value)
    assert said.startswith("timed out after 0.05 s waiting for job ring4 to take its first")
    assert "--deadline-scale" in said and SCALE_ENV in said


def children() -> set[int]:
    """This process's live children (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_an_emulator_process_that_never_gets_ready_is_stopped_and_named(
        tmp_path: Path) -> None:
    before = children()
    # Exits at once: the message carries the end of its stderr (evidence, not a timeout).
    with pytest.raises(BackdoorError, match=r"exited \(status 2\) before it was ready") as exited:
        await spawn_emulators(tmp_path / "missing.toml", timeout=600)
    assert "missing.toml" in str(exited.value)
    # Slower than its deadline: stopped, and the message says how to give it more time.
    with pytest.raises(BackdoorError, match=r"timed out after 0\.01 s waiting for labd emulate"):
        await spawn_emulators("demo", timeout=0.01)
    assert children() <= before


def test_the_commands_take_a_deadline_scale() -> None:
    runner = CliRunner()
    for args in (["demo", "--deadline-scale", "0"], ["measure", "failover", "--deadline-scale",
                                                     "1000"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "--deadline-scale" in result.output
    for raw in ("soon", "nan", "-3"):
        result = runner.invoke(app, ["measure", "reconfig", "--rounds", "1"],
                               env={SCALE_ENV: raw})
        assert result.exit_code == 2 and "--deadline-scale" in result.output, raw
