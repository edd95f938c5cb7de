"""One writer, many readers.

Every write goes through one writer thread that takes whatever has queued up and commits it
as one transaction, so a burst of records costs one commit, and the event loop never waits
on the disk: ``await store.write(...)`` resolves when the record is committed (durable).
The writer commits a few records on the CPU the loop queued them from (labd.store.affinity).
Readers run on their own pooled connections in worker threads. SQLite runs in WAL mode with
a busy timeout, so readers and the writer never see "database is locked".

Reconfiguration records, the hot path, go in on the driver's own connection: on SQLite one
``executemany`` a batch; on PostgreSQL (:mod:`labd.store.postgresql`) a binary ``COPY`` for
a large batch and one pipelined round trip for a few, such as the durable record a
recovery awaits. Either way a batch's records take ids in the order they were queued.

The store checks itself before anything uses it: SQLite's ``PRAGMA quick_check`` (PostgreSQL:
the server answers and the migration table reads back), so a damaged file refuses the start
with a message naming it, rather than answering reads with errors and acknowledging changes
into it. A write or read that fails later is a :class:`StoreUnavailable` for whoever asked
(the API's 503); the writer's transaction is rolled back, so nothing is half-recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, delete, event, insert, make_url, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from labd.errors import StaleEpoch, StoreError, StoreUnavailable
from labd.files import create_private
from labd.repeats import Repeats
from labd.store import postgresql
from labd.store.affinity import Follower, current_cpu
from labd.store.models import ConnectionEvent, IntendedPair, PairChange, Reconfiguration
from labd.store.postgresql import IntendedChange, ReconfigurationRow

log = logging.getLogger(__name__)
T = TypeVar("T")
BATCH = 5000
#: SQLite result codes that mean the file itself is damaged (not merely out of reach).
DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
#: The most problems of a failed integrity check quoted in the error.
QUOTED_PROBLEMS = 3


@dataclass
class ReconfigurationRecord:
    """One reconfiguration, as the engine hands it to the store, with what it did to the
    switch's intended circuits (in the same transaction): ``intended`` replaces them all;
    otherwise the ``connected`` pairs are added and the ``disconnected`` ones removed when
    ``update_intended`` is set (a failed request changes nothing)."""

    switch: str
    cause: str
    outcome: str
    error: str | None
    connected: Sequence[tuple[int, int]]
    disconnected: Sequence[tuple[int, int]]
    requested_ns: int
    dispatched_ns: int | None
    activated_ns: int | None
    acked_ns: int | None
    light_ns: int | None
    done_ns: int
    intended: dict[int, int] | None = None
    update_intended: bool = False
    wall_time: datetime | None = None
    """Wall-clock time of the request; worked out from ``requested_ns`` by the writer when
    left out (off the event loop, one clock reading a batch)."""


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
    def __init__(self, url: str | Path) -> None:
        self.url = normalise_url(url)
        self.path = sqlite_path(self.url)
        self.engine: Engine | None = None
        self.failing: str | None = None
        """Why the last write failed; None while writes succeed."""
        self._sessions: sessionmaker[Session] | None = None
        # SimpleQueue: the C queue, a fraction of queue.Queue's locking on every record.
        self._queue: queue.SimpleQueue[tuple[Any, asyncio.Future[Any] | None,
                                             asyncio.AbstractEventLoop | None]] = \
            queue.SimpleQueue()
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
            results: list[Any] = []
            error: BaseException | None = None
            started = time.perf_counter()
            fence = self.fence
            try:
                if connection is None:
                    connection = self.engine.connect()
                records = [item for item, _, _ in work
                           if isinstance(item, ReconfigurationRecord)]
                if len(records) == len(work) and _commits_alone(connection, records, fence):
                    results = _commit_alone(connection, records, fence)
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
                # One line, not a traceback: every waiter hears of it as a refusal. A
                # fenced write is the fence doing its work (a leader that lost its lease),
                # not the store failing; a full disk refuses every write, told once a while.
                self._tell("stale write" if fenced else "write",
                           logging.WARNING if fenced else logging.ERROR,
                           f"store {self.where} refused a write of {len(work)} record(s): "
                           f"{reason}")
                self.failing = reason
                error = exc
                _discard(connection)
                connection = None
            # One wake-up of the loop per batch, not one per record.
            settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
            for index, (_, future, loop) in enumerate(work):
                if future is not None and loop is not None:
                    outcome = error if error is not None else results[index]
                    settled.setdefault(loop, []).append((future, outcome))
            for loop, items in settled.items():
                # The store's name only for a refusal's message: it is a URL parsed anew.
                loop.call_soon_threadsafe(_settle, items, error is not None,
                                          self.where if error is not None else "")
        if connection is not None:
            connection.close()

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


def _commits_alone(connection: Connection, records: list[ReconfigurationRecord],
                   fence: tuple[str, int] | None) -> bool:
    """Whether a batch of records alone commits itself on the driver's connection: on
    psycopg, and on sqlite3 outside a fence (checked only in a transaction of SQLAlchemy's)."""
    driver = connection.dialect.driver
    return bool(records) and (driver == "psycopg" or (driver == "pysqlite" and fence is None))


def _commit_alone(connection: Connection, records: list[ReconfigurationRecord],
                  fence: tuple[str, int] | None = None) -> list[int]:
    """Records, and nothing else, in less of the writer's time than a transaction of
    SQLAlchemy's: on PostgreSQL in fewer round trips
    (:func:`labd.store.postgresql.commit_records`); on SQLite on the sqlite3 connection
    itself, which begins the transaction at the first insert, as it does under SQLAlchemy
    (whose begin and commit around it are Python, holding the interpreter's lock the event
    loop needs)."""
    if connection.dialect.name == "sqlite":
        dbapi = connection.connection.driver_connection
        assert dbapi is not None
        try:
            ids = _insert_sqlite(connection, records)
            dbapi.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # the writer drops the connection anyway
                dbapi.rollback()
            raise
        return ids
    return postgresql.commit_records(
        connection.connection.driver_connection,  # type: ignore[arg-type]
        connection.info, *_postgresql_args(records), fence=fence)


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


_SQLITE_RECONFIGURATION = (
    "INSERT INTO reconfigurations (id, switch, cause, outcome, error, batch_size, "
    "requested_ns, dispatched_ns, activated_ns, acked_ns, light_ns, done_ns, wall_time) "
    "VALUES")
_RECONFIGURATION_WIDTH = 13


def _walls(records: Sequence[ReconfigurationRecord]) -> list[datetime]:
    """Each record's wall-clock time: its own, or its request's monotonic stamp on the wall
    clock, by one reading of both clocks for the whole batch."""
    offset_ns = time.time_ns() - time.monotonic_ns()
    return [r.wall_time if r.wall_time is not None
            else datetime.fromtimestamp((r.requested_ns + offset_ns) / 1e9, UTC)
            for r in records]


def _stored_walls(records: Sequence[ReconfigurationRecord]) -> list[str]:
    """:func:`_walls` as SQLAlchemy's DateTime stores them on SQLite (naive UTC,
    microseconds), formatted from the nanoseconds: a batch's records share their seconds,
    and a datetime per record cost more than its insert."""
    offset_ns = time.time_ns() - time.monotonic_ns()
    seconds: dict[int, str] = {}
    out = []
    for r in records:
        if r.wall_time is not None:
            out.append(r.wall_time.astimezone(UTC).isoformat(" ", "microseconds")[:26])
            continue
        second, ns = divmod(r.requested_ns + offset_ns, 1_000_000_000)
        prefix = seconds.get(second)
        if prefix is None:
            prefix = seconds[second] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))
        out.append(f"{prefix}.{ns // 1000:06d}")
    return out


#: Bound parameters one statement may carry on every SQLite (999 before 3.32).
_SQLITE_PARAMETERS = 999


@functools.lru_cache(maxsize=256)
def _statement(head: str, count: int, width: int) -> str:
    """``head (?,?),(?,?)``: ``count`` rows of ``width`` values (one string object per
    statement, so sqlite3's cache of prepared statements finds it at once)."""
    row = "(" + ",".join("?" * width) + ")"
    return f"{head} {','.join([row] * count)}"


def _execute_rows(cursor: Any, head: str, width: int, rows: Sequence[Sequence[Any]],
                  ) -> int:
    """``head`` (``INSERT INTO t (...) VALUES``) then ``rows`` as ``(?,?),(?,?)``, in as few
    statements as SQLite's parameter limit allows, not a statement per row: the sqlite3
    module lets go of the GIL for each row of an executemany and must take it back after,
    and with the event loop's thread busy each take waits its turn. Returns the last
    statement's last row id."""
    if len(rows) == 1:  # the common case: the row as it is, not flattened
        cursor.execute(_statement(head, 1, width), rows[0])
        return int(cursor.lastrowid or 0)
    per = max(1, _SQLITE_PARAMETERS // width)
    for start in range(0, len(rows), per):
        chunk = rows[start:start + per]
        cursor.execute(_statement(head, len(chunk), width),
                       [value for row in chunk for value in row])
    return int(cursor.lastrowid or 0)


def _delete_in(cursor: Any, head: str, fixed: list[Any], values: Sequence[Any]) -> None:
    """``head (?,?,...)`` over ``values``, each statement with the ``fixed`` parameters
    first, as few statements as the parameter limit allows."""
    per = _SQLITE_PARAMETERS - len(fixed)
    for start in range(0, len(values), per):
        chunk = values[start:start + per]
        cursor.execute(f"{head} ({','.join('?' * len(chunk))})", [*fixed, *chunk])


def _insert_sqlite(connection: Connection, records: list[ReconfigurationRecord]) -> list[int]:
    """The same as the Core path, on the sqlite3 cursor itself: a durable record is on the
    path of every acknowledged request, and SQLAlchemy's per-statement machinery costs ten
    times the insert. Same transaction, same columns, same storage format (SQLAlchemy's
    DateTime on SQLite: naive UTC, microseconds); a few statements a batch, whatever its
    size (:func:`_execute_rows`)."""
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    rows = [(None, r.switch, r.cause, r.outcome, r.error,
             len(r.connected) + len(r.disconnected), r.requested_ns, r.dispatched_ns,
             r.activated_ns, r.acked_ns, r.light_ns, r.done_ns, wall)
            for r, wall in zip(records, _stored_walls(records), strict=True)]
    # The rows take consecutive ids, the last row the last statement's lastrowid: nothing
    # else can take one in between (the insert holds the database's write lock until this
    # transaction commits).
    last = _execute_rows(cursor, _SQLITE_RECONFIGURATION, _RECONFIGURATION_WIDTH, rows)
    ids = list(range(last - len(rows) + 1, last + 1))
    changes = [(rid, action, a, b) for rid, r in zip(ids, records, strict=True)
               for action, pairs in (("connect", r.connected), ("disconnect", r.disconnected))
               for a, b in pairs]
    if changes:
        _execute_rows(cursor, "INSERT INTO pair_changes (reconfiguration_id, action, a, b) "
                              "VALUES", 4, changes)
    # What the batch leaves each switch's intended circuits as, as on PostgreSQL: the same
    # end as applying its records one after another (intended_changes). Plain IN lists:
    # SQLite reads ``IN (?)`` as ``= ?``, where ``IN (VALUES ...)`` builds a table first.
    replaced: list[str] = []
    added: list[tuple[str, int, int]] = []
    for change in intended_changes(records):
        if change.replace:
            replaced.append(change.switch)
        elif change.ports:
            _delete_in(cursor, "DELETE FROM intended_pairs WHERE switch = ? AND a IN",
                       [change.switch], list(change.ports))
        added.extend((change.switch, a, b) for a, b in change.ports.items() if b is not None)
    if replaced:
        _delete_in(cursor, "DELETE FROM intended_pairs WHERE switch IN", [], replaced)
    if added:
        _execute_rows(cursor, "INSERT INTO intended_pairs (switch, a, b) VALUES", 3, added)
    cursor.close()
    return ids


def insert_records(connection: Connection, records: list[ReconfigurationRecord]) -> list[int]:
    """Insert reconfigurations and their pair changes and apply their intended states, in
    order, inside the transaction open on ``connection`` (the writer's batch); returns the
    records' ids, in the order given, each larger than any before it."""
    if not records:
        return []
    if connection.dialect.name == "sqlite":
        return _insert_sqlite(connection, records)
    if connection.dialect.driver == "psycopg":
        return postgresql.insert_reconfigurations(
            connection.connection.driver_connection,  # type: ignore[arg-type]
            connection.info, *_postgresql_args(records))
    return _insert_core(connection, records)


def _postgresql_args(records: Sequence[ReconfigurationRecord]) -> tuple[
        list[ReconfigurationRow], list[list[tuple[str, int, int]]], list[IntendedChange]]:
    """The records as :mod:`labd.store.postgresql` takes them: their rows, their pair
    changes, and what they leave the intended state as."""
    # A naive wall time is taken as UTC, as everywhere in labd: the binary COPY of a
    # timestamptz refuses one, and a statement would read it in the session's time zone.
    rows: list[ReconfigurationRow] = [
        (r.switch, r.cause, r.outcome, r.error, len(r.connected) + len(r.disconnected),
         r.requested_ns, r.dispatched_ns, r.activated_ns, r.acked_ns, r.light_ns, r.done_ns,
         wall if wall.tzinfo is not None else wall.replace(tzinfo=UTC))
        for r, wall in zip(records, _walls(records), strict=True)]
    changes = [[("connect", a, b) for a, b in r.connected]
               + [("disconnect", a, b) for a, b in r.disconnected] for r in records]
    return rows, changes, intended_changes(records)


def intended_changes(records: Sequence[ReconfigurationRecord]) -> list[IntendedChange]:
    """What a batch's records leave each switch's intended circuits as: the same end as
    applying them one after another (a replacement drops the switch's circuits, then sets
    its own; an update drops the ports it disconnected or connected, then sets the
    connected ones), so that a batch costs a statement or two a switch, not a record."""
    out: dict[str, IntendedChange] = {}
    for r in records:
        if r.intended is not None:
            out[r.switch] = IntendedChange(r.switch, replace=True, ports=dict(r.intended))
        elif r.update_intended:
            ports = out.setdefault(r.switch, IntendedChange(r.switch)).ports
            for a, _ in r.disconnected:
                ports[a] = None
            for a, b in r.connected:  # (after: a port both broken and made is made)
                ports[a] = b
    return list(out.values())


def _insert_core(session: Connection, records: list[ReconfigurationRecord]) -> list[int]:
    """:func:`insert_records` through SQLAlchemy Core, for a driver other than psycopg on a
    server other than SQLite."""
    rows = [{"switch": r.switch, "cause": r.cause, "outcome": r.outcome, "error": r.error,
             "batch_size": len(r.connected) + len(r.disconnected),
             "requested_ns": r.requested_ns, "dispatched_ns": r.dispatched_ns,
             "activated_ns": r.activated_ns, "acked_ns": r.acked_ns, "light_ns": r.light_ns,
             "done_ns": r.done_ns,
             "wall_time": wall} for r, wall in zip(records, _walls(records), strict=True)]
    if len(rows) == 1:
        ids = [int(session.execute(insert(Reconfiguration).returning(Reconfiguration.id),
                                   rows[0]).scalar_one())]
    else:
        result = session.execute(insert(Reconfiguration).returning(
            Reconfiguration.id, sort_by_parameter_order=True), rows)
        ids = [int(i) for i in result.scalars()]
    changes = [{"reconfiguration_id": rid, "action": action, "a": a, "b": b}
               for rid, r in zip(ids, records, strict=True)
               for action, pairs in (("connect", r.connected), ("disconnect", r.disconnected))
               for a, b in pairs]
    if changes:
        session.execute(insert(PairChange), changes)
    for r in records:
        if r.intended is not None:
            set_intended(session, r.switch, r.intended)
        elif r.update_intended:
            gone = [a for a, _ in r.disconnected] + [a for a, _ in r.connected]
            if gone:
                session.execute(delete(IntendedPair).where(
                    IntendedPair.switch == r.switch, IntendedPair.a.in_(gone)))
            if r.connected:
                session.execute(insert(IntendedPair), [
                    {"switch": r.switch, "a": a, "b": b} for a, b in r.connected])
    return ids


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


def _since(monotonic_ns: int) -> timedelta:
    """How long ago a monotonic timestamp was, to date a record on the wall clock."""
    return timedelta(microseconds=(time.monotonic_ns() - monotonic_ns) / 1000)


def set_intended(session: Session | Connection, switch: str, pairs: dict[int, int]) -> None:
    """Replace a switch's intended circuits (inside the writer's transaction)."""
    session.execute(delete(IntendedPair).where(IntendedPair.switch == switch))
    if pairs:
        session.execute(insert(IntendedPair), [{"switch": switch, "a": a, "b": b}
                                               for a, b in pairs.items()])


def connection_row(instrument: str, kind: str, state: str | None, detail: str,
                   at_ns: int) -> ConnectionEvent:
    return ConnectionEvent(instrument=instrument, kind=kind, state=state, detail=detail,
                           at_ns=at_ns, wall_time=datetime.now(UTC) - _since(at_ns))

