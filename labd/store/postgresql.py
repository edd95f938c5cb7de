"""The writer's reconfiguration records on PostgreSQL, on the psycopg connection itself.

SQLAlchemy's bulk insert renders a batch as a statement whose text differs with its size,
which psycopg parses afresh each time; here every statement's text is fixed (prepared after
a few uses). A few records (at most :data:`FEW`) go one statement each in one pipeline; more
take their ids in one statement and go in as binary ``COPY``s. A batch of records alone
commits itself (:func:`commit_records`); one with other work goes in inside the writer's
transaction (:func:`insert_reconfigurations`). Ids follow the order the records were queued
in, and the intended state is applied per switch, not per record (docs/benchmarks.md,
"PostgreSQL beside SQLite").
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from labd.errors import StoreError

if TYPE_CHECKING:  # psycopg is SQLAlchemy's driver here: loaded with the engine, not with this
    from psycopg import Connection, Cursor

__all__ = ["FEW", "IntendedChange", "ReconfigurationRow", "commit_records",
           "insert_reconfigurations"]

#: The most records in a batch that go in one statement each. A statement costs the server
#: far more than a row of a COPY, a COPY costs more round trips (the ids', two a table's):
#: measured side by side, the two cross between 4 and 8 records.
FEW = 4

ReconfigurationRow = tuple[str, str, str, str | None, int, int, int | None, int | None,
                           int | None, int | None, int, datetime]
"""A record's columns in the order of :data:`COLUMNS`."""

COLUMNS = ("switch", "cause", "outcome", "error", "batch_size", "requested_ns",
           "dispatched_ns", "activated_ns", "acked_ns", "light_ns", "done_ns", "wall_time")
_CHANGE_COLUMNS = ("reconfiguration_id", "action", "a", "b")

_ONE = (f"WITH r AS (INSERT INTO reconfigurations ({', '.join(COLUMNS)}) "
        f"VALUES ({', '.join(['%s'] * len(COLUMNS))}) RETURNING id), "
        "c AS (INSERT INTO pair_changes (reconfiguration_id, action, a, b) "
        "SELECT r.id, u.action, u.a, u.b FROM r, "
        "unnest(%s::varchar[], %s::int4[], %s::int4[]) AS u(action, a, b)) "
        "SELECT id FROM r")
#: A leader's write checked against the lease first (migration 0007's labd_fence).
_FENCE = "SELECT labd_fence(%s, %s)"
_IDS = "SELECT nextval(%s::regclass) FROM generate_series(1, %s)"
_COPY = (f"COPY reconfigurations (id, {', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)")
_COPY_CHANGES = (f"COPY pair_changes ({', '.join(_CHANGE_COLUMNS)}) "
                 "FROM STDIN (FORMAT BINARY)")
_TYPES = ("SELECT attname, atttypid::int FROM pg_attribute "
          "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped")
_SEQUENCE = "SELECT pg_get_serial_sequence('reconfigurations', 'id')"
_DROP_SWITCH = "DELETE FROM intended_pairs WHERE switch = %s"
_DROP_PORTS = "DELETE FROM intended_pairs WHERE switch = %s AND a = ANY(%s::int4[])"
_ADD = ("INSERT INTO intended_pairs (switch, a, b) "
        "SELECT %s, u.a, u.b FROM unnest(%s::int4[], %s::int4[]) AS u(a, b)")
#: Where the schema's facts are kept on the connection (its ``info``, one per connection).
_INFO_KEY = "labd.store.postgresql"


@dataclass
class IntendedChange:
    """What one batch does to one switch's intended circuits: replaces them all
    (``replace``), or only sets the ports named; a port set to None is dropped."""

    switch: str
    replace: bool = False
    ports: dict[int, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Schema:
    """Read once a connection: the binary COPY needs every column's exact type (read from
    the catalogue, so a migration that changes one cannot leave the COPY behind it)."""

    sequence: str
    types: tuple[int, ...]
    change_types: tuple[int, ...]
    quoted_sequence: str
    """The sequence as an SQL literal, for a statement sent without parameters."""

    def begin_and_ids(self, count: int) -> str:
        # Two statements in one: only a query without parameters may hold several.
        return (f"BEGIN; SELECT nextval({self.quoted_sequence}::regclass) "
                f"FROM generate_series(1, {int(count)})")


def _schema(connection: Connection[Any], info: dict[Any, Any]) -> _Schema:
    schema = info.get(_INFO_KEY)
    if not isinstance(schema, _Schema):
        schema = info[_INFO_KEY] = _read_schema(connection)
    return schema


def insert_reconfigurations(connection: Connection[Any], info: dict[Any, Any],
                            rows: Sequence[ReconfigurationRow],
                            changes: Sequence[Sequence[tuple[str, int, int]]],
                            intended: Sequence[IntendedChange]) -> list[int]:
    """Insert records (``rows``, each with its pair changes ``(action, a, b)``) and apply
    the batch's intended state, inside the transaction open on ``connection``; returns the
    records' ids, in order. ``info`` keeps what was read of the schema (the connection's
    own dictionary: SQLAlchemy's ``Connection.info``)."""
    if len(rows) <= FEW:
        with connection.pipeline():
            cursors = _send_few(connection, rows, changes)
            _apply_intended(connection, intended)
        return [_id(cursor.fetchone()) for cursor in cursors]
    schema = _schema(connection, info)
    ids = sorted(_id(row) for row in connection.execute(_IDS, (schema.sequence, len(rows))))
    _copy(connection, schema, ids, rows, changes)
    if intended:
        with connection.pipeline():
            _apply_intended(connection, intended)
    return ids


def commit_records(connection: Connection[Any], info: dict[Any, Any],
                   rows: Sequence[ReconfigurationRow],
                   changes: Sequence[Sequence[tuple[str, int, int]]],
                   intended: Sequence[IntendedChange], *,
                   fence: tuple[str, int] | None = None) -> list[int]:
    """:func:`insert_reconfigurations` for a batch of records and nothing else, committed
    here, with fewer round trips than a transaction of the driver's (whose BEGIN and COMMIT
    are a round trip each). The session is put in autocommit for it, then back:

    - a few records go in one pipeline, which the server runs up to its closing sync as
      one implicit transaction, committed at the sync or, if any statement fails, rolled
      back whole: one round trip in all;
    - more begin their own transaction in the statement that draws their ids, and commit it
      in the pipeline that applies their intended state.

    ``fence``: (lab, epoch) checked first, in the same transaction (``labd_fence``,
    migration 0007): one statement more in the pipeline, no round trip more.
    """
    connection.autocommit = True
    try:
        if len(rows) <= FEW:
            with connection.pipeline():
                if fence is not None:
                    connection.execute(_FENCE, fence)
                cursors = _send_few(connection, rows, changes)
                _apply_intended(connection, intended)
            return [_id(cursor.fetchone()) for cursor in cursors]
        schema = _schema(connection, info)  # (read outside any transaction: autocommit)
        try:
            cursor = connection.execute(schema.begin_and_ids(len(rows)))
            cursor.nextset()  # past the BEGIN's result to the ids'
            ids = sorted(_id(row) for row in cursor.fetchall())
            if fence is not None:
                connection.execute(_FENCE, fence)
            _copy(connection, schema, ids, rows, changes)
            with connection.pipeline():
                _apply_intended(connection, intended)
                connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                connection.execute("ROLLBACK")
            raise
        return ids
    finally:
        # After a failure the writer drops the connection: whether this takes is moot then.
        with contextlib.suppress(Exception):
            connection.autocommit = False


def _copy(connection: Connection[Any], schema: _Schema, ids: Sequence[int],
          rows: Sequence[ReconfigurationRow],
          changes: Sequence[Sequence[tuple[str, int, int]]]) -> None:
    with connection.cursor() as cursor:
        with cursor.copy(_COPY) as copy:
            copy.set_types(schema.types)
            for rid, row in zip(ids, rows, strict=True):
                copy.write_row((rid, *row))
        if any(changes):
            with cursor.copy(_COPY_CHANGES) as copy:
                copy.set_types(schema.change_types)
                for rid, pairs in zip(ids, changes, strict=True):
                    for action, a, b in pairs:
                        copy.write_row((rid, action, a, b))


def _send_few(connection: Connection[Any], rows: Sequence[ReconfigurationRow],
              changes: Sequence[Sequence[tuple[str, int, int]]]) -> list[Cursor[Any]]:
    # One after another on one session: the sequence gives them ids in this order.
    return [connection.execute(_ONE, (*row, [c[0] for c in pairs], [c[1] for c in pairs],
                                      [c[2] for c in pairs]))
            for row, pairs in zip(rows, changes, strict=True)]


def _id(row: tuple[Any, ...] | None) -> int:
    assert row is not None  # every statement here returns its row or fails
    return int(row[0])


def _read_schema(connection: Connection[Any]) -> _Schema:
    sequence = connection.execute(_SEQUENCE).fetchone()
    if sequence is None or sequence[0] is None:
        # The migrations make the id a serial column; a table made otherwise has no sequence.
        raise StoreError("reconfigurations.id draws from no sequence: the table was not "
                         "made by labd's migrations; open the store on a fresh database")

    def types(table: str, columns: Sequence[str]) -> tuple[int, ...]:
        found = {str(name): int(oid) for name, oid in connection.execute(_TYPES, (table,))}
        return tuple(found[column] for column in columns)

    quoted = connection.execute("SELECT quote_literal(%s::text)", (sequence[0],)).fetchone()
    assert quoted is not None
    return _Schema(sequence=str(sequence[0]), types=types("reconfigurations", ("id", *COLUMNS)),
                   change_types=types("pair_changes", _CHANGE_COLUMNS),
                   quoted_sequence=str(quoted[0]))


def _apply_intended(connection: Connection[Any], intended: Sequence[IntendedChange]) -> None:
    for change in intended:
        if change.replace:
            connection.execute(_DROP_SWITCH, (change.switch,))
        elif change.ports:
            connection.execute(_DROP_PORTS, (change.switch, list(change.ports)))
        kept = [(a, b) for a, b in change.ports.items() if b is not None]
        if kept:
            connection.execute(_ADD, (change.switch, [a for a, _ in kept],
                                      [b for _, b in kept]))
