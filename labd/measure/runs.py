"""Measurement runs as ``labd measure`` keeps them: a run is named, says what was asked
(its parameters), against what (the daemon's URL or the lab file, the lab's name and the
SHA-256 of its file) with which labd version, and holds its raw rows as they were measured
(each committed as it comes, so an interrupted run keeps everything it measured and can be
resumed).

The runs live in a SQLite file of their own (``--runs``, default ``labd-runs.sqlite``), or a
PostgreSQL database by URL, apart from any daemon's store: a campaign is a client of the
daemon, and one file of runs can hold campaigns against many labs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, create_engine, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from labd.errors import RunError
from labd.store.writer import normalise_url

DEFAULT_RUNS = "labd-runs.sqlite"


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(20))  # reconfig, failover, schedule
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    labd_version: Mapped[str] = mapped_column(String(40))
    target: Mapped[str] = mapped_column(String(500))
    lab_name: Mapped[str] = mapped_column(String(200))
    lab_sha256: Mapped[str] = mapped_column(String(64))
    planned: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))  # running, interrupted, complete, failed
    detail: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "params": self.params,
                "labd_version": self.labd_version, "target": self.target,
                "lab": self.lab_name, "lab_sha256": self.lab_sha256, "planned": self.planned,
                "status": self.status, "detail": self.detail,
                "started": self.started.isoformat(),
                "finished": self.finished.isoformat() if self.finished else None}


class RunRow(Base):
    __tablename__ = "run_rows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class RunStore:
    """Runs and their rows. Calls are short and synchronous (SQLite, one client); async
    callers run them in a thread."""

    def __init__(self, url: str | Path = DEFAULT_RUNS) -> None:
        self.url = normalise_url(url)
        try:
            self.engine = create_engine(self.url)
            Base.metadata.create_all(self.engine)
        except (SQLAlchemyError, ValueError) as exc:
            raise RunError(f"cannot use the runs store {self.url!r}: {exc}") from None

    def close(self) -> None:
        self.engine.dispose()

    def create(self, *, name: str, kind: str, params: dict[str, Any], labd_version: str,
               target: str, lab_name: str, lab_sha256: str, planned: int) -> Run:
        run = Run(name=name, kind=kind, params=params, labd_version=labd_version,
                  target=target, lab_name=lab_name, lab_sha256=lab_sha256, planned=planned,
                  status="running", started=datetime.now(UTC))
        with Session(self.engine, expire_on_commit=False) as session:
            session.add(run)
            try:
                session.commit()
            except IntegrityError:
                raise RunError(f"a run named {name!r} exists already; pick another --name, "
                               f"or --resume {name} to go on with it") from None
        return run

    def get(self, name: str) -> Run:
        with Session(self.engine, expire_on_commit=False) as session:
            run = session.scalars(select(Run).where(Run.name == name)).first()
            if run is None:
                known = session.scalars(select(Run.name).order_by(Run.id.desc()).limit(10))
                raise RunError(f"no run {name!r} in {self.url}; latest: "
                               f"{', '.join(known) or 'none'}")
            return run

    def all(self) -> list[tuple[Run, int]]:
        """Every run, newest first, with how many rows it holds."""
        with Session(self.engine, expire_on_commit=False) as session:
            counts: dict[int, int] = {
                run_id: n for run_id, n in session.execute(
                    select(RunRow.run_id, func.count()).group_by(RunRow.run_id))}
            return [(run, counts.get(run.id, 0))
                    for run in session.scalars(select(Run).order_by(Run.id.desc()))]

    def add(self, run: Run, row: dict[str, Any]) -> None:
        """One measured row, committed at once (an interruption keeps it)."""
        with Session(self.engine) as session:
            session.add(RunRow(run_id=run.id, data=row))
            session.commit()

    def rows(self, run: Run) -> list[dict[str, Any]]:
        with Session(self.engine) as session:
            return list(session.scalars(select(RunRow.data).where(RunRow.run_id == run.id)
                                        .order_by(RunRow.id)))

    def finish(self, run: Run, status: str, detail: str | None = None) -> None:
        with Session(self.engine) as session:
            stored = session.get(Run, run.id)
            assert stored is not None
            stored.status, stored.detail = status, detail
            stored.finished = datetime.now(UTC)
            session.commit()
        run.status, run.detail = status, detail

    def reopen(self, run: Run) -> None:
        with Session(self.engine) as session:
            stored = session.get(Run, run.id)
            assert stored is not None
            stored.status, stored.finished = "running", None
            session.commit()
