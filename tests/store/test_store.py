"""The store on SQLite and on the PostgreSQL on 127.0.0.1 (a fresh database per test)."""

import asyncio
import os
import random
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labd.daemon.api.errors import status_of
from labd.errors import StoreError, StoreUnavailable
from labd.store import Store
from labd.store.models import PairChange, Reconfiguration
from labd.store.writer import ReconfigurationRecord, insert_records, set_intended
from tests.databases import postgres_database
from tests.labs import switch
from tests.store.refusals import refusing


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store.sqlite")
        return
    with postgres_database() as found:
        yield found


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
        # In the order they were handed over, across however many batches they took.
        assert ids == list(range(1, 501))
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


async def test_each_record_of_a_batch_gets_its_own_id_changes_and_time(url: str) -> None:
    """Records queued together go in as one insert with ids given in order: each id must be
    its own record's, with its own pair change, and its wall time the request's."""
    store = Store(url)
    await store.open()
    try:
        await store.record(row(0))  # ids of a batch continue from rows already there
        given = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        records = [row(i) for i in range(1, 300)]
        records[7].wall_time = given
        ids = await asyncio.gather(*(store.record(r) for r in records))
        before = datetime.now(UTC)

        def read(session: Session) -> list[tuple[int, str, int, int, datetime]]:
            return [(r.id, r.switch, r.changes[0].a, r.changes[0].b, r.wall_time)
                    for r in session.scalars(select(Reconfiguration).where(
                        Reconfiguration.id.in_(ids)))]

        stored = {rid: rest for rid, *rest in await store.read(read)}
        for rid, record in zip(ids, records, strict=True):
            switch, a, b, wall = stored[rid]
            assert (switch, [(a, b)]) == (record.switch, list(record.connected))
            wall = wall if wall.tzinfo else wall.replace(tzinfo=UTC)
            if record is records[7]:
                assert wall == given
            else:
                assert timedelta(0) <= before - wall < timedelta(seconds=30)
    finally:
        await store.close()


async def test_a_store_that_cannot_open_says_why(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        await Store(str(tmp_path / "no" / "such" / "dir" / "x.sqlite")).open()
    with pytest.raises(StoreError, match="not open"):
        await Store(str(tmp_path / "x.sqlite")).record(row(1))


async def _filled(path: Path, records: int) -> None:
    store = Store(str(path))
    await store.open()
    try:
        await asyncio.gather(*(store.record(row(i)) for i in range(records)))
    finally:
        await store.close()


def _damage(path: Path, seed: int) -> None:
    """8 KB of random bytes over the middle of a closed store (its WAL checkpointed)."""
    size = path.stat().st_size
    assert size > 64 * 1024 and not Path(f"{path}-wal").exists()
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(random.Random(seed).randbytes(8192))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_damaged_store_refuses_to_start(tmp_path: Path, seed: int) -> None:
    # 8 KB of random bytes in the middle of a store with records in it: the start is
    # refused, naming the file and what to do, rather than reads failing later and
    # changes being acknowledged into it.
    path = tmp_path / "store.sqlite"
    await _filled(path, 2000)
    _damage(path, seed)
    with pytest.raises(StoreError) as refused:
        await Store(str(path)).open()
    message = str(refused.value)
    assert str(path) in message and "damaged" in message
    assert "backup" in message and "--no-restore" in message


async def test_a_store_that_is_not_a_database_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(random.Random(4).randbytes(64 * 1024))
    with pytest.raises(StoreError, match="is damaged"):
        await Store(str(path)).open()


async def test_the_store_and_its_wal_are_private_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    old = os.umask(0o022)
    try:
        store = Store(str(path))
        await store.open()
        try:
            await store.record(row(1))
            for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
        finally:
            await store.close()
    finally:
        os.umask(old)


async def test_a_password_in_a_store_url_is_never_shown() -> None:
    store = Store("postgresql://labd:hunter2@127.0.0.1:1/none")
    with pytest.raises(StoreError) as refused:
        await store.open()
    assert "hunter2" not in str(refused.value) and "***" in str(refused.value)


@pytest.mark.parametrize("how", ["read-only", "full"])
async def test_a_refused_write_is_an_error_and_records_nothing(tmp_path: Path,
                                                               how: str) -> None:
    store = Store(str(tmp_path / "store.sqlite"))
    await store.open()
    try:
        await store.record(row(0))
        await store.run_write(lambda s: set_intended(s, "s1", {1: 17}))
        # Enough to need new pages, so that a full disk refuses it too.
        big = ReconfigurationRecord(**{**row(1).__dict__, "connected": [
            (i, i + 1) for i in range(2, 4000, 2)], "intended": {2: 3}})
        with refusing(store, how):
            with pytest.raises(StoreUnavailable, match="nothing of it was recorded"):
                await store.record(big)
            assert store.failing is not None
            if how == "read-only":  # (a full store still takes a write that needs no room)
                with pytest.raises(StoreUnavailable):
                    await store.check_writable()
        # The store takes writes again: nothing of the refused one is there.
        await store.check_writable()
        assert store.failing is None
        counts = await store.read(lambda s: (
            s.scalar(select(func.count()).select_from(Reconfiguration)),
            s.scalar(select(func.count()).select_from(PairChange))))
        assert counts == (1, 1)
        assert await store.intended() == {"s1": {1: 17}}
        assert await store.record(row(2)) == 2
    finally:
        await store.close()


def test_a_refused_store_answers_503() -> None:
    assert issubclass(StoreUnavailable, StoreError)
    assert status_of(StoreUnavailable("store refused")) == 503


async def test_labd_run_on_a_damaged_store_refuses_to_start(tmp_path: Path) -> None:
    lab = tmp_path / "lab.toml"
    lab.write_text('[lab]\nname = "damaged"\n' + switch(size="8x8", switch_ms=1))
    db = tmp_path / "store.sqlite"
    await _filled(db, 2000)
    _damage(db, 5)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "run", str(lab), "--db", str(db), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    said = " ".join((out.decode() + err.decode()).split())  # as read, not as wrapped
    assert proc.returncode not in (0, None), said
    assert "is damaged" in said and "backup" in said and "Traceback" not in said


async def test_a_refused_read_is_a_store_error_and_the_probe_clears(url: str) -> None:
    store = Store(url)
    await store.open()
    try:
        with pytest.raises(StoreUnavailable, match="cannot be read now"):
            await store.read(lambda s: s.execute(sqlalchemy.text("SELECT * FROM no_such")))
        # After a refusal, the empty write that tells whether the store is back.
        store.failing = "refused before"
        await store.check_writable()
        assert store.failing is None
        assert await store.record(row(1)) == 1
    finally:
        await store.close()


PAIR = st.tuples(st.integers(1, 6), st.integers(7, 12))
RECORD = st.tuples(st.sampled_from(["s1", "s2"]), st.booleans(), st.booleans(),
                   st.lists(PAIR, max_size=3, unique_by=lambda p: p[0]),
                   st.lists(PAIR, max_size=3, unique_by=lambda p: p[0]))


def _model(records: list[ReconfigurationRecord]) -> dict[str, dict[int, int]]:
    """The intended state records leave, applied one at a time as the engine means them."""
    state: dict[str, dict[int, int]] = {}
    for r in records:
        pairs = state.setdefault(r.switch, {})
        if r.intended is not None:
            pairs.clear()
            pairs.update(r.intended)
        elif r.update_intended:
            for a, _ in [*r.disconnected, *r.connected]:
                pairs.pop(a, None)
            pairs.update(r.connected)
    return {s: p for s, p in state.items() if p}


@settings(max_examples=60, deadline=None)
@given(st.lists(RECORD, max_size=24), st.lists(st.integers(1, 8), min_size=1, max_size=24))
def test_any_records_in_any_batches_leave_the_intended_state_they_mean(
        given_records: list[tuple[str, bool, bool, list[tuple[int, int]],
                                  list[tuple[int, int]]]], sizes: list[int]) -> None:
    """A batch goes in with a few statements a table (store.py, _insert_sqlite), not a
    statement per record; the intended state it leaves is the one applying its records one
    after another leaves, however the records are split into batches."""
    now = time.monotonic_ns()
    records = [ReconfigurationRecord(
        switch=name, cause="api", outcome="ok", error=None, connected=connected,
        disconnected=disconnected, requested_ns=now, dispatched_ns=now, activated_ns=now,
        acked_ns=now, light_ns=None, done_ns=now,
        intended=dict(connected) if whole else None, update_intended=update)
        for name, whole, update, connected, disconnected in given_records]
    with tempfile.TemporaryDirectory() as folder:
        async def run() -> tuple[dict[str, dict[int, int]], list[int]]:
            store = Store(str(Path(folder) / "store.sqlite"))
            await store.open()
            try:
                assert store.engine is not None
                ids: list[int] = []
                rest, turn = list(records), 0
                while rest:
                    batch, rest = rest[:sizes[turn % len(sizes)]], rest[sizes[turn % len(sizes)]:]
                    turn += 1
                    with store.engine.begin() as connection:
                        ids += insert_records(connection, batch)
                return await store.intended(), ids
            finally:
                await store.close()

        intended, ids = asyncio.run(run())
    assert intended == _model(records)
    assert ids == list(range(1, len(records) + 1))
