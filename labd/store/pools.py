"""The store's writes and reads for jobs: each job's members and spares (its pool) and the
timelines of its recoveries, so that the hosts' code builds no database session."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from labd.store.models import FailoverTimeline, JobPool

__all__ = ["Recorded", "keep_pool", "load_pools", "open_timelines", "save_timeline"]


class Recorded(Protocol):
    """A recovery's timeline as the store keeps it: its row's id once it has one."""

    id: int | None


def keep_pool(job: str, members: list[str], spares: list[str], status: str,
              epoch: int) -> Callable[[Session], None]:
    """The write that keeps a job's members and spares as they are now."""
    pool = JobPool(job=job, members=list(members), spares=list(spares),
                   wall_time=datetime.now(UTC), status=status, epoch=epoch)

    def work(session: Session) -> None:
        session.merge(pool)
    return work


def save_timeline(timeline: Recorded, values: dict[str, Any]) -> Callable[[Session], int]:
    """The write that keeps a recovery's timeline (``values``: its row's columns). Its id
    is set in the writer, so that a later write of it, queued behind, updates the same
    row."""
    def work(session: Session) -> int:
        if timeline.id is None:
            row = FailoverTimeline(**values, wall_time=datetime.now(UTC))
            session.add(row)
            session.flush()
            timeline.id = row.id
            return row.id
        session.execute(update(FailoverTimeline).where(
            FailoverTimeline.id == timeline.id).values(**values))
        return timeline.id
    return work


def load_pools(session: Session) -> tuple[list[FailoverTimeline], list[JobPool]]:
    """The recoveries that swapped a member, oldest first, and every job's kept pool."""
    return (list(session.scalars(select(FailoverTimeline).where(
        FailoverTimeline.outcome == "recovered").order_by(FailoverTimeline.id))),
        list(session.scalars(select(JobPool))))


def open_timelines(session: Session) -> list[FailoverTimeline]:
    """The recoveries without an outcome yet (their daemon stopped in them), oldest first."""
    return list(session.scalars(select(FailoverTimeline).where(
        FailoverTimeline.outcome.in_(("in-progress", "awaiting-operator"))).order_by(
            FailoverTimeline.id)))
