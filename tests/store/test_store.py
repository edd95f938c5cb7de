"""The store on SQLite and on the PostgreSQL on 127.0.0.1 (a fresh database per test)."""

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import func, select

from labd.errors import StoreError
from labd.store import Store
from labd.store.models import PairChange, Reconfiguration
from labd.store.store import ReconfigurationRecord, set_intended

PG = os.environ.get("LABD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store.sqlite")
        return
    admin = sqlalchemy.create_engine(PG, isolation_level="AUTOCOMMIT",
                                     connect_args={"connect_timeout": 5})
    name = f"labd_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"create database {name}"))
    except sqlalchemy.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL is needed at {PG} (set LABD_TEST_POSTGRES): {exc}")
    try:
        yield PG.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"drop database {name} with (force)"))
        admin.dispose()


def row(i: int) -> ReconfigurationRecord:
    now = time.monotonic_ns()
    return ReconfigurationRecord(switch=f"s{i % 3}", cause="api", outcome="ok", error=None,
                                 connected=[(i, i + 100)], disconnected=[], requested_ns=now,
                                 dispatched_ns=now + 1, activated_ns=now + 1, acked_ns=now + 2,
                                 light_ns=None,
                                 done_ns=now + 3)


async def test_concurrent_writes_commit_and_read_back(url: str) -> None:
    store = Store(url)
    await store.open()
    try:
        ids = await asyncio.gather(*(store.record(row(i)) for i in range(500)))
        assert sorted(ids) == list(range(1, 501))
        await store.run_write(lambda s: set_intended(s, "s1", {1: 17, 2: 18}))
        await store.run_write(lambda s: set_intended(s, "s1", {3: 19}))
        counts = await store.read(lambda s: (
            s.scalar(select(func.count()).select_from(Reconfiguration)),
            s.scalar(select(func.count()).select_from(PairChange))))
        assert counts == (500, 500)
        assert await store.intended() == {"s1": {3: 19}}
    finally:
        await store.close()
    # Reopening runs the migrations again: nothing to do, nothing lost.
    again = Store(url)
    await again.open()
    try:
        assert await again.intended() == {"s1": {3: 19}}
    finally:
        await again.close()


async def test_a_store_that_cannot_open_says_why(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        await Store(str(tmp_path / "no" / "such" / "dir" / "x.sqlite")).open()
    with pytest.raises(StoreError, match="not open"):
        await Store(str(tmp_path / "x.sqlite")).record(row(1))
