"""Ports held by a client under a lease it renews (``/v1/holds``), kept so that a daemon
taking over the lead refuses changes to them as the one before did.

Revision ID: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "port_holds",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("switch", sa.String(64), nullable=False),
        sa.Column("ports", sa.JSON, nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("ttl_s", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("port_holds")
