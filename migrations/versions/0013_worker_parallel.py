"""Parallel apply as the running worker sees it, for ``applier status``.

``worker_status.parallel``: with ``[apply] workers`` > 1, the pool's figures
(applier.apply.parallel.pool.PoolStats) as JSON, written with each heartbeat:
sessions, transactions in flight and waiting, and how often a key or a barrier
serialised them, deadlocks resolved, transactions applied again. NULL with one
session.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision: str | None = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE applier.worker_status ADD COLUMN parallel jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE applier.worker_status DROP COLUMN parallel")
