"""The TUI's CPU use while the demo lab runs a steady stream of reconfigurations.

``labd run demo`` (every switch family emulated) runs in one process; ``labd tui`` runs in
a real terminal (a tmux session, 160x50) against it; this script drives a steady stream of
reconfigurations through the API (toggling a free pair on every switch in turn, through
labd.measure.campaign) and reads both processes' CPU time from /proc. Printed: the UI's CPU use
idle and under the stream, as a share of one core, next to the daemon's. Linux and tmux.

    python scripts/bench_tui_cpu.py [--rate 10] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, aclosing
from pathlib import Path

import httpx

from labd.client.api import DaemonClient
from labd.measure.campaign import ReconfigPlan, run_reconfig

SWITCHES = ("ocs1", "ocs2", "ocs3", "mesh1")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU time of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, check=False).stdout


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)  # polling another process's state: nothing to wait on


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/health", timeout=2,
                         headers={"Authorization": "Bearer t"}).status_code == 200
    except httpx.HTTPError:
        return False


async def stream(url: str, rate: float, seconds: float) -> int:
    """Reconfigurations at ``rate`` per second, round-robin over the switches; how many."""
    done = 0
    client = DaemonClient(url, "t")
    async with AsyncExitStack() as stack:
        stack.push_async_callback(client.close)
        campaigns = [await stack.enter_async_context(aclosing(run_reconfig(
            client, ReconfigPlan(s, "toggle", rounds=1_000_000, verify_light=False, seed=i))))
            for i, s in enumerate(SWITCHES)]
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            await campaigns[done % len(campaigns)].__anext__()
            done += 1
            await asyncio.sleep(max(0.0, start + done / rate - time.monotonic()))
    return done


def main(rate: float, seconds: float) -> None:
    if shutil.which("tmux") is None:
        sys.exit("this benchmark runs the UI in a real terminal: it needs tmux")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    session = f"labd-bench-{os.getpid()}"
    with tempfile.TemporaryDirectory() as scratch:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "labd", "run", "demo", "--db", f"{scratch}/s.sqlite",
             "--port", str(port)], env={**os.environ, "LABD_TOKEN": "t"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            until(lambda: daemon.poll() is None and healthy(url), 60, "labd run demo")
            subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50",
                            f"LABD_TOKEN=t exec {sys.executable} -m labd tui {url}"], check=True)
            ui = int(subprocess.run(["tmux", "list-panes", "-t", session, "-F",
                                     "#{pane_pid}"], capture_output=True, text=True,
                                    check=True).stdout.split()[0])
            until(lambda: "live" in pane(session), 30, "the UI to show the lab live")
            ui0, idle0 = cpu_s(ui), time.monotonic()
            time.sleep(5)  # the idle window itself
            idle = (cpu_s(ui) - ui0) / (time.monotonic() - idle0)
            ui0, d0, t0 = cpu_s(ui), cpu_s(daemon.pid), time.monotonic()
            count = asyncio.run(stream(url, rate, seconds))
            took = time.monotonic() - t0
            busy, daemon_busy = (cpu_s(ui) - ui0) / took, (cpu_s(daemon.pid) - d0) / took
            shown = pane(session)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], check=False,
                           capture_output=True)
            daemon.terminate()
            daemon.wait(30)
    print(f"labd tui on the demo lab ({len(SWITCHES)} switches), in tmux 160x50:")
    print(f"  idle:                                  UI {idle * 100:5.1f} % of one core")
    print(f"  {count / took:4.1f} reconfigurations/s for {took:.0f} s:   UI {busy * 100:5.1f} % "
          f"of one core (daemon and emulators: {daemon_busy * 100:.1f} %)")
    print("  the UI's last screen had", "a port map" if "switch" in shown else "NO port map")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10.0, help="reconfigurations per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    main(args.rate, args.seconds)
