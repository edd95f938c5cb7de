"""The session's lab, served from a thread with an event loop of its own.

It is the emulators and a daemon on them (labd.emulation.rig), or, on a real lab, the daemon
alone, built as ``labd run`` builds it (labd.daemon.assembly). Tests reach it only over its
sockets (the API, the control endpoint), so it serves tests on any event loop (each test's
own, a module's, a session's) and synchronous tests alike, and a test's work cannot hold the
daemon up."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from labd import deadlines
from labd.client.api import DaemonClient
from labd.lab.loader import Lab
from labd.testing.clients import Emulators


@dataclass(frozen=True)
class LabdDaemon:
    """The daemon a session's tests run against (the ``labd_daemon`` fixture)."""

    lab: Lab
    url: str
    """The API's base URL (``http://127.0.0.1:PORT``)."""
    token: str
    """Its admin key: ``Authorization: Bearer <token>``."""
    emulated: bool
    """True where the plugin emulates the lab; False on a real lab (``--labd-lab``)."""
    addresses: dict[str, str] = field(default_factory=dict)
    """Instrument id → the address the daemon's driver dials (an emulator's, or the lab
    file's)."""
    control_url: str | None = None
    """The emulators' control endpoint; None on a real lab."""
    connected: dict[str, str] = field(default_factory=dict)
    """At start-up: each instrument that answered, with its identity."""
    failed: dict[str, str] = field(default_factory=dict)
    """At start-up: each that did not, and why (the daemon keeps reconnecting)."""

    def client(self) -> DaemonClient:
        """A new API client with the admin key, for the calling event loop (close it)."""
        return DaemonClient(self.url, self.token)

    def emulators(self) -> Emulators:
        """A new client of the emulators' control endpoint (close it); emulated labs only."""
        if self.control_url is None:
            raise RuntimeError(f"lab {self.lab.lab.name} is not emulated: it has no control "
                               "endpoint")
        return Emulators(self.control_url, self.addresses)


class LabThread:
    """Serve ``lab`` from a thread: :meth:`start` returns once the daemon listens,
    :meth:`stop` stops the daemon and the emulators and raises what ended them, if
    anything did."""

    def __init__(self, lab: Lab, *, emulate: bool, workdir: Path) -> None:
        self.lab, self.emulate, self.workdir = lab, emulate, workdir
        self.token = secrets.token_urlsafe(24)
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._daemon: LabdDaemon | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"labd-{lab.lab.name}",
                                        daemon=True)

    def start(self) -> LabdDaemon:
        """Start it; the daemon, once it listens. Raises RuntimeError naming why not."""
        self._thread.start()
        timeout = deadlines.current().of("process_ready")
        if not self._started.wait(timeout):
            raise RuntimeError(deadlines.timed_out(
                timeout, f"lab {self.lab.lab.name}'s daemon to listen"))
        if self._daemon is None:
            raise RuntimeError(f"lab {self.lab.lab.name} did not start: "
                               f"{self._error or 'no reason given'}") from self._error
        return self._daemon

    @property
    def daemon(self) -> LabdDaemon:
        """The daemon, once :meth:`start` has returned."""
        if self._daemon is None:
            raise RuntimeError(f"lab {self.lab.lab.name} has not started")
        return self._daemon

    def check(self) -> None:
        """Raise RuntimeError if the lab has stopped (a loop of the daemon failed)."""
        if self._daemon is not None and not self._thread.is_alive():
            raise RuntimeError(f"lab {self.lab.lab.name} stopped during the session: "
                               f"{self._error or 'no reason given'}") from self._error

    def stop(self) -> None:
        """Stop the daemon, then the emulators; raise what ended them, if anything did."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            # The loop may end between the check and the call, if the daemon failed.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(deadlines.current().times(60))
        if self._thread.is_alive():
            raise RuntimeError(deadlines.timed_out(
                deadlines.current().times(60), f"lab {self.lab.lab.name} to stop"))
        if self._error is not None:
            raise RuntimeError(f"lab {self.lab.lab.name} ended with an error: "
                               f"{self._error}") from self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # kept for the test's thread, which reports it
            self._error = error
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        db = str(self.workdir / "labd.sqlite")
        if self.emulate:
            from labd.emulation.rig import emulated_rig

            async with emulated_rig(self.lab, db=db, token=self.token) as rig:
                report = rig.report
                self._daemon = LabdDaemon(
                    lab=self.lab, url=rig.daemon.url, token=self.token, emulated=True,
                    addresses=dict(rig.addresses), control_url=rig.control_url,
                    connected=dict(report.connected), failed=dict(report.failed))
                self._started.set()
                await self._stop.wait()
            return
        from labd.daemon.assembly import assemble

        # A real lab runs as `labd run` runs it, nothing emulated; its store is fresh, so
        # `restore` would clear every switch: it only reports drift.
        async with assemble(self.lab, db=db, token=self.token,
                            restore=False).daemon() as daemon:
            report = daemon.report
            self._daemon = LabdDaemon(
                lab=self.lab, url=daemon.url, token=self.token, emulated=False,
                addresses={e.id: str(e.address) for e in self.lab.instrument},
                connected=dict(report.connected), failed=dict(report.failed))
            self._started.set()
            await self._stop.wait()
