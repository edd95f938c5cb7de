"""Telling systemd how a service is doing (sd_notify(3)): ``READY=1`` once it serves,
``WATCHDOG=1`` at half the unit's ``WatchdogSec``, ``STOPPING=1`` as it stops, ``STATUS=``
in words. Silently nothing where ``$NOTIFY_SOCKET`` is unset (a terminal, a container).

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket systemd names
(a leading ``@`` is the abstract namespace). It is written here rather than taken from the
``sdnotify`` package: that package's last release is from 2017, it sends with a blocking
call from whatever thread calls it and hides every error, and the protocol is shorter
than the glue around it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """One service's line to systemd; every method does nothing without one."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self._address: str | None = None
        self._socket: socket.socket | None = None
        self.watchdog_s = watchdog_usec / 1e6 if watchdog_usec else None
        """The unit's watchdog period (``WatchdogSec``), or None where it has none."""
        if not address:
            return
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # A full queue on systemd's side must never stall the event loop: such a
        # notification is dropped (the next watchdog ping follows soon).
        self._socket.setblocking(False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        """The notifier systemd set up for this process: ``$NOTIFY_SOCKET``, and
        ``$WATCHDOG_USEC`` where ``$WATCHDOG_PID`` is unset or names this process."""
        env = os.environ if env is None else env
        usec: int | None = None
        pid = env.get("WATCHDOG_PID", "").strip()
        if not pid or pid == str(os.getpid()):
            try:
                usec = int(env.get("WATCHDOG_USEC", "") or 0) or None
            except ValueError:
                usec = None
        return cls(env.get("NOTIFY_SOCKET") or None, usec)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` fields in one datagram; whether it went."""
        if self._socket is None or self._address is None:
            return False
        try:
            self._socket.sendto("\n".join(fields).encode(), self._address)
        except OSError as exc:
            log.warning("cannot notify systemd on %s: %s", self._address.lstrip("\0"), exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    async def keep_alive(self, stop: asyncio.Event) -> None:
        """Ping the watchdog at half its period until ``stop`` is set: systemd restarts a
        service whose event loop stops turning."""
        if self.watchdog_s is None or not self.enabled:
            return
        interval = self.watchdog_s / 2
        while not stop.is_set():
            self.send("WATCHDOG=1")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
