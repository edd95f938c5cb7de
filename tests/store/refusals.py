"""Make a real SQLite store refuse writes the way a disk does: read-only, or full."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from labd.store import Store

#: SQLite's own ceiling for max_page_count: "no limit".
NO_LIMIT = 4294967294


@contextmanager
def refusing(store: Store, how: str) -> Iterator[None]:
    """While inside, every connection the store takes, and every transaction begun on one
    it holds (its writer keeps one), is read-only (``how="read-only"``) or full at its
    present size (``how="full"``); SQLite itself refuses the writes."""
    assert store.engine is not None
    engine = store.engine
    state = {"on": True}

    def checkout(dbapi: Any, record: Any, proxy: Any) -> None:
        if how == "read-only":
            dbapi.execute(f"PRAGMA query_only={'ON' if state['on'] else 'OFF'}")
        else:
            pages = dbapi.execute("PRAGMA page_count").fetchone()[0]
            dbapi.execute(f"PRAGMA max_page_count={pages if state['on'] else NO_LIMIT}")

    def begin(connection: Any) -> None:
        checkout(connection.connection.dbapi_connection, None, None)

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "begin", begin)
    # The writer's connection, held across batches, begins a transaction of SQLAlchemy's
    # only for work other than records (records alone go in on sqlite3's own): a no-op
    # piece of work, queued ahead of anything the test writes, makes it refuse now.
    store.run_write_nowait(lambda session: None)
    try:
        yield
    finally:
        state["on"] = False
        # Connections already handed out are lifted on their next checkout; the listener
        # stays (lifting) for the rest of the store's life.
