"""The lag as the running worker measures it (applier.lag), for ``applier status``.

``worker_status.pending_since``: the source commit time of the oldest
transaction the worker has received and not yet applied, NULL when none is
pending; ``worker_status.lag_at``: when the worker last said so. The worker's
reporter thread writes both every ``[apply] status_interval``, also while the
apply loop is blocked, so ``status`` shows a lag that grows then; the
heartbeat (``heartbeat_at``) stays the apply loop's.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE applier.worker_status "
        "ADD COLUMN pending_since timestamptz, ADD COLUMN lag_at timestamptz"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE applier.worker_status DROP COLUMN pending_since, DROP COLUMN lag_at")
