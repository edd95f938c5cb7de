"""The leader's lease (``labd run --ha``, docs/scale.md "Standby and takeover"): several
daemons on one lab file share one PostgreSQL; the one holding the lease row leads, the others
stand by.

- **Time is the database's.** A row's expiry is set from PostgreSQL's clock, so daemons on
  machines whose clocks disagree still agree on when a lease ran out. Locally, a leader
  believes its lease only until ``ttl`` after it *sent* its last successful renewal, which
  is never later than the database's expiry: it stops leading before anyone else may start.
- **Every takeover raises the epoch**, the fencing token. A write of intended state runs
  :func:`fence` in its own transaction: it reads the row ``FOR SHARE`` and refuses the write
  when the epoch is no longer the writer's. A takeover's ``UPDATE`` waits for fenced writes
  in flight to commit, and every write after it sees the new epoch: a leader that was
  paused (SIGSTOP, a VM migration) and wakes up late cannot overwrite its successor's state.
- **Renewal is off the store's writer**: its own small connection pool, so a renewal never
  waits behind a batch of records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from labd.errors import LeaseError, NotLeader, StaleEpoch

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RENEW_S", "DEFAULT_TTL_S", "Leader", "Lease", "fence"]

DEFAULT_RENEW_S = 0.5
DEFAULT_TTL_S = 2.0

_SEED = text("INSERT INTO leases (name, epoch, holder, url, expires_at, renewed_at) "
             "VALUES (:name, 0, '', '', clock_timestamp() - interval '1 second', "
             "clock_timestamp()) ON CONFLICT (name) DO NOTHING")
_ACQUIRE = text("UPDATE leases SET epoch = epoch + 1, holder = :holder, url = :url, "
                "expires_at = clock_timestamp() + make_interval(secs => :ttl), "
                "renewed_at = clock_timestamp() "
                "WHERE name = :name AND expires_at < clock_timestamp() RETURNING epoch")
_RENEW = text("UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => :ttl), "
              "renewed_at = clock_timestamp() WHERE name = :name AND epoch = :epoch "
              "AND holder = :holder AND expires_at >= clock_timestamp() RETURNING epoch")
_RELEASE = text("UPDATE leases SET expires_at = clock_timestamp() - interval '1 second' "
                "WHERE name = :name AND epoch = :epoch AND holder = :holder")
_READ = text("SELECT epoch, holder, url, expires_at > clock_timestamp() FROM leases "
             "WHERE name = :name")
_FENCE = text("SELECT epoch FROM leases WHERE name = :name FOR SHARE")


@dataclass(frozen=True)
class Leader:
    """Who holds a lab's lease, as the database says now."""

    epoch: int
    holder: str
    url: str
    live: bool
    """False: the lease ran out and nobody has taken it yet."""


def _leader(row: Any) -> Leader | None:
    if row is None or not row[1]:
        return None
    return Leader(epoch=int(row[0]), holder=str(row[1]), url=str(row[2]), live=bool(row[3]))


def fence(connection: Connection, name: str, epoch: int) -> None:
    """In a write's transaction: refuse it (:class:`StaleEpoch`) unless ``epoch`` is still
    the lease's; the row stays share-locked until the transaction ends, so no takeover
    lands between this check and the commit."""
    current = connection.execute(_FENCE, {"name": name}).scalar()
    if current != epoch:
        raise StaleEpoch(f"refused a write of lab {name!r} from epoch {epoch}: the lease is "
                         f"at epoch {current}, another daemon leads now")


def holder_name() -> str:
    """This daemon's name in the lease: its machine, process and a nonce (two daemons of one
    process, as the tests run them, differ too)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Lease:
    """One daemon's side of lab ``name``'s lease on the PostgreSQL at ``url`` (the store's:
    ``leases`` is one of its tables). ``api_url``: where this daemon's API answers, told to
    the others while it leads."""

    def __init__(self, url: str, name: str, *, api_url: str = "",
                 renew_s: float = DEFAULT_RENEW_S, ttl_s: float = DEFAULT_TTL_S,
                 holder: str | None = None) -> None:
        if not renew_s > 0 or not ttl_s >= 2 * renew_s:
            raise LeaseError(f"the lease's renewal ({renew_s:g} s) must be positive and at "
                             f"most half its time to live ({ttl_s:g} s): one late renewal "
                             "must not cost the lead")
        if not url.startswith(("postgresql:", "postgresql+")):
            raise LeaseError("a standby needs PostgreSQL shared by every daemon of the lab "
                             f"(--ha postgresql://…), not {url.split(':', 1)[0]!r}")
        self.url, self.name, self.api_url = url, name, api_url
        self.renew_s, self.ttl_s = renew_s, ttl_s
        self.holder = holder or holder_name()
        self.epoch: int | None = None
        """The epoch this daemon leads in; None while it stands by."""
        self.known: Leader | None = None
        """The leader as last read (while standing by, every ``renew_s``)."""
        self._valid_until = 0.0
        self._engine: Engine | None = None
        self._said = ""

    # -- the connection ------------------------------------------------------------------------
    def _open(self) -> Engine:
        if self._engine is None:
            # A statement that hangs must end before the lease would: the daemon then knows
            # it did not renew, rather than finding out after its successor took over.
            limit_ms = max(100, int(self.ttl_s * 1000 / 2))
            try:
                self._engine = create_engine(
                    self.url, pool_size=1, max_overflow=1, pool_pre_ping=True,
                    connect_args={"connect_timeout": max(1, int(self.ttl_s)),
                                  "options": f"-c statement_timeout={limit_ms} "
                                             f"-c lock_timeout={limit_ms}"})
            except (SQLAlchemyError, ValueError) as exc:
                raise LeaseError(f"cannot use the lease database: {exc}") from None
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    async def _run(self, work: Callable[[Connection], Any]) -> Any:
        def run() -> Any:
            with self._open().begin() as connection:
                return work(connection)
        return await asyncio.to_thread(run)

    # -- the lease -------------------------------------------------------------------------------
    def holds(self) -> bool:
        """Whether this daemon may act as the leader now: it won the lease and renewed it
        less than ``ttl`` ago (by the time the renewal was sent)."""
        return self.epoch is not None and time.monotonic() < self._valid_until

    async def acquire(self) -> int | None:
        """Take the lease if nobody holds it: the new epoch, or None."""
        sent = time.monotonic()

        def work(connection: Connection) -> tuple[int | None, Any]:
            connection.execute(_SEED, {"name": self.name})
            won = connection.execute(_ACQUIRE, {
                "name": self.name, "holder": self.holder, "url": self.api_url,
                "ttl": self.ttl_s}).scalar()
            return won, None if won is not None else connection.execute(
                _READ, {"name": self.name}).first()
        won, row = await self._run(work)
        epoch = None if won is None else int(won)
        if epoch is not None:
            self.epoch, self._valid_until = epoch, sent + self.ttl_s
            self.known = Leader(epoch=epoch, holder=self.holder, url=self.api_url, live=True)
        else:
            self.known = _leader(row)
        return epoch

    async def renew(self) -> bool:
        """Extend the lease; False (and no longer leading) if it was lost."""
        if self.epoch is None:
            return False
        sent, epoch = time.monotonic(), self.epoch
        renewed = await self._run(lambda c: c.execute(_RENEW, {
            "name": self.name, "epoch": epoch, "holder": self.holder,
            "ttl": self.ttl_s}).scalar())
        if renewed is None:
            self.epoch = None
            return False
        self._valid_until = sent + self.ttl_s
        return True

    async def release(self) -> None:
        """Give the lease up at once (a clean stop): a standby need not wait out the TTL."""
        epoch, self.epoch = self.epoch, None
        if epoch is not None:
            await self._run(lambda c: c.execute(_RELEASE, {
                "name": self.name, "epoch": epoch, "holder": self.holder}))

    async def leader(self) -> Leader | None:
        """The lease's row as the database has it now (None: nobody ever led)."""
        self.known = _leader(await self._run(
            lambda c: c.execute(_READ, {"name": self.name}).first()))
        return self.known

    def refusal(self) -> NotLeader:
        """What a change asked of this daemon while it does not lead is told."""
        known = self.known
        if known is None or known.holder == self.holder or not known.live:
            return NotLeader(f"this daemon does not lead lab {self.name!r} now (a standby, "
                             "or its lease ran out) and no other daemon leads it yet; try "
                             "again in a moment")
        return NotLeader(f"this daemon stands by; the daemon leading lab {self.name!r} is at "
                         f"{known.url or known.holder}: send changes there", known.url or None)

    async def run(self, changed: Callable[[bool], Awaitable[None]]) -> None:
        """Keep the lease (leading) or wait for it (standing by) until cancelled, every
        ``renew_s``; ``changed(True)`` once this daemon leads, ``changed(False)`` once it
        no longer does. A database out of reach costs the lead only when the local
        validity runs out."""
        # As last told: a leader paused past its lease (SIGSTOP) wakes up no longer holding
        # it, and is told so, even though it never saw a renewal fail.
        leading = self.holds()
        while True:
            try:
                if self.holds():
                    await self.renew()
                else:
                    self.epoch = None
                    await self.acquire()
                self._said = ""
            except (SQLAlchemyError, OSError) as exc:
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
                if reason != self._said:  # once per reason, not every half second
                    log.warning("lab %s: the lease database cannot be reached (%s)",
                                self.name, reason)
                    self._said = reason
            if self.holds() != leading:
                leading = not leading
                await changed(leading)
            await asyncio.sleep(self._pause())

    def _pause(self) -> float:
        if not self.holds():
            return self.renew_s
        # Renew in time even after a slow round: with at least half the validity left.
        return min(self.renew_s, max(0.0, (self._valid_until - time.monotonic()) / 2))
