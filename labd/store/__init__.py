"""The record: SQLAlchemy 2 models under Alembic migrations, one writer, many readers.

SQLite by default (WAL: readers never block the writer, and a killed process loses no
committed transaction), PostgreSQL by URL. See :class:`labd.store.writer.Store`.
"""

from labd.errors import StoreError, StoreUnavailable
from labd.store.writer import Store

__all__ = ["Store", "StoreError", "StoreUnavailable"]
