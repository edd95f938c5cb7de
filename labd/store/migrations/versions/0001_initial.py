"""The first schema: reconfigurations and their pair changes, connection events, power
traces, failover timelines, the intended state.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconfigurations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("switch", sa.String(64), nullable=False),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("requested_ns", sa.BigInteger, nullable=False),
        sa.Column("dispatched_ns", sa.BigInteger, nullable=True),
        sa.Column("acked_ns", sa.BigInteger, nullable=True),
        sa.Column("light_ns", sa.BigInteger, nullable=True),
        sa.Column("done_ns", sa.BigInteger, nullable=False),
        sa.Column("wall_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_reconfigurations_switch", "reconfigurations", ["switch"])
    op.create_index("ix_reconfigurations_cause", "reconfigurations", ["cause"])
    op.create_index("ix_reconfigurations_wall_time", "reconfigurations", ["wall_time"])
    op.create_index("ix_reconfigurations_switch_time", "reconfigurations",
                    ["switch", "requested_ns"])
    op.create_table(
        "pair_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("reconfiguration_id", sa.Integer, sa.ForeignKey("reconfigurations.id"),
                  nullable=False),
        sa.Column("action", sa.String(12), nullable=False),
        sa.Column("a", sa.Integer, nullable=False),
        sa.Column("b", sa.Integer, nullable=False),
    )
    op.create_index("ix_pair_changes_reconfiguration_id", "pair_changes",
                    ["reconfiguration_id"])
    op.create_table(
        "connection_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instrument", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(24), nullable=False),
        sa.Column("state", sa.String(16), nullable=True),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("at_ns", sa.BigInteger, nullable=False),
        sa.Column("wall_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_connection_events_instrument", "connection_events", ["instrument"])
    op.create_table(
        "power_traces",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("meter", sa.String(64), nullable=False),
        sa.Column("channel", sa.Integer, nullable=False),
        sa.Column("start_ns", sa.BigInteger, nullable=False),
        sa.Column("atime_s", sa.Float, nullable=False),
        sa.Column("dbm", sa.LargeBinary, nullable=False),
        sa.Column("reconfiguration_id", sa.Integer, sa.ForeignKey("reconfigurations.id"),
                  nullable=True),
    )
    op.create_table(
        "failover_timelines",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(24), nullable=False),
        sa.Column("stages", sa.JSON, nullable=False),
        sa.Column("wall_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_failover_timelines_job", "failover_timelines", ["job"])
    op.create_table(
        "intended_pairs",
        sa.Column("switch", sa.String(64), primary_key=True),
        sa.Column("a", sa.Integer, primary_key=True),
        sa.Column("b", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    for table in ("intended_pairs", "failover_timelines", "power_traces",
                  "connection_events", "pair_changes", "reconfigurations"):
        op.drop_table(table)
