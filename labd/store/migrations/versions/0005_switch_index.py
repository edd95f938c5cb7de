"""Drop the index on reconfigurations.switch alone: the (switch, requested_ns) index serves
every query by switch, and each index is paid on every durable record.

Revision ID: 0005
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_reconfigurations_switch", table_name="reconfigurations")


def downgrade() -> None:
    op.create_index("ix_reconfigurations_switch", "reconfigurations", ["switch"])
