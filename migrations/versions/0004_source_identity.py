"""The source each replication origin replicates from.

One row per origin: the source's system identifier, timeline and database
(IDENTIFY_SYSTEM), recorded by ``applier run`` on its first start and by
``applier bootstrap`` when it creates the slot. ``run`` refuses to stream
from a source with another system identifier or database into the same
origin (the origin's LSNs would mean nothing there), and checks a timeline
change against the new timeline's history (:mod:`applier.apply.target.preflight`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "source_identity",
        sa.Column("origin", sa.Text, primary_key=True),
        # A uint64: text, since bigint cannot hold every value.
        sa.Column("system_identifier", sa.Text, nullable=False),
        sa.Column("timeline", sa.BigInteger, nullable=False),
        sa.Column("dbname", sa.Text, nullable=False),
        sa.Column("slot", sa.Text, nullable=False),
        sa.Column(
            "recorded_at", sa.TIMESTAMP(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("timeline_changed_at", sa.TIMESTAMP(timezone=True)),
        schema="applier",
    )


def downgrade() -> None:
    op.drop_table("source_identity", schema="applier")
