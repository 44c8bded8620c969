"""The applier schema and the worker's status row.

One row per replication origin: what ``applier status`` shows of the worker
(pid, state, heartbeat, counters, last applied commit) and the last error it
stopped on, so the error is visible after the process is gone.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


class PgLsn(sa.types.UserDefinedType[str]):
    """PostgreSQL's pg_lsn (SQLAlchemy has no type for it)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "pg_lsn"


def upgrade() -> None:
    op.create_table(
        "worker_status",
        sa.Column("origin", sa.Text, primary_key=True),
        sa.Column("slot", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("host", sa.Text),
        sa.Column("state", sa.Text, nullable=False, server_default="stopped"),
        sa.Column("started_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("heartbeat_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("applied_txns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("skipped_changes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_commit_lsn", PgLsn()),
        sa.Column("last_commit_time", sa.TIMESTAMP(timezone=True)),
        sa.Column("last_error", postgresql.JSONB),
        sa.Column("last_error_at", sa.TIMESTAMP(timezone=True)),
        sa.CheckConstraint(
            "state IN ('starting', 'running', 'stopped', 'error')", name="state_known"
        ),
        schema="applier",
    )


def downgrade() -> None:
    op.drop_table("worker_status", schema="applier")
