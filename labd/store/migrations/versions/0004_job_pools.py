"""Jobs' members and spares are kept as recoveries and returned spares leave them.

Revision ID: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_pools",
        sa.Column("job", sa.String(64), primary_key=True),
        sa.Column("members", sa.JSON, nullable=False),
        sa.Column("spares", sa.JSON, nullable=False),
        sa.Column("wall_time", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_pools")
