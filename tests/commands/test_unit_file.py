"""The systemd units against what labd does: ``systemd-analyze security`` rates each 2.5 or
better where it is installed; and, since no test runs under systemd as PID 1, what can be
checked without it is: the state directory, working directory and ``XDG_STATE_HOME`` the
daemon's unit names are one, and a ``labd run`` started as the unit starts it (that working
directory, that environment) writes only there and opens no device the unit closes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest

from labd import deadlines
from tests.commands.running import Running
from tests.labs import instrument, write_lab

UNITS = Path(__file__).parents[2] / "deploy" / "systemd"
DAEMON = UNITS / "labd.service"
AGENT = UNITS / "labd-agent@.service"
#: What ``DevicePolicy=closed`` still allows (systemd.resource-control(5)).
CLOSED_POLICY_ALLOWS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                        "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts/*")
#: Serial instruments' device nodes, as lab files name them (docs/lab-file.md).
SERIAL_DEVICES = ("/dev/ttyUSB0", "/dev/ttyACM0", "/dev/ttyS1")
#: The most exposure the units may have (systemd-analyze calls up to 2.5 "OK").
MOST_EXPOSED = 2.5


def service(path: Path) -> dict[str, list[str]]:
    """The ``[Service]`` section's settings, each with every value it is given (systemd
    reads a setting given twice as both, or as a reset where empty)."""
    out: dict[str, list[str]] = {}
    section = None
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # continued lines
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("unit", [DAEMON, AGENT], ids=lambda p: p.name)
def test_systemd_analyze_rates_the_unit_ok(unit: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                          capture_output=True, text=True, check=False,
                          timeout=deadlines.current().times(30))
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout + done.stderr)
    assert found is not None, done.stdout + done.stderr
    assert float(found[1]) <= MOST_EXPOSED, done.stdout


def test_the_units_name_one_state_directory_and_the_serial_devices() -> None:
    unit = service(DAEMON)
    state = "/var/lib/" + unit["StateDirectory"][0]
    assert unit["WorkingDirectory"] == [state]
    assert f"XDG_STATE_HOME={state}" in unit["Environment"]
    assert unit["User"] == ["labd"] and "dialout" in unit["SupplementaryGroups"][0].split()
    assert unit["DevicePolicy"] == ["closed"]
    allowed = [value.split()[0] for value in unit["DeviceAllow"]]
    for device in SERIAL_DEVICES:
        # char-ttyUSB: every node of the driver "ttyUSB" (/proc/devices names them).
        assert any(re.sub(r"\d+$", "", Path(device).name) == pattern.removeprefix("char-")
                   for pattern in allowed), f"{device} is closed by the unit"
    families = unit["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)  # sd_notify, the API, devices
    # The agent's jobs need the GPUs: it closes none of them.
    assert "DevicePolicy" not in service(AGENT) and "PrivateDevices" not in service(AGENT)


def opened(pid: int) -> list[tuple[str, bool]]:
    """The files process ``pid`` holds open: (path, whether open for writing)."""
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
            flags = int(re.search(r"flags:\s*([0-7]+)", Path(
                f"/proc/{pid}/fdinfo/{fd.name}").read_text())[1], 8)  # type: ignore[index]
        except (OSError, TypeError):
            continue  # closed meanwhile
        if target.startswith("/"):
            out.append((target.removesuffix(" (deleted)"), bool(flags & (os.O_WRONLY | os.O_RDWR))))
    return out


@pytest.mark.skipif(not Path("/proc/self/fdinfo").exists(), reason="needs Linux's /proc")
async def test_labd_run_as_the_unit_runs_it_writes_only_its_state_directory(
        tmp_path: Path) -> None:
    """Started in its working directory with its ``XDG_STATE_HOME``, no ``--db`` and no
    token given: the store and the token file are made in the state directory, and every
    file the daemon holds open for writing is there."""
    _, lab = write_lab(tmp_path, "unit", instrument("ocs1", "polatis-scpi", size="8x8"))
    state = tmp_path / "var-lib-labd"
    state.mkdir(mode=0o700)
    daemon = await Running.start(str(lab), "--port", "0", "--log-format", "json",
                                 env={"XDG_STATE_HOME": str(state)}, cwd=str(state))
    try:
        await daemon.url()
        files = opened(daemon.process.pid)
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0
    finally:
        await daemon.close()
    assert (state / "labd.sqlite").exists() and (state / "labd" / "token").exists()
    written = [path for path, writing in files if writing and not path.startswith("/dev/")]
    assert written and all(Path(path).is_relative_to(state) for path in written), written
    devices = {path for path, _ in files if path.startswith("/dev/")}
    assert all(any(fnmatch(d, allowed) for allowed in CLOSED_POLICY_ALLOWS) for d in devices), \
        devices
