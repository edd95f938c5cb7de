"""Reconfigurations say when the command that moved the light left.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations") as batch:
        batch.add_column(sa.Column("activated_ns", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations") as batch:
        batch.drop_column("activated_ns")
