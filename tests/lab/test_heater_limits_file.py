"""Heater limits in the lab file: per board and per channel, checked against the mesh's
calibration when the file is read, and handed to the driver."""

from pathlib import Path

import pytest

from labd.errors import LabFileError
from labd.fabric.drivers import make_switch
from labd.lab.loader import load_lab

MESH = """
[lab]
name = "bench"

[[instrument]]
id = "mesh"
driver = "qontrol-mesh"
address = "serial:///dev/ttyUSB0?baud=115200"
size = "8x8"
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "lab.toml"
    path.write_text(text)
    with pytest.raises(LabFileError) as info:
        load_lab(path)
    return info.value.problems


def test_limits_reach_the_driver(tmp_path: Path) -> None:
    path = tmp_path / "lab.toml"
    path.write_text(MESH + """vmax = 6.0
imax = 20
[[instrument.channel]]
channel = 3
vmax = 5.5
imax = 10.0
[[instrument.channel]]
channel = 22
imax = 5.0
""")
    mesh = make_switch(load_lab(path).instrument[0])
    limits = mesh.limits  # type: ignore[attr-defined]
    assert limits.limit(3, "v") == 5.5 and limits.limit(3, "i") == 10.0
    assert limits.limit(22, "v") == 6.0 and limits.limit(22, "i") == 5.0
    assert limits.limit(0, "i") == 20


def test_limits_the_calibration_cannot_keep_are_refused(tmp_path: Path) -> None:
    found = problems(tmp_path, MESH + "v_pi = 5.0\nvmax = 4.5\n")
    assert any("field 'vmax'" not in p and "heater 0 needs 5 V for the bar state (its "
               "calibration) but the board's vmax of 4.5 V forbids it" in p for p in found)
    found = problems(tmp_path, MESH + "[[instrument.channel]]\nchannel = 7\nvmax = 2.0\n")
    assert any("heater 7 needs 5 V" in p and "channel 7's vmax of 2 V" in p for p in found)


@pytest.mark.parametrize(("extra", "expected"), [
    ("vmax = 0", "field 'vmax': Input should be greater than 0"),
    ("imax = 301", "field 'imax': Input should be less than or equal to 300"),
    ("vmax = \"5\"", "field 'vmax': Input should be a valid number"),
    ("[[instrument.channel]]\nchannel = 1", "channel 1: give 'vmax', 'imax' or both"),
    ("[[instrument.channel]]\nchannel = -1\nvmax = 5.0", "channel"),
    ("[[instrument.channel]]\nchannel = 1\nvmax = 5.0\n[[instrument.channel]]\nchannel = 1\n"
     "imax = 3.0", "channel 1 is given twice"),
    ("[[instrument.channel]]\nchannel = 1\nvolts = 5.0", "volts"),
])
def test_bad_limits_are_one_clear_line(tmp_path: Path, extra: str, expected: str) -> None:
    found = problems(tmp_path, MESH + extra + "\n")
    assert len(found) == 1 and expected in found[0], found
