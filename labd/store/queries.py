"""The reads the API makes of the record, each a function of a reader ``Session``
(``Store.read`` runs it in a worker thread). They return the rows themselves: what the
rows become in an answer is the API's business, decided while the session is still open.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from labd.store.models import FailoverTimeline, PowerTrace, Reconfiguration


def as_stored(moment: datetime) -> datetime:
    """A wall-clock time as the store keeps it: UTC (a time without a zone is taken as UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def reconfigurations(session: Session, *, switch: str | None = None,
                     cause: str | None = None, since_ns: int | None = None,
                     until_ns: int | None = None, since: datetime | None = None,
                     until: datetime | None = None, limit: int = 1000
                     ) -> list[Reconfiguration]:
    """Newest first, at most ``limit``; filtered by switch, cause, monotonic request time
    (``*_ns``, inclusive) or wall-clock time (inclusive). Empty filters are no filters."""
    query = select(Reconfiguration).order_by(Reconfiguration.id.desc()).limit(limit)
    if switch:
        query = query.where(Reconfiguration.switch == switch)
    if cause:
        query = query.where(Reconfiguration.cause == cause)
    if since_ns is not None:
        query = query.where(Reconfiguration.requested_ns >= since_ns)
    if until_ns is not None:
        query = query.where(Reconfiguration.requested_ns <= until_ns)
    if since is not None:
        query = query.where(Reconfiguration.wall_time >= as_stored(since))
    if until is not None:
        query = query.where(Reconfiguration.wall_time <= as_stored(until))
    return list(session.scalars(query))


def power_traces(session: Session, reconfiguration: int) -> list[PowerTrace]:
    """The power traces light verification logged for one reconfiguration."""
    return list(session.scalars(select(PowerTrace).where(
        PowerTrace.reconfiguration_id == reconfiguration)))


def failovers(session: Session, *, job: str | None = None,
              limit: int = 100) -> list[FailoverTimeline]:
    """Recovery timelines, newest first, at most ``limit``, of one job or of all."""
    query = select(FailoverTimeline).order_by(FailoverTimeline.id.desc()).limit(limit)
    if job is not None:
        query = query.where(FailoverTimeline.job == job)
    return list(session.scalars(query))


def failover(session: Session, failover_id: int) -> FailoverTimeline | None:
    """One recovery timeline by id; None if there is none."""
    return session.get(FailoverTimeline, failover_id)
