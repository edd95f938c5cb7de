"""The writer's PostgreSQL path (labd/store/postgresql.py) against its SQLite path: the same
records in batches of every shape leave both databases alike, a failed batch leaves nothing,
and the writer keeps one named session."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import select, text

from labd.errors import StoreUnavailable
from labd.store import Store
from labd.store.models import Reconfiguration
from labd.store.postgresql import FEW, IntendedChange, commit_records
from labd.store.writer import ReconfigurationRecord, insert_records, set_intended
from tests.databases import postgres_database

#: Batch sizes that take each shape: one and a few pipelined, the most pipelined, the
#: fewest copied, and larger copies.
SIZES = (1, 2, FEW, FEW + 1, 40, 300)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as found:
        yield found


async def _opened(url: str) -> Store:
    store = Store(url)
    await store.open()
    return store


@pytest.fixture
async def both(tmp_path: Path, pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    sqlite, postgres = await _opened(str(tmp_path / "store.sqlite")), await _opened(pg_url)
    try:
        yield sqlite, postgres
    finally:
        await sqlite.close()
        await postgres.close()


def _records(rng: random.Random, count: int) -> list[ReconfigurationRecord]:
    """Reconfigurations as the engine makes them: connects and disconnects on three
    switches, whole replacements, failures that change no intended state, errors, explicit
    wall times and missing phases."""
    out = []
    for _ in range(count):
        now = time.monotonic_ns()
        ports = rng.sample(range(1, 33), rng.randint(0, 6))
        half = len(ports) // 2
        connected = [(a, a + 32) for a in ports[:half]]
        disconnected = [(a, a + 32) for a in ports[half:]]
        failed = rng.random() < 0.15
        replace = not failed and rng.random() < 0.1
        out.append(ReconfigurationRecord(
            switch=f"s{rng.randrange(3)}", cause=rng.choice(["api", "recovery", "measurement"]),
            outcome="failed" if failed else "ok",
            error="port 3 did not answer" if failed else None, connected=connected,
            disconnected=disconnected, requested_ns=now,
            dispatched_ns=None if failed else now + 1, activated_ns=now + 1,
            acked_ns=None if failed else now + 2, light_ns=now + 3 if rng.random() < 0.5
            else None, done_ns=now + 4,
            intended={a: a + 64 for a in rng.sample(range(1, 33), 5)} if replace else None,
            update_intended=not failed,
            wall_time=datetime(2026, 3, 4, 5, 6, 7, rng.randrange(10**6), tzinfo=UTC)
            if rng.random() < 0.2 else None))
    return out


def _tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    assert store.engine is not None
    with store.engine.connect() as connection:
        return {
            "reconfigurations": [tuple(r) for r in connection.execute(text(
                "SELECT id, switch, cause, outcome, error, batch_size, requested_ns, "
                "dispatched_ns, activated_ns, acked_ns, light_ns, done_ns "
                "FROM reconfigurations ORDER BY id"))],
            "pair_changes": [tuple(r) for r in connection.execute(text(
                "SELECT reconfiguration_id, action, a, b FROM pair_changes "
                "ORDER BY reconfiguration_id, action, a"))],
            "intended": [tuple(r) for r in connection.execute(text(
                "SELECT switch, a, b FROM intended_pairs ORDER BY switch, a"))],
        }


def _walls(store: Store) -> list[datetime]:
    assert store.engine is not None
    with store.engine.connect() as connection:
        # Through the model's column type: SQLite keeps the time as text, without its zone.
        return [w if w.tzinfo else w.replace(tzinfo=UTC) for w in connection.scalars(
            select(Reconfiguration.wall_time).order_by(Reconfiguration.id))]


def _insert(store: Store, records: list[ReconfigurationRecord]) -> list[int]:
    """One batch as the writer's transaction would take it."""
    assert store.engine is not None
    with store.engine.begin() as connection:
        return insert_records(connection, records)


async def _one_batch(store: Store, records: list[ReconfigurationRecord], *,
                     with_other_work: bool) -> list[int]:
    """Hand the writer exactly these records as one batch (with one other write among them
    where asked), by holding it on a write of its own until all of them are queued."""
    loop = asyncio.get_running_loop()
    gate, holding = threading.Event(), loop.create_future()

    def hold(session: Any) -> None:
        loop.call_soon_threadsafe(holding.set_result, None)
        gate.wait()

    held = asyncio.ensure_future(store.run_write(hold))
    await holding  # the writer is inside its batch: whatever is queued now waits
    tasks = [asyncio.ensure_future(store.record(r)) for r in records]
    if with_other_work:
        tasks.insert(len(tasks) // 2, asyncio.ensure_future(store.run_write(
            lambda session: -1)))
    # Every task above takes its first step (queueing its write) before this callback runs.
    queued = loop.create_future()
    loop.call_soon(queued.set_result, None)
    await queued
    gate.set()
    await held
    return [i for i in await asyncio.gather(*tasks) if i != -1]


async def test_every_batch_shape_leaves_postgresql_as_it_leaves_sqlite(
        both: tuple[Store, Store]) -> None:
    sqlite, postgres = both
    rng = random.Random(18)
    await asyncio.gather(*(s.run_write(lambda session: set_intended(
        session, "s1", {1: 33, 2: 34, 30: 62})) for s in both))
    given = 0
    # Alone (on PostgreSQL: committed by the driver's connection itself, a pipeline for a
    # few, a COPY for more) and among other work (in the writer's transaction).
    for size in SIZES:
        for mixed in (False, True):
            batch = _records(rng, size)
            expected = list(range(given + 1, given + size + 1))
            assert await _one_batch(sqlite, batch, with_other_work=mixed) == expected
            assert await _one_batch(postgres, batch, with_other_work=mixed) == expected
            given += size
    mine, theirs = _tables(sqlite), _tables(postgres)
    assert len(mine["reconfigurations"]) == given
    assert mine["pair_changes"] and mine["intended"]  # the records did change something
    for table in ("reconfigurations", "pair_changes", "intended"):
        assert theirs[table] == mine[table], table
    before = datetime.now(UTC)
    for wall, other in zip(_walls(sqlite), _walls(postgres), strict=True):
        # SQLite keeps microseconds as text; both are the request's time, or the one given.
        assert abs(wall - other) < timedelta(milliseconds=1)
        assert (wall.year, wall.month) == (2026, 3) or before - wall < timedelta(minutes=5)
    # And the reads the daemon restores from agree.
    assert await postgres.intended() == await sqlite.intended()


@pytest.mark.parametrize("size", [1, FEW, FEW + 1, 50])
async def test_a_failed_batch_leaves_nothing_on_either_engine(both: tuple[Store, Store],
                                                              size: int) -> None:
    """The last record of the batch is refused by the database (no switch): nothing of
    the batch stays, not its records, their pair changes nor what they did to the intended
    state; the next batch goes in and takes the next ids."""
    for store in both:
        await store.run_write(lambda session: set_intended(session, "s1", {1: 33}))
        batch = _records(random.Random(size), size)
        batch[0].connected, batch[0].update_intended = [(2, 34)], True
        batch[-1].switch = None  # type: ignore[assignment]
        with pytest.raises((sqlite3.IntegrityError, psycopg.errors.IntegrityError)):
            _insert(store, batch)
        tables = _tables(store)
        assert tables["reconfigurations"] == [] and tables["pair_changes"] == []
        assert tables["intended"] == [("s1", 1, 33)]
        ids = _insert(store, _records(random.Random(1), 2))
        assert ids[1] == ids[0] + 1
        assert [r[0] for r in _tables(store)["reconfigurations"]] == ids


@pytest.mark.parametrize("size", [3, FEW + 3])
async def test_records_that_commit_themselves_are_one_transaction(pg_url: str,
                                                                  size: int) -> None:
    """Records alone commit on the driver's connection (a few by the pipeline's closing
    sync, more in a transaction of their own): a row the server refuses, last, takes those
    before it and their intended state back with it, and the session goes on."""
    store = await _opened(pg_url)
    try:
        records = _records(random.Random(3), size)
        records[-1].switch = "x" * 65  # longer than the column: the server refuses it
        assert store.engine is not None
        raw = store.engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert isinstance(driver, psycopg.Connection)
            rows = [(r.switch, r.cause, r.outcome, r.error, 1, r.requested_ns, None, None,
                     None, None, r.done_ns, datetime.now(UTC)) for r in records]
            changes = [[("connect", 1, 33)] for _ in records]
            intended = [IntendedChange("s1", ports={1: 33})]
            with pytest.raises(psycopg.errors.StringDataRightTruncation):
                commit_records(driver, {}, rows, changes, intended)
            assert not driver.autocommit  # handed back as SQLAlchemy expects it
            assert _tables(store) == {"reconfigurations": [], "pair_changes": [],
                                      "intended": []}
            # The same session goes on: the good ones commit, and stay (the failed
            # attempt's ids are spent: a sequence is not rolled back).
            ids = commit_records(driver, {}, rows[:-1], changes[:-1], intended)
            assert ids[0] >= size and ids == list(range(ids[0], ids[0] + size - 1))
        finally:
            raw.close()
        tables = _tables(store)
        assert [r[0] for r in tables["reconfigurations"]] == ids
        assert tables["intended"] == [("s1", 1, 33)]
    finally:
        await store.close()


async def test_the_writer_keeps_one_named_session_and_a_failure_drops_it(
        pg_url: str) -> None:
    store = await _opened(pg_url)
    try:
        def session_of(session: Any) -> tuple[int, str]:
            found = session.execute(sqlalchemy.text(
                "SELECT pg_backend_pid(), current_setting('application_name')")).one()
            return int(found[0]), str(found[1])

        first = await store.run_write(session_of)
        assert first[1] == "labd"
        await asyncio.gather(*(store.record(r) for r in _records(random.Random(5), 30)))
        await store.record(_records(random.Random(6), 1)[0])
        assert await store.run_write(session_of) == first
        bad = _records(random.Random(7), 1)[0]
        bad.switch = None  # type: ignore[assignment]
        with pytest.raises(StoreUnavailable, match="nothing of it was recorded"):
            await store.record(bad)
        again = await store.run_write(session_of)
        assert again[1] == "labd" and again[0] != first[0]
    finally:
        await store.close()


async def test_a_setting_in_the_url_wins_over_the_stores_default(pg_url: str) -> None:
    store = await _opened(pg_url + "?application_name=bench")
    try:
        name = await store.run_write(lambda session: session.execute(sqlalchemy.text(
            "SELECT current_setting('application_name')")).scalar())
        assert name == "bench"
    finally:
        await store.close()
