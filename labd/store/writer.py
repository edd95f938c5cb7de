"""The store: one writer thread commits every write, readers run on pooled connections.

``await store.write(...)`` resolves once the record is durable, and a burst of writes costs
one commit. A store that fails its check at open refuses the start; a write or read that
fails later is a :class:`StoreUnavailable` (the API's 503), its transaction rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, make_url, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from labd.errors import StaleEpoch, StoreError, StoreUnavailable
from labd.files import create_private
from labd.repeats import Repeats
from labd.store.affinity import Follower, current_cpu
from labd.store.models import IntendedPair
from labd.store.records import (
    ReconfigurationRecord,
    commit_alone,
    commits_alone,
    connection_row,
    insert_records,
    set_intended,
)

# What other packages import from here, beside the store itself.
__all__ = ["ReconfigurationRecord", "Store", "connection_row", "insert_records",
           "normalise_url", "set_intended", "sqlite_path", "stale", "stale_message"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: What the writer's queue holds: the work, and the future and loop of whoever waits on it.
_Queued = tuple[Any, "asyncio.Future[Any] | None", "asyncio.AbstractEventLoop | None"]
BATCH = 5000
#: SQLite result codes that mean the file itself is damaged (not merely out of reach).
DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
#: The most problems of a failed integrity check quoted in the error.
QUOTED_PROBLEMS = 3




def normalise_url(target: str | Path) -> str:
    """A path (or ``:memory:``) means SQLite; anything with ``://`` is a SQLAlchemy URL."""
    text = str(target)
    if "://" in text:
        if text.startswith("postgresql://"):
            return "postgresql+psycopg://" + text.removeprefix("postgresql://")
        return text
    return f"sqlite:///{text}"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for anything else (and for an in-memory database)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    database = parsed.database
    if not parsed.drivername.startswith("sqlite") or not database or database == ":memory:" \
            or database.startswith("file:"):
        return None
    return Path(database)


def _create_private(path: Path) -> None:
    """Create the SQLite file readable by its owner only, from the first byte: SQLite gives
    its -wal and -shm files the database's mode, so they are private too. An existing file
    keeps its mode."""
    try:
        create_private(path)
    except OSError as exc:
        raise StoreError(f"cannot open store {str(path)!r}: cannot create it: "
                         f"{exc.strerror or exc}") from None


#: The PostgreSQL connection's settings unless the store's URL gives its own (a query
#: parameter of the same name): a server that does not answer refuses the start in seconds
#: rather than hanging it, and the daemon's sessions are named in ``pg_stat_activity``.
#: ``synchronous_commit`` stays the server's (on by default): an acknowledged change is one
#: the server has flushed to its WAL, which is what a record is for
#: (``?options=-csynchronous_commit%3Doff`` trades that for less latency: docs/benchmarks.md).
POSTGRESQL_DEFAULTS: dict[str, Any] = {"connect_timeout": 10, "application_name": "labd"}


def _connect_defaults(url: str) -> dict[str, Any]:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return {}  # create_engine says what is wrong with it
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() != "psycopg":
        return {}
    return {k: v for k, v in POSTGRESQL_DEFAULTS.items() if k not in parsed.query}


def _reason(exc: SQLAlchemyError) -> str:
    return f"{exc.__class__.__name__}: {exc.args[0] if exc.args else exc}"


def _damaged(exc: SQLAlchemyError) -> bool:
    orig = getattr(exc, "orig", None)
    return isinstance(orig, sqlite3.Error) and getattr(orig, "sqlite_errorname", "") in DAMAGED


class Store:
    """A store by URL (a path: SQLite). The writer commits whatever has queued up as one
    transaction, a few records on the CPU the loop queued them from (labd.store.affinity);
    SQLite runs in WAL mode with a busy timeout, so readers and the writer never see
    "database is locked"."""

    def __init__(self, url: str | Path) -> None:
        self.url = normalise_url(url)
        self.path = sqlite_path(self.url)
        self.engine: Engine | None = None
        self.failing: str | None = None
        """Why the last write failed; None while writes succeed."""
        self._sessions: sessionmaker[Session] | None = None
        # SimpleQueue: the C queue, a fraction of queue.Queue's locking on every record.
        self._queue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.committed = 0
        self.fence: tuple[str, int] | None = None
        """(lab, epoch) while this daemon leads under ``--ha``: every write transaction
        first checks the epoch against the lease's (``labd_fence``, migration 0007), and
        one from a passed epoch is refused whole (:class:`StaleEpoch`)."""
        self.loop_cpu = -1
        """The CPU the event loop last queued a write from (-1: unknown): where the writer
        commits a few records (labd.store.affinity)."""
        self.on_commit: Callable[[float], None] | None = None
        """Told each committed batch's time in the writer (seconds; from the writer's
        thread: the metrics' histogram takes it so)."""
        self._refusals = Repeats()
        self._refusals_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._writer, name="labd-store-writer",
                                        daemon=True)
        self._thread.start()

    @property
    def writer_id(self) -> int | None:
        """The writer thread's native id while the store is open (where it runs can be
        read back by it: ``os.sched_getaffinity``)."""
        return None if self._thread is None else self._thread.native_id

    @property
    def queue_depth(self) -> int:
        """Writes handed to the writer and not yet taken (approximate, as the queue's)."""
        return self._queue.qsize()

    @property
    def where(self) -> str:
        """The store as the user named it: its file, or its URL without a password."""
        if self.path is not None:
            return str(self.path)
        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except ArgumentError:
            return self.url

    def _open(self) -> None:
        if self.path is not None:
            _create_private(self.path)
        try:
            engine = create_engine(self.url, pool_pre_ping=True,
                                   connect_args=_connect_defaults(self.url))
        except (SQLAlchemyError, ValueError) as exc:
            raise StoreError(f"cannot use store {self.where!r}: {exc}") from None
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
            self._check(engine)
            with engine.begin() as connection:
                config = Config()
                config.set_main_option("script_location", "labd.store:migrations")
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                connection.execute(text("SELECT version_num FROM alembic_version")).all()
        except SQLAlchemyError as exc:
            engine.dispose()
            if _damaged(exc):
                raise self._damaged_error(_reason(exc)) from None
            raise StoreError(f"cannot open store {self.where!r}: {_reason(exc)}") from None
        except StoreError:
            engine.dispose()
            raise
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def _check(self, engine: Engine) -> None:
        """Refuse a damaged store before anything reads or writes it."""
        with engine.connect() as connection:
            if engine.dialect.name != "sqlite":
                connection.execute(text("SELECT 1")).all()
                return
            problems = [str(row[0]) for row in connection.exec_driver_sql(
                f"PRAGMA quick_check({QUOTED_PROBLEMS})").all()]
        if problems != ["ok"]:
            lines = [line.strip() for problem in problems for line in problem.splitlines()
                     if line.strip() and not line.startswith("***")]
            raise self._damaged_error("SQLite's integrity check found: "
                                      + "; ".join(lines[:QUOTED_PROBLEMS]))

    def _damaged_error(self, detail: str) -> StoreError:
        return StoreError(
            f"store {self.where!r} is damaged ({detail}); labd will not start on it. Move "
            f"it aside (with its -wal and -shm files) and restore it from a backup; or start "
            f"on a fresh store with --no-restore, which keeps the circuits the switches hold "
            f"(a fresh store intends none)")

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

    async def record(self, record: ReconfigurationRecord) -> int:
        """Write a reconfiguration (and its intended state); returns its id once committed.
        Records queued together go in with one bulk insert."""
        row_id: int = await self._submit(record)
        return row_id

    async def run_write(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` inside the writer's next transaction."""
        result: T = await self._submit(work)
        return result

    def write_nowait(self, *records: Any) -> None:
        """Queue records without waiting for the commit (events, traces)."""
        self._queue.put((list(records), None, None))

    def run_write_nowait(self, work: Callable[[Session], Any]) -> None:
        """Queue ``work(session)`` for the writer without waiting for the commit; writes
        are applied in the order they were queued, waited for or not."""
        self._queue.put((work, None, None))

    async def check_writable(self) -> None:
        """Raise :class:`StoreUnavailable` when the store cannot take a write now. Free
        while writes succeed; after a failed write, one empty write tells whether the store
        is back (so a request is refused before it touches a device)."""
        if self.failing is None:
            return
        await self.run_write(_probe)

    async def _submit(self, item: Any) -> Any:
        if self._thread is None:
            raise StoreError("the store is not open")
        if current_cpu is not None:
            self.loop_cpu = current_cpu()  # where the writer goes for it (affinity.py)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put((item, future, loop))
        return await future

    def _writer(self) -> None:
        assert self._sessions is not None and self.engine is not None
        # The writer keeps one connection for its life: a pool checkout (with its ping) and
        # check-in (with its rollback) per batch cost more than a one-record transaction.
        # A failed batch drops it; the next batch connects afresh.
        connection: Connection | None = None
        follower = Follower()
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
            follower.before(len(work), self.loop_cpu)
            connection, results, error = self._commit(connection, work)
            # The store's name only for a refusal's message: it is a URL parsed anew.
            _wake(work, results, error, self.where if error is not None else "")
        if connection is not None:
            connection.close()

    def _commit(self, connection: Connection | None, work: list[_Queued]
                ) -> tuple[Connection | None, list[Any], BaseException | None]:
        """One batch as one commit: the connection to keep, each item's result, and the
        error that refused the whole batch (None when it is committed)."""
        assert self.engine is not None
        started = time.perf_counter()
        fence = self.fence
        try:
            if connection is None:
                connection = self.engine.connect()
            records = [item for item, _, _ in work if isinstance(item, ReconfigurationRecord)]
            if len(records) == len(work) and commits_alone(connection, records, fence):
                results = commit_alone(connection, records, fence)
            else:
                results = _transaction(connection, [item for item, _, _ in work], records,
                                       fence)
            self.committed += len(work)
            self.failing = None
            if self.on_commit is not None:
                self.on_commit(time.perf_counter() - started)
        except Exception as exc:  # reported to every waiter of the batch
            reason = _reason(exc) if isinstance(exc, SQLAlchemyError) else \
                f"{exc.__class__.__name__}: {exc}"
            fenced = stale(exc)
            if fenced:
                reason = stale_message(exc)
            # One line, not a traceback: every waiter hears of it as a refusal. A fenced
            # write is the fence doing its work (a leader that lost its lease), not the
            # store failing; a full disk refuses every write, told once a while.
            self._tell("stale write" if fenced else "write",
                       logging.WARNING if fenced else logging.ERROR,
                       f"store {self.where} refused a write of {len(work)} record(s): "
                       f"{reason}")
            self.failing = reason
            _discard(connection)
            return None, [], exc
        return connection, results, None

    def _tell(self, key: str, level: int, line: str) -> None:
        """A refusal, logged through the one limiter (labd.repeats): from the writer's
        thread and the readers' alike."""
        with self._refusals_lock:
            told = self._refusals.tell(key)
        if told is not None:
            log.log(level, "%s%s", line, told.suffix())

    # -- reading ---------------------------------------------------------------------------
    async def read(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` on a reader connection in a worker thread."""
        if self._sessions is None:
            raise StoreError("the store is not open")
        sessions = self._sessions

        def run() -> T:
            with sessions() as session:
                return work(session)

        try:
            return await asyncio.to_thread(run)
        except SQLAlchemyError as exc:
            self._tell("read", logging.ERROR,
                       f"store {self.where} refused a read: {_reason(exc)}")
            raise StoreUnavailable(f"store {self.where!r} cannot be read now: {_reason(exc)}"
                                   f"{_ADVICE}") from None

    # -- the intended state ----------------------------------------------------------------
    async def intended(self) -> dict[str, dict[int, int]]:
        def work(session: Session) -> dict[str, dict[int, int]]:
            out: dict[str, dict[int, int]] = {}
            for row in session.scalars(select(IntendedPair)):
                out.setdefault(row.switch, {})[row.a] = row.b
            return out

        return await self.read(work)


def _transaction(connection: Connection, items: list[Any],
                 records: list[ReconfigurationRecord],
                 fence: tuple[str, int] | None = None) -> list[Any]:
    """One batch as one transaction: its reconfiguration records (on the driver's own
    connection: the hot path) and any other work, which alone pays for an ORM session;
    returns each item's result, in order. ``fence``: (lab, epoch) checked first."""
    results: list[Any] = []
    with connection.begin():
        if fence is not None:
            connection.execute(_FENCE, {"lab": fence[0], "epoch": fence[1]})
        ids = iter(insert_records(connection, records))
        session: Session | None = None
        for item in items:
            if isinstance(item, ReconfigurationRecord):
                results.append(next(ids))
                continue
            if session is None:
                session = Session(bind=connection, expire_on_commit=False)
            if callable(item):
                results.append(item(session))
            elif item is not None:
                session.add_all(item)
                results.append(None)
        if session is not None:
            session.flush()
            session.close()
    return results


#: The fence of a leader's write (migration 0007), as its first statement.
_FENCE = text("SELECT labd_fence(:lab, :epoch)")
#: The SQLSTATE ``labd_fence`` refuses a write from a passed epoch with.
STALE_EPOCH = "LF001"


def stale(exc: BaseException) -> bool:
    """Whether a failed write was refused by the fence: its epoch is no longer the lease's."""
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlstate", None) == STALE_EPOCH or isinstance(exc, StaleEpoch)


def stale_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", exc)
    diag = getattr(orig, "diag", None)
    return str(getattr(diag, "message_primary", None) or str(orig).splitlines()[0])


_ADVICE = ("; check the disk (space, permissions), or stop labd and move the store aside "
           "if it is damaged")


def _discard(connection: Connection | None) -> None:
    """Let go of the writer's connection, whatever state it is in."""
    if connection is not None:
        with contextlib.suppress(Exception):
            connection.invalidate()
            connection.close()


def _probe(session: Session) -> None:
    """A write that changes nothing, to learn whether the store takes writes again."""
    session.execute(text("UPDATE alembic_version SET version_num = version_num"))


def _settle(items: list[tuple[asyncio.Future[Any], Any]], failed: bool, where: str) -> None:
    for future, value in items:
        if future.done():
            continue
        if failed and stale(value):
            future.set_exception(StaleEpoch(f"{stale_message(value)}: nothing of this write "
                                            "was recorded; send it to the leading daemon"))
        elif failed:
            reason = _reason(value) if isinstance(value, SQLAlchemyError) else str(value)
            future.set_exception(StoreUnavailable(
                f"store {where!r} refused the write, so nothing of it was recorded: "
                f"{reason}{_ADVICE}"))
        else:
            future.set_result(value)


def _wake(work: list[_Queued], results: list[Any], error: BaseException | None,
          where: str) -> None:
    """Tell a batch's waiters how it went: one wake-up of each loop per batch, not one per
    record."""
    settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for index, (_, future, loop) in enumerate(work):
        if future is not None and loop is not None:
            outcome = error if error is not None else results[index]
            settled.setdefault(loop, []).append((future, outcome))
    for loop, items in settled.items():
        loop.call_soon_threadsafe(_settle, items, error is not None, where)
