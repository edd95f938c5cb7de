"""A PostgreSQL database of a test's own, made on the machine's server and dropped after
(``LABD_TEST_POSTGRES`` names the server; a clear failure, not a hang, where none answers)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy

PG = os.environ.get("LABD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database."""
    admin = sqlalchemy.create_engine(PG, isolation_level="AUTOCOMMIT",
                                     connect_args={"connect_timeout": 5})
    name = f"labd_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"create database {name}"))
    except sqlalchemy.exc.OperationalError as exc:
        admin.dispose()
        pytest.fail(f"PostgreSQL is needed at {PG} (set LABD_TEST_POSTGRES): {exc}")
    try:
        yield PG.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"drop database {name} with (force)"))
        admin.dispose()
