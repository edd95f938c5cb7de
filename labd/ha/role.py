"""A daemon's part in its lab under ``--ha``: leader, standby, or taking over (it won the
lease and is resyncing its instruments). What the engine, the API's edge and
``/v1/health`` ask of it (docs/scale.md "Standby and takeover")."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from labd.errors import NotLeader
from labd.ha.lease import DEFAULT_RENEW_S, DEFAULT_TTL_S, Lease

__all__ = ["TAKING_OVER", "HaSettings", "Role"]

#: Set in the takeover's own task (and the tasks it starts): the takeover's restores reach
#: the switches while every other request is still refused.
TAKING_OVER: contextvars.ContextVar[bool] = contextvars.ContextVar("labd_taking_over",
                                                                   default=False)


@dataclass(frozen=True)
class HaSettings:
    """``labd run --ha URL``: the PostgreSQL holding the lease (the store's), and the
    lease's timing."""

    url: str
    renew_s: float = DEFAULT_RENEW_S
    ttl_s: float = DEFAULT_TTL_S


class Role:
    """Whether this daemon may change its lab now: it holds the lease and has taken over
    (or is the takeover itself)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.ready = False
        """Set once the takeover has opened the instruments and read the intended state."""
        self.took_over_ms: float | None = None
        """How long the latest takeover took, from winning the lease to ready."""

    @property
    def name(self) -> str:
        if not self.lease.holds():
            return "standby"
        return "leader" if self.ready else "taking-over"

    def holds(self) -> bool:
        return self.lease.holds() and (self.ready or TAKING_OVER.get())

    def refusal(self) -> NotLeader:
        if self.lease.holds():
            return NotLeader(f"this daemon has just taken the lead of lab {self.lease.name!r} "
                             "and is resyncing its instruments: try again in a moment")
        return self.lease.refusal()

    def refused(self) -> NotLeader | None:
        """The refusal of a change now, or None where this daemon takes changes."""
        return None if self.holds() else self.refusal()

    def describe(self) -> dict[str, Any]:
        """For ``/v1/health``: this daemon's role, the epoch it leads in, and the leader as
        last read."""
        known = self.lease.known
        return {"role": self.name, "epoch": self.lease.epoch,
                "leader": known.url or known.holder if known is not None and known.live
                else None,
                "lease_ttl_s": self.lease.ttl_s}
