"""Failover timelines say what triggered them and what was done.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("failover_timelines") as batch:
        batch.add_column(sa.Column("trigger", sa.String(24), nullable=True))
        batch.add_column(sa.Column("detail", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("failover_timelines") as batch:
        batch.drop_column("detail")
        batch.drop_column("trigger")
