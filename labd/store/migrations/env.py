"""Alembic environment: labd runs migrations itself at start-up (``Store.open``); the
connection comes in through ``config.attributes``."""

from alembic import context

from labd.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
