"""The example scripts of scripts/ (library use of labd), run against a daemon on an
emulated lab."""

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.labs import switch
from tests.rigs import StartRig

SCRIPTS = Path(__file__).parents[2] / "scripts"


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_example_scripts_run_their_sweeps(
        start_rig: StartRig, capsys: pytest.CaptureFixture[str]) -> None:
    async with start_rig("scripts", switch(size="16x16", switch_ms=2), token="t") as rig:
        device = await script("sweep_batch").main(rig.daemon.url, "ocs1", 4, token="t")
        assert [d["k"] for d in device] == [1, 2, 4, 8] and all(d["n"] == 4 for d in device)
        assert all(d["p50"] >= 2.0 for d in device)  # the 2 ms switch model
        windows = await script("window_sweep").main(rig.daemon.url, "ocs1", 16, token="t",
                                                    windows=(1, 30))
        assert [w["iterations"] for w in windows] == [1, 1]
        assert all(0 <= w["hidden"] <= 1 and w["windows"] > 0 for w in windows)
        assert not rig.daemon.engine.intended["ocs1"]  # every sweep cleaned up after itself
    out = capsys.readouterr().out
    assert "k= 8: device p50" in out and "ms windows:" in out
