"""A private PostgreSQL database: made on a server for one run (a test, a soak) and dropped
after, so that nothing it writes meets another run's. Loads nothing of the daemon."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy

__all__ = ["private_database"]


@contextlib.contextmanager
def private_database(server: str, prefix: str = "labd_private") -> Iterator[str]:
    """The URL of a new, empty database on the server of ``server`` (a URL naming any
    database there this user may connect to, ``postgresql://`` or
    ``postgresql+psycopg://``), in ``server``'s scheme; dropped afterwards, connections and
    all. ``sqlalchemy.exc.OperationalError`` where the server cannot be reached."""
    admin = sqlalchemy.create_engine(
        server.replace("postgresql://", "postgresql+psycopg://", 1),
        isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"create database {name}"))
        try:
            yield server.rsplit("/", 1)[0] + f"/{name}"
        finally:
            with admin.connect() as connection:
                connection.execute(sqlalchemy.text(f"drop database {name} with (force)"))
    finally:
        admin.dispose()
