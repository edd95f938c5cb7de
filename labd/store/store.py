"""One writer, many readers.

Every write goes through one writer thread that takes whatever has queued up and commits it
as one transaction, so a burst of records costs one commit, and the event loop never waits
on the disk: ``await store.write(...)`` resolves when the record is committed (durable).
Readers run on their own pooled connections in worker threads. SQLite runs in WAL mode with
a busy timeout, so readers and the writer never see "database is locked".
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, delete, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from labd.errors import LabdError
from labd.store.models import ConnectionEvent, IntendedPair, PairChange, Reconfiguration

log = logging.getLogger(__name__)
T = TypeVar("T")
BATCH = 5000


class StoreError(LabdError):
    """The store cannot be opened or written; the message says which and why."""


def normalise_url(target: str | Path) -> str:
    """A path (or ``:memory:``) means SQLite; anything with ``://`` is a SQLAlchemy URL."""
    text = str(target)
    if "://" in text:
        if text.startswith("postgresql://"):
            return "postgresql+psycopg://" + text.removeprefix("postgresql://")
        return text
    return f"sqlite:///{text}"


class Store:
    def __init__(self, url: str | Path) -> None:
        self.url = normalise_url(url)
        self.engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._queue: queue.Queue[tuple[list[Any] | Callable[[Session], Any] | None,
                                       asyncio.Future[Any] | None,
                                       asyncio.AbstractEventLoop | None]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.committed = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._writer, name="labd-store-writer",
                                        daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            engine = create_engine(self.url, pool_pre_ping=True)
        except (SQLAlchemyError, ValueError) as exc:
            raise StoreError(f"cannot use store {self.url!r}: {exc}") from None
        if engine.dialect.name == "sqlite":
            @event.listens_for(engine, "connect")
            def _pragmas(dbapi: Any, record: Any) -> None:
                cursor = dbapi.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                # NORMAL: a killed process loses nothing committed (only power loss could).
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA busy_timeout=5000")
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.close()
        try:
            with engine.begin() as connection:
                config = Config()
                config.set_main_option("script_location", "labd.store:migrations")
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot open store {self.url!r}: {exc.__class__.__name__}: "
                             f"{exc.args[0] if exc.args else exc}") from None
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    async def close(self) -> None:
        if self._thread is not None:
            self._queue.put((None, None, None))
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self.engine is not None:
            self.engine.dispose()

    # -- writing ---------------------------------------------------------------------------
    async def write(self, *records: Any) -> None:
        """Add ORM objects; returns once they are committed."""
        await self._submit(list(records))

    async def run_write(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` inside the writer's next transaction."""
        result: T = await self._submit(work)
        return result

    def write_nowait(self, *records: Any) -> None:
        """Queue records without waiting for the commit (events, traces)."""
        self._queue.put((list(records), None, None))

    async def _submit(self, item: list[Any] | Callable[[Session], Any]) -> Any:
        if self._thread is None:
            raise StoreError("the store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put((item, future, loop))
        return await future

    def _writer(self) -> None:
        assert self._sessions is not None
        running = True
        while running:
            batch = [self._queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [entry for entry in batch if entry[0] is not None]
            running = len(work) == len(batch)
            if not work:
                continue
            results: list[Any] = []
            error: BaseException | None = None
            try:
                with self._sessions.begin() as session:
                    for item, _, _ in work:
                        if callable(item):
                            results.append(item(session))
                        elif item is not None:
                            session.add_all(item)
                            results.append(None)
                self.committed += len(work)
            except Exception as exc:  # reported to every waiter of the batch
                log.exception("store write failed")
                error = exc
            for index, (_, future, loop) in enumerate(work):
                if future is None or loop is None:
                    continue
                if error is not None:
                    loop.call_soon_threadsafe(_fail, future, error)
                else:
                    loop.call_soon_threadsafe(_succeed, future, results[index])

    # -- reading ---------------------------------------------------------------------------
    async def read(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` on a reader connection in a worker thread."""
        if self._sessions is None:
            raise StoreError("the store is not open")
        sessions = self._sessions

        def run() -> T:
            with sessions() as session:
                return work(session)

        return await asyncio.to_thread(run)

    # -- the intended state ----------------------------------------------------------------
    async def intended(self) -> dict[str, dict[int, int]]:
        def work(session: Session) -> dict[str, dict[int, int]]:
            out: dict[str, dict[int, int]] = {}
            for row in session.scalars(select(IntendedPair)):
                out.setdefault(row.switch, {})[row.a] = row.b
            return out

        return await self.read(work)


def _succeed(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(StoreError(f"store write failed: {error}"))


def reconfiguration_row(*, switch: str, cause: str, outcome: str, error: str | None,
                        connected: Sequence[tuple[int, int]],
                        disconnected: Sequence[tuple[int, int]], requested_ns: int,
                        dispatched_ns: int | None, acked_ns: int | None, light_ns: int | None,
                        done_ns: int) -> Reconfiguration:
    wall = datetime.now(UTC) - _since(requested_ns)
    row = Reconfiguration(switch=switch, cause=cause, outcome=outcome, error=error,
                          batch_size=len(connected) + len(disconnected),
                          requested_ns=requested_ns, dispatched_ns=dispatched_ns,
                          acked_ns=acked_ns, light_ns=light_ns, done_ns=done_ns, wall_time=wall)
    row.changes = ([PairChange(action="connect", a=a, b=b) for a, b in connected]
                   + [PairChange(action="disconnect", a=a, b=b) for a, b in disconnected])
    return row


def _since(monotonic_ns: int) -> timedelta:
    """How long ago a monotonic timestamp was, to date a record on the wall clock."""
    return timedelta(microseconds=(time.monotonic_ns() - monotonic_ns) / 1000)


def set_intended(session: Session, switch: str, pairs: dict[int, int]) -> None:
    """Replace a switch's intended circuits (inside the writer's transaction)."""
    session.execute(delete(IntendedPair).where(IntendedPair.switch == switch))
    session.add_all(IntendedPair(switch=switch, a=a, b=b) for a, b in pairs.items())


def connection_row(instrument: str, kind: str, state: str | None, detail: str,
                   at_ns: int) -> ConnectionEvent:
    return ConnectionEvent(instrument=instrument, kind=kind, state=state, detail=detail,
                           at_ns=at_ns, wall_time=datetime.now(UTC) - _since(at_ns))

