"""A daemon's lead under ``--ha``: the lease won, kept, taken over and given up.

It is given what the daemon does at each change as callables: fence the store's writes,
resync the instruments and the jobs, start acting, publish an event, start a task. It holds
no daemon, so the lease's logic is read and tested on its own (docs/scale.md "Standby and
takeover").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from labd.errors import LeaseError
from labd.ha.lease import Lease
from labd.ha.role import TAKING_OVER, Role

__all__ = ["Leadership", "Takeover"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Takeover:
    """What a daemon does as it takes the lead, each a callable of its own."""

    fence: Callable[[str, int], None]
    """Fence the store's writes with the lab's name and the new epoch."""
    resync: Callable[[], Awaitable[Iterable[str]]]
    """Open and resync every instrument, put back the intended state, read the jobs; the
    instruments that failed to open."""
    lead: Callable[[], int]
    """Start acting (recoveries, the bus, the host watchdog); how many recoveries it
    queued for what failed meanwhile."""
    publish: Callable[[str, dict[str, Any]], object]
    spawn: Callable[[Coroutine[Any, Any, None], str], object]
    """Run a coroutine as one of the daemon's loops, under the given name."""


class Leadership:
    """This daemon's side of its lab's lease (``role``), acting through ``takeover``."""

    def __init__(self, role: Role, takeover: Takeover) -> None:
        self.role = role
        self.takeover = takeover

    @property
    def lease(self) -> Lease:
        return self.role.lease

    async def acquire(self, api_url: str, where: str) -> bool:
        """Try for the lease once, telling the others that this daemon's API answers at
        ``api_url``; ``where``: the lease's database, as an error names it."""
        self.lease.api_url = api_url
        try:
            return await self.lease.acquire() is not None
        except Exception as exc:  # the database's errors, whatever its driver calls them
            raise LeaseError(f"cannot reach the lease's database {where!r}: "
                             f"{first_line(exc)}") from None

    async def keep(self) -> None:
        """Renew the lease (leading) or wait for it (standing by) until cancelled. Losing
        it ends the daemon: a leader that can no longer prove it leads must not go on, and
        its supervisor starts it again as a standby."""
        role = self.role

        async def changed(leading: bool) -> None:
            if leading:
                self.takeover.spawn(self.take_over(), "labd-takeover")
                return
            role.ready = False
            self.takeover.publish("warning", {"detail": f"this daemon lost the lead of lab "
                                                        f"{role.lease.name}; it stops"})
            raise LeaseError(f"lost the lead of lab {role.lease.name!r}: the lease was not "
                             f"renewed within {role.lease.ttl_s:g} s (the database out of "
                             "reach, or this process paused), and another daemon may lead "
                             "now; stopping, so that no two daemons command its switches "
                             "(a supervisor starts it again as a standby)")
        await role.lease.run(changed)

    async def take_over(self) -> None:
        """This daemon won the lease: fence the store's writes with its epoch, resync
        (each switch's ``on_drift``, the jobs as the store has them), and only then take
        changes and act on what failed meanwhile."""
        role, act = self.role, self.takeover
        epoch = role.lease.epoch
        assert epoch is not None
        began = time.monotonic()
        act.fence(role.lease.name, epoch)
        marker = TAKING_OVER.set(True)
        try:
            failed = sorted(await act.resync())
        finally:
            TAKING_OVER.reset(marker)
        role.ready = True
        role.took_over_ms = (time.monotonic() - began) * 1000
        queued = act.lead()
        log.warning("lab %s: this daemon leads (epoch %d), taken over in %.1f ms; %d "
                    "recoveries queued for what failed meanwhile", role.lease.name,
                    epoch, role.took_over_ms, queued)
        act.publish("ha.leading", {"lab": role.lease.name, "epoch": epoch,
                                   "url": role.lease.api_url,
                                   "took_over_ms": role.took_over_ms,
                                   "recoveries": queued, "failed": failed})

    async def step_down(self, timeout: float) -> None:
        """Give the lease up (a standby takes over at once, not after the lease's time to
        live); a lease already lost is not touched. The renewal loop has ended first."""
        lease = self.lease
        try:
            if lease.holds():
                await asyncio.wait_for(lease.release(), timeout)
        except Exception as exc:  # the lease then runs out by itself
            log.warning("lab %s: the lease was not given up (%s); a standby takes over once "
                        "it runs out", lease.name, first_line(exc))
        lease.close()


def first_line(exc: BaseException) -> str:
    """What ``exc`` says, its first line; its kind where it says nothing (a TimeoutError:
    its message's first line was an IndexError that ended the step-down)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]
