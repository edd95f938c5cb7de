"""Tables. Times are CLOCK_MONOTONIC nanoseconds (comparable with emulator ground truth and
between processes on one machine) plus a wall-clock time for people."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class Reconfiguration(Base):
    __tablename__ = "reconfigurations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    switch: Mapped[str] = mapped_column(String(64))
    """Indexed with ``requested_ns`` (below), which serves queries by switch alone too."""
    cause: Mapped[str] = mapped_column(String(16), index=True)
    """api, recovery, measurement, schedule, restore, adopt"""
    outcome: Mapped[str] = mapped_column(String(16))
    """ok, failed, light-missing"""
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    batch_size: Mapped[int] = mapped_column(Integer)
    requested_ns: Mapped[int] = mapped_column(BigInteger)
    dispatched_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    activated_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """When the command that moved the light left: dispatched_ns, but on a switch that
    prepares a change before making it (CALIENT: ENT-CRS, then ACT-CRS)."""
    acked_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    light_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    done_ns: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    changes: Mapped[list[PairChange]] = relationship(back_populates="reconfiguration",
                                                     cascade="all, delete-orphan")

    __table_args__ = (Index("ix_reconfigurations_switch_time", "switch", "requested_ns"),)


class PairChange(Base):
    __tablename__ = "pair_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    reconfiguration_id: Mapped[int] = mapped_column(ForeignKey("reconfigurations.id"),
                                                    index=True)
    action: Mapped[str] = mapped_column(String(12))  # connect, disconnect
    a: Mapped[int] = mapped_column(Integer)
    b: Mapped[int] = mapped_column(Integer)
    reconfiguration: Mapped[Reconfiguration] = relationship(back_populates="changes")


class ConnectionEvent(Base):
    __tablename__ = "connection_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instrument: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(24))
    state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    at_ns: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PowerTrace(Base):
    __tablename__ = "power_traces"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    meter: Mapped[str] = mapped_column(String(64))
    channel: Mapped[int] = mapped_column(Integer)
    start_ns: Mapped[int] = mapped_column(BigInteger)
    atime_s: Mapped[float]
    dbm: Mapped[bytes] = mapped_column(LargeBinary)
    """little-endian float32 samples"""
    reconfiguration_id: Mapped[int | None] = mapped_column(
        ForeignKey("reconfigurations.id"), nullable=True)


class FailoverTimeline(Base):
    __tablename__ = "failover_timelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(64), index=True)
    outcome: Mapped[str] = mapped_column(String(24))
    """in-progress, awaiting-operator, recovered, no-spare, declined, recorded, failed,
    timeout, skipped (labd.hosts.jobs)"""
    stages: Mapped[dict[str, Any]] = mapped_column(JSON)
    """stage → CLOCK_MONOTONIC ns on the daemon's clock (None: not reached)"""
    wall_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    trigger: Mapped[str | None] = mapped_column(String(24), nullable=True)
    """gpu-failed, host-lost"""
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """the failed member, the plan (spare, new members, circuits), passed-over spares"""


class JobPool(Base):
    """A job's members and spares as recoveries and returned spares left them (what a
    restart starts from, rather than the lab file's)."""

    __tablename__ = "job_pools"

    job: Mapped[str] = mapped_column(String(64), primary_key=True)
    members: Mapped[list[str]] = mapped_column(JSON)
    spares: Mapped[list[str]] = mapped_column(JSON)
    wall_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str | None] = mapped_column(String(20), nullable=True)
    """The job's status when kept (None: kept before statuses were)."""
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)


class IntendedPair(Base):
    """The circuits labd means each switch to hold (what a restart restores)."""

    __tablename__ = "intended_pairs"

    switch: Mapped[str] = mapped_column(String(64), primary_key=True)
    a: Mapped[int] = mapped_column(Integer, primary_key=True)
    b: Mapped[int] = mapped_column(Integer)


class Lease(Base):
    """Who leads a lab (``labd run --ha``): the holder's name and API URL, until when (the
    database's clock), and the epoch, raised by every takeover, that fences every write of
    intended state (labd/ha/lease.py)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(500))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    renewed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PortHold(Base):
    """Ports of a switch held by one client for as long as it renews the lease
    (``/v1/holds``): changes to them from anyone else are refused. Kept here so that a
    daemon taking over the lead (or restarting) refuses them too; ``expires_at`` is
    wall-clock seconds (the Unix epoch), comparable between the daemons of a lab."""

    __tablename__ = "port_holds"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    switch: Mapped[str] = mapped_column(String(64))
    ports: Mapped[list[int]] = mapped_column(JSON)
    holder: Mapped[str] = mapped_column(String(200))
    ttl_s: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
