"""A private Mosquitto: a broker process of its own on a loopback port, for the tests and the
benchmarks, so that neither depends on (nor disturbs) a broker the machine may run on 1883.
It can be stopped (SIGTERM, or SIGKILL as a crash) and started again on the same port, as a
broker that restarts does; its log is kept in its folder.

    async with Mosquitto(folder) as broker:       # or: broker.start_blocking()
        ...aiomqtt.Client("127.0.0.1", broker.port)...
        await broker.stop(signal.SIGKILL)
        await broker.start()                      # the same port, config and log

The port is picked below the kernel's ephemeral range: the outgoing connections a run makes
by the thousand take their local ports from that range, and one of them could otherwise
hold the port while the broker is down between a stop and a start."""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from labd.errors import BusError


class MosquittoError(BusError):
    """The private broker could not be started or stopped (the message says why, with the
    end of its log)."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int, *, reuse: bool) -> bool:
    """Whether a listener could bind 127.0.0.1:``port`` now. With ``reuse`` (as Mosquitto
    binds, SO_REUSEADDR) the connections left in TIME_WAIT by a broker that was stopped do
    not count, only a socket that holds the port."""
    with socket.socket() as probe:
        if reuse:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nothing holds (not even a connection in TIME_WAIT), outside the ephemeral
    range where there is room below it; else one the kernel picks."""
    low, _ = ephemeral_ports()
    if low > 2048:
        for _ in range(200):
            port = random.randrange(max(1024, low - 16384), low)
            if _bindable(port, reuse=False):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def mosquitto_binary() -> str | None:
    """The mosquitto binary (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)),
        None)


class Mosquitto:
    """A Mosquitto process on 127.0.0.1:``port`` (a free one unless given), configured in
    ``folder`` (a temporary folder, removed by :meth:`close`, unless given).

    ``config`` lines are appended to the file: ``password_file``/``acl_file`` (anonymous
    clients are let in unless a line says ``allow_anonymous``), ``persistence true`` (its
    file goes in ``folder``), ``max_queued_messages``, or a whole config of the caller's
    with its own ``listener`` line (then none is added: pass its ``port``). ``wrapper`` is
    put before the command (``taskset -c 1-3``). Everything the broker logs goes to
    :attr:`log`, appended across restarts."""

    def __init__(self, folder: Path | str | None = None, *, port: int | None = None,
                 config: Sequence[str] = (), wrapper: Sequence[str] = (),
                 name: str = "mosquitto") -> None:
        self._folder = None if folder is None else Path(folder)
        self._owned = folder is None
        self._picked = port is None
        self.port = port if port is not None else free_port()
        self.name = name
        self.config = list(config)
        self.wrapper = list(wrapper)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def folder(self) -> Path:
        """Where its config, log and persistence file are (made on first use, so that a
        broker that is never started leaves nothing behind)."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=f"labd-{self.name}-"))
        elif not self._folder.is_absolute():
            self._folder = self._folder.resolve()
        return self._folder

    @property
    def conf(self) -> Path:
        return self.folder / f"{self.name}.conf"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``, as ``aiomqtt.Client(*broker.address)`` takes it."""
        return ("127.0.0.1", self.port)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = f", log {self._folder / (self.name + '.log')}" if self._folder else ""
        return f"<Mosquitto {self.name} {self.url} {state}{where}>"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_config(self) -> None:
        user = pwd.getpwuid(os.getuid()).pw_name
        keys = {line.split(maxsplit=1)[0] for line in self.config if line.strip()
                and not line.lstrip().startswith("#")}
        lines = [
            f"# labd.mqtt.private: the broker {self.name}, written for one run",
            # Started as root, Mosquitto would become the user 'mosquitto', who can read
            # neither the caller's files (a 0600 password file) nor write this folder.
            f"user {user}",
            "log_dest stderr",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
            f"persistence_location {self.folder}/",
            # A message right behind another is not held for the peer's delayed ACK (40 ms).
            "set_tcp_nodelay true",
        ]
        if "listener" not in keys:
            lines.append(f"listener {self.port} 127.0.0.1")
        if "allow_anonymous" not in keys and "password_file" not in keys:
            lines.append("allow_anonymous true")
        self.conf.write_text("\n".join([*lines, *self.config, ""]), encoding="utf-8")

    def start_blocking(self, timeout: float = 30.0) -> None:
        """Start the broker and return once it accepts connections; the same port, config
        and log on every start. A clear :class:`MosquittoError` if it cannot."""
        if self.running:
            raise MosquittoError(f"{self!r} is already running")
        binary = mosquitto_binary()
        if binary is None:
            raise MosquittoError("Mosquitto is not installed (no 'mosquitto' on PATH or in "
                                 "/usr/sbin; Debian: apt-get install mosquitto)")
        if not _bindable(self.port, reuse=True):
            if not (self._picked and self.starts == 0):
                raise MosquittoError(f"{self.name}: port {self.port} is held by another "
                                     "process")
            # Taken since it was picked (another run picks from the same range): another.
            self.port = free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- labd.mqtt.private: start {self.starts} on port {self.port}\n"
                      .encode())
            log.flush()
            self.process = subprocess.Popen(
                [*self.wrapper, binary, "-c", str(self.conf)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """Until a connection is accepted: the listener is up (whatever the config lets an
        MQTT client do once connected)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                socket.create_connection(self.address, timeout=1).close()
                return
            except OSError:
                pass
            if self.process.poll() is not None:
                code, self.process = self.process.returncode, None
                raise MosquittoError(f"{self.name} exited ({code}) before it listened on "
                                     f"port {self.port}; its log ({self.log}):\n"
                                     f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop_blocking(signal.SIGKILL)
                raise MosquittoError(f"{self.name} did not listen on port {self.port} within "
                                     f"{timeout:g} s; its log ({self.log}):\n{self.log_tail()}")
            # Polling, as nothing else says when the listener is up; the pause only grows
            # where the broker is slow.
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def stop_blocking(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0
                      ) -> int | None:
        """Send ``sig`` (SIGKILL: the broker dies as in a crash, no goodbye to its clients)
        and wait until it has exited; its exit status, or None if it was not running."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise MosquittoError(f"{self.name} did not exit within {timeout:g} s of "
                                     f"{sig.name}; killed") from None
        return process.returncode

    async def start(self, timeout: float = 30.0) -> None:
        """:meth:`start_blocking`, off the event loop."""
        await asyncio.to_thread(self.start_blocking, timeout)

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0
                   ) -> int | None:
        """:meth:`stop_blocking`, off the event loop."""
        return await asyncio.to_thread(self.stop_blocking, sig, timeout)

    def close(self) -> None:
        """Stop it, and remove its folder where it made its own."""
        try:
            self.stop_blocking()
        finally:
            if self._owned and self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    def __enter__(self) -> Mosquitto:
        self.start_blocking()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Mosquitto:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.close)
