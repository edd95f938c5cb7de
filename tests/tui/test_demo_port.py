"""``labd demo --serve`` on a port another process holds: one line naming the port, exit
2, as ``labd run`` says it."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_demo_serve_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "labd", "demo", "--serve", "--no-failover", "--port",
             str(port), "--rounds", "1", "--light-events", "0"],
            capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot serve the demo on port {port}: ")
    assert "in use" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
