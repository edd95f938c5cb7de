"""The soak's processes (scripts/soak.py): for each lab, a ``labd emulate`` process that plays
its instruments and GPU hosts as hardware would, and one ``labd run`` daemon on it, or two
under ``--ha`` (a leader and a standby); each process's output captured to a file of its
own, scanned at the end for tracebacks and ERROR lines; each daemon's RSS and open file
descriptors read from /proc. And a private PostgreSQL database per lab, made on the server
that ``--db`` names and dropped after, as tests/databases.py does for a test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from labd import deadlines
from labd.mqtt.credentials import Credentials
from labd.mqtt.envelope import new_key
from labd.mqtt.topics import lab_root, new_instance

#: The client whose key seals the soak's (bad) switch commands on the bus.
SOAK_CLIENT = "soak"
#: The lease's timing under --ha: the defaults of ``labd run`` (docs/scale.md).
LEASE_RENEW_S, LEASE_TTL_S = 0.5, 2.0
#: How long a process may take to say it is ready (a loaded 2-core machine included).
READY_S = 90.0


def scaled(seconds: float) -> float:
    """A deadline on another process, scaled as labd's own are (``--deadline-scale``,
    ``$LABD_DEADLINE_SCALE``: a loaded machine)."""
    return deadlines.current().times(seconds)
TRACEBACK = "Traceback (most recent call last)"
#: An ERROR line: labd's human format (``time ERROR logger: ...``), its JSON format, and what
#: a library prints past labd's handlers (uvicorn's ``ERROR:    Exception in ASGI ...``).
ERROR_LINE = re.compile(r'(?:^|\s)(?:ERROR|CRITICAL)[:\s]|"level": "(?:error|critical)"')


def usage(pid: int) -> tuple[float, int] | None:
    """A process's RSS (MiB) and open file descriptors; None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            pages = int(statm.read().split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20, fds


@dataclass
class LogScan:
    """What a process's log holds that must not be there."""

    tracebacks: int = 0
    errors: int = 0
    excerpts: list[str] = field(default_factory=list)


def scan_log(path: Path, keep: int = 6) -> LogScan:
    """Count traceback blocks (a chained exception counts each block) and ERROR lines
    (:data:`ERROR_LINE`); keep one excerpt of each kind: the line, or for a traceback
    printed as plain text, what it raised (the block's first line that is not indented)."""
    scan = LogScan()
    seen: set[str] = set()

    def excerpt(text: str) -> None:
        kind = re.sub(r"[0-9a-f]{6,}|\d+", "#", text)
        if kind not in seen and len(scan.excerpts) < keep:
            seen.add(kind)
            scan.excerpts.append(text)

    try:
        text = path.read_text(errors="replace")
    except OSError:
        return scan
    in_block = False
    for line in text.splitlines():
        blocks = line.count(TRACEBACK)
        error = ERROR_LINE.search(line) is not None
        scan.tracebacks += blocks
        scan.errors += error
        if blocks and line.startswith(TRACEBACK):
            in_block = True
        elif in_block and line and not line[0].isspace() \
                and not line.startswith("During handling"):
            in_block = False
            excerpt(f"traceback: {line[:300]}")
        if error or (blocks and not line.startswith(TRACEBACK)):
            excerpt(_excerpt(line))
    return scan


def _excerpt(line: str) -> str:
    """A log line cut to its point: a JSON line's level, logger, message and the last line
    of its exception (what was raised)."""
    try:
        data = json.loads(line)
    except ValueError:
        return line[:300]
    if not isinstance(data, dict):
        return line[:300]
    raised = str(data.get("exception", "")).strip().splitlines()
    message = " ".join(str(data.get("message")).split())
    return (f"{data.get('level')} {data.get('logger')}: {message[:200]}"
            + (f" | {raised[-1][:200]}" if raised else ""))


@dataclass
class Process:
    """A child of the soak, its stdout and stderr going to ``log``."""

    name: str
    process: asyncio.subprocess.Process
    log: Path
    url: str = ""
    started: tuple[float, int] | None = None
    """RSS (MiB) and fds once it was ready."""
    ended: str = ""
    """How it ended, when the soak ended it during the run (a drill), or how it exited."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not gone within ``grace_s``; SIGCONT first, in
        case a drill left it stopped."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
                self.process.terminate()
            try:
                async with asyncio.timeout(grace_s):
                    await self.process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()


def _appending(log: Path) -> BinaryIO:
    return log.open("ab")  # the child gets its own copy of the descriptor


async def spawn(name: str, log: Path, *args: str, env: dict[str, str] | None = None
                ) -> Process:
    """``python -m labd ARGS`` with its output appended to ``log``."""
    with _appending(log) as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "labd", *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=out,
            env={**os.environ, "COLUMNS": "400", **(env or {})})  # rich wraps at 80
    return Process(name, process, log)


async def wait_in_log(proc: Process, pattern: re.Pattern[str], within_s: float) -> re.Match[str]:
    """Wait (polling the file: the child has no other way to say it) for ``pattern`` in the
    process's log; an error with the log's tail if it exits or the deadline passes."""
    within_s = scaled(within_s)
    end = time.monotonic() + within_s
    while True:
        text = proc.log.read_text(errors="replace")
        found = pattern.search(text)
        if found is not None:
            return found
        if not proc.alive or time.monotonic() > end:
            why = (f"exited with status {proc.process.returncode}" if not proc.alive
                   else f"said nothing ready within {within_s:g} s")
            tail = "\n    ".join(text.splitlines()[-15:])
            raise RuntimeError(f"{proc.name} {why}; its log {proc.log}:\n    {tail}")
        await asyncio.sleep(0.1)  # polling an outcome with a deadline


API_LINE = re.compile(r"API (https?://[0-9.]+:\d+)/v1")
READY_LINE = re.compile(r'^\{"ready": true, "control": "([^"]+)"\}$', re.MULTILINE)


class Site:
    """One lab of the soak: its emulators and hosts in a ``labd emulate`` process, its
    daemons (one; or under --ha a leader and a standby, on a PostgreSQL database of its
    own), the keys of its bus, and which daemon leads."""

    def __init__(self, lab: str, hosts: list[str], logs: Path, mqtt: str, token: str,
                 *, db: str, ha: bool) -> None:
        self.lab, self.hosts, self.logs, self.mqtt, self.token = lab, hosts, logs, mqtt, token
        self.db, self.ha = db, ha
        self.instance = new_instance()
        self.root = lab_root(lab, self.instance)
        self.credentials = Credentials(hosts={h: new_key() for h in hosts},
                                       clients={SOAK_CLIENT: new_key()},
                                       instance=self.instance)
        self.keys = logs / f"{lab}.keys.toml"
        self.credentials.write(self.keys)
        self.resolved = logs / f"{lab}.resolved.toml"
        self.emulator: Process | None = None
        self.control = ""
        self.daemons: list[Process] = []
        """Every daemon this site started, those that ended included (their logs count)."""
        self.leading: Process | None = None
        self.http = httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"})
        self.on_daemon: list[Any] = []
        """Called with each daemon as it is ready (the soak follows its events)."""

    async def start(self) -> None:
        self.emulator = await spawn(
            f"{self.lab}-emulate", self.logs / f"{self.lab}-emulate.log", "emulate", self.lab,
            "--resolved", str(self.resolved), "--mqtt", self.mqtt, "--mqtt-credentials",
            str(self.keys), "--instance", self.instance)
        self.control = (await wait_in_log(self.emulator, READY_LINE, READY_S)).group(1)
        await self.start_daemon()
        if self.ha:
            await self.until_role(self.daemons[0], "leader", READY_S)
            await self.start_daemon()
            await self.until_role(self.daemons[1], "standby", READY_S)
        self.leading = self.daemons[0]

    async def start_daemon(self) -> Process:
        """One more ``labd run`` on the lab (a standby, where one leads already)."""
        name = f"{self.lab}-{len(self.daemons) + 1}"
        store = (["--ha", self.db, "--lease-renew", str(LEASE_RENEW_S), "--lease-ttl",
                  str(LEASE_TTL_S)] if self.ha else ["--db", self.db])
        proc = await spawn(name, self.logs / f"{name}.log", "run", str(self.resolved),
                           "--log-format", "json", "--port", "0", "--mqtt", self.mqtt,
                           "--mqtt-credentials", str(self.keys), "--instance", self.instance,
                           *store, env={"LABD_TOKEN": self.token})
        self.daemons.append(proc)
        proc.url = (await wait_in_log(proc, API_LINE, READY_S)).group(1)
        proc.started = usage(proc.pid)
        for call in self.on_daemon:
            call(proc)
        return proc

    async def role(self, proc: Process, timeout: float = 2.0) -> str | None:
        """What the daemon says it is (leader, standby, taking-over; ``leader`` without
        --ha), or None while it does not answer."""
        if not proc.alive:
            return None
        try:
            answer = (await self.http.get(proc.url + "/v1/health", timeout=timeout)).json()
        except (httpx.TransportError, ValueError):
            return None
        ha = answer.get("ha") if isinstance(answer, dict) else None
        return str(ha["role"]) if isinstance(ha, dict) else "leader"

    async def until_role(self, proc: Process, wanted: str, within_s: float) -> float:
        """Wait (polling its health: another process) until ``proc`` says it is
        ``wanted``; the seconds that took (TimeoutError past ``within_s``)."""
        began = time.monotonic()
        async with asyncio.timeout(scaled(within_s)):
            while True:
                if await self.role(proc) == wanted:
                    break
                await asyncio.sleep(0.05)
        return time.monotonic() - began

    async def find_leader(self) -> Process | None:
        """Ask every live daemon; the one that leads (and has taken over), if any."""
        for proc in self.daemons:
            if proc.alive and await self.role(proc, timeout=1.0) == "leader":
                self.leading = proc
                return proc
        self.leading = None
        # A lab between leaders: the steps that find none come back a little later, rather
        # than turning into thousands of questions to the standbys.
        await asyncio.sleep(0.05)
        return None

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """A request to whichever daemon leads (found again after a refusal that names
        another leader, or a daemon that does not answer); None when none answers."""
        proc = self.leading if self.leading is not None and self.leading.alive \
            else await self.find_leader()
        if proc is None:
            return None
        try:
            response = await self.http.request(method, proc.url + path, **kwargs)
        except httpx.TransportError:
            self.leading = None
            return None
        if response.status_code == 503 and "x-labd-leader" in response.headers:
            self.leading = None
        return response

    async def get_json(self, path: str, **kwargs: Any) -> Any:
        """The leader's answer to a read; None when no leader answers it with a 200."""
        response = await self.call("GET", path, **kwargs)
        if response is None or response.status_code != 200:
            return None
        return response.json()

    async def close(self) -> None:
        for proc in self.daemons:
            await proc.stop()
        if self.emulator is not None:
            await self.emulator.stop()
        await self.http.aclose()
