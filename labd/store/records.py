"""Reconfiguration records, the store's hot path: how a batch of them goes in on the
driver's own connection.

On SQLite a batch is a few multi-row ``INSERT`` statements on the sqlite3 cursor; on
PostgreSQL (:mod:`labd.store.postgresql`) a binary ``COPY`` for a large batch and one
pipelined round trip for a few, such as the durable record a recovery awaits; elsewhere
SQLAlchemy Core. Either way a batch's records take ids in the order they were queued, and
what they leave each switch's intended circuits as is applied in the same transaction.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from labd.store import postgresql
from labd.store.models import ConnectionEvent, IntendedPair, PairChange, Reconfiguration
from labd.store.postgresql import IntendedChange, ReconfigurationRow


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


def commits_alone(connection: Connection, records: list[ReconfigurationRecord],
                   fence: tuple[str, int] | None) -> bool:
    """Whether a batch of records alone commits itself on the driver's connection: on
    psycopg, and on sqlite3 outside a fence (checked only in a transaction of SQLAlchemy's)."""
    driver = connection.dialect.driver
    return bool(records) and (driver == "psycopg" or (driver == "pysqlite" and fence is None))


def commit_alone(connection: Connection, records: list[ReconfigurationRecord],
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
