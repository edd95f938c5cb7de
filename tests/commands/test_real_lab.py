"""``labd run`` on a lab with nothing to emulate loads no emulator and opens no control
endpoint: the process is asked what it imported (``PYTHONPROFILEIMPORTTIME``, every import
of its life on stderr) and which TCP ports it listens on (/proc). The same probe on an
emulated lab finds both, so it can see what it looks for."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from labd import deadlines
from tests.commands.running import Running
from tests.labs import instrument, switch, write_lab

TOKEN = "real-lab"
NOT_AT_RUNTIME = ("emulators", "labd.emulation", "labd.testing")

pytestmark = pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(),
                                reason="reads the process's sockets from /proc (Linux)")


def imported(stderr: list[str]) -> set[str]:
    """The modules a process run under PYTHONPROFILEIMPORTTIME imported."""
    found = set()
    for line in stderr:
        match = re.match(r"import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)", line)
        if match:
            found.add(match.group(2))
    return found


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def nobody_listens() -> str:
    """An address on this machine where nothing listens (a port just given back)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("emulated", [False, True], ids=["real", "emulated"])
async def test_labd_run_loads_emulation_only_for_an_emulated_lab(tmp_path: Path,
                                                                 emulated: bool) -> None:
    entry = (switch(size="8x8") if emulated else
             instrument("ocs1", "polatis-scpi", emulate=False, address=nobody_listens()))
    _, lab = write_lab(tmp_path, "real", entry)
    daemon = await Running.start(str(lab), "--db", str(tmp_path / "s.sqlite"), "--port", "0",
                                 env={"LABD_TOKEN": TOKEN, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        api_port = int((await daemon.url()).rsplit(":", 1)[1])
        ports = listening_ports(daemon.process.pid)
        if emulated:
            control_port = int((await daemon.control()).rstrip("/").rsplit(":", 1)[1])
            assert {api_port, control_port} <= ports
        else:
            assert ports == {api_port}, daemon.output  # no control endpoint, no emulator
            # The start-up report's end: the switch that nobody answers, then the keys.
            await daemon.wait_for("the report's end", lambda: "need 'Authorization" in "".join(
                daemon.stdout))
            assert re.search(r"failed\s+ocs1", "".join(daemon.stdout)), daemon.output
            assert "control endpoint" not in "".join(daemon.stdout)
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0, daemon.output
    finally:
        await daemon.close()
    modules = imported(daemon.stderr)
    assert "labd.daemon.assembly" in modules  # the probe sees the daemon's own imports
    loaded = sorted(m for m in modules if m.startswith(NOT_AT_RUNTIME))
    if emulated:
        assert "emulators.lab" in loaded and "labd.emulation.rig" in loaded
    else:
        assert loaded == []
