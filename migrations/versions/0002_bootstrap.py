"""Bootstrap bookkeeping: one run per slot, its tables, and every slice copied.

``bootstrap_run`` says where a bootstrap of a slot stands (``phase``: copy ->
post_data -> done) and keeps what a resumed run needs once the exported
snapshot is gone: the consistent point, the post-data DDL dumped under the
snapshot and the sequence values read under it. ``bootstrap_table`` lists the
tables of the run (and whether the run created them, so post-data DDL is only
applied to tables it created). ``bootstrap_slice`` gets one row per slice,
inserted in the same target transaction as the slice's rows: a slice is either
copied and recorded, or neither. Rows/bytes/seconds feed the progress display.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


class PgLsn(sa.types.UserDefinedType[str]):
    """PostgreSQL's pg_lsn (SQLAlchemy has no type for it)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "pg_lsn"


def upgrade() -> None:
    op.create_table(
        "bootstrap_run",
        sa.Column("slot", sa.Text, primary_key=True),
        sa.Column("run_id", sa.BigInteger, nullable=False),
        sa.Column("phase", sa.Text, nullable=False),
        sa.Column("snapshot_name", sa.Text),
        sa.Column("consistent_lsn", PgLsn()),
        sa.Column("post_data_sql", sa.Text),
        sa.Column("sequences", postgresql.JSONB),
        sa.Column("started_at", sa.TIMESTAMP(timezone=True), server_default=sa.func.now()),
        sa.Column("finished_at", sa.TIMESTAMP(timezone=True)),
        sa.CheckConstraint(
            "phase IN ('starting', 'copy', 'post_data', 'done')", name="phase_known"
        ),
        schema="applier",
    )
    op.create_table(
        "bootstrap_table",
        sa.Column("slot", sa.Text, primary_key=True),
        sa.Column("run_id", sa.BigInteger, primary_key=True),
        sa.Column("src_schema", sa.Text, primary_key=True),
        sa.Column("src_name", sa.Text, primary_key=True),
        sa.Column("dst_schema", sa.Text, nullable=False),
        sa.Column("dst_name", sa.Text, nullable=False),
        sa.Column("created", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("slices", sa.Integer, nullable=False),
        sa.Column("est_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("est_rows", sa.BigInteger, nullable=False, server_default="0"),
        schema="applier",
    )
    op.create_table(
        "bootstrap_slice",
        sa.Column("slot", sa.Text, primary_key=True),
        sa.Column("run_id", sa.BigInteger, primary_key=True),
        sa.Column("src_schema", sa.Text, primary_key=True),
        sa.Column("src_name", sa.Text, primary_key=True),
        sa.Column("slice_no", sa.Integer, primary_key=True),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("done_at", sa.TIMESTAMP(timezone=True), server_default=sa.func.now()),
        schema="applier",
    )
    op.execute("CREATE SEQUENCE applier.bootstrap_run_id")


def downgrade() -> None:
    op.execute("DROP SEQUENCE applier.bootstrap_run_id")
    op.drop_table("bootstrap_slice", schema="applier")
    op.drop_table("bootstrap_table", schema="applier")
    op.drop_table("bootstrap_run", schema="applier")
