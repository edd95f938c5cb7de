"""A PostgreSQL database of a test's own, made on the machine's server and dropped after
(``LABD_TEST_POSTGRES`` names the server; a clear failure, not a hang, where none answers)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import sqlalchemy

from labd.store.private import private_database

PG = os.environ.get("LABD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(private_database(PG, "labd_test"))
        except sqlalchemy.exc.OperationalError as exc:
            pytest.fail(f"PostgreSQL is needed at {PG} (set LABD_TEST_POSTGRES): {exc}")
        yield url
