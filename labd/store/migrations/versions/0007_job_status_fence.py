"""A job's status and epoch are kept with its pool (a daemon that takes over, or restarts,
goes on protecting the jobs that were running); on PostgreSQL, ``labd_fence``: the check
of a write's epoch against the lease, as one statement a pipeline can carry.

Revision ID: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: Raised as SQLSTATE LF001 (labd.store.writer.STALE_EPOCH): the writer's epoch is not the
#: lease's. The row stays share-locked to the end of the writer's transaction, so that no
#: takeover commits between the check and the write.
FENCE = """
CREATE OR REPLACE FUNCTION labd_fence(lab text, writer bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    current bigint;
BEGIN
    SELECT epoch INTO current FROM leases WHERE name = lab FOR SHARE;
    IF current IS DISTINCT FROM writer THEN
        RAISE EXCEPTION 'refused a write of lab % from epoch %: the lease is at epoch %, '
                        'another daemon leads now', lab, writer, current
            USING ERRCODE = 'LF001';
    END IF;
    RETURN current;
END
$$
"""


def upgrade() -> None:
    with op.batch_alter_table("job_pools") as table:
        table.add_column(sa.Column("status", sa.String(20), nullable=True))
        table.add_column(sa.Column("epoch", sa.Integer, nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FENCE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS labd_fence(text, bigint)")
    with op.batch_alter_table("job_pools") as table:
        table.drop_column("epoch")
        table.drop_column("status")
