"""Per-table sync states: tables added to a running replication (``applier sync-tables``).

``table_sync``: one row per (origin, source table), as ``pg_subscription_rel``
is for the built-in subscriber. ``state`` is one of

* ``skipped``: the worker met changes of an included table that the target
  lacks and that applier never copied; it skips them (one warning) until
  ``sync-tables`` copies the table;
* ``init``, ``copying`` (``lsn`` = the copy's snapshot LSN), ``catchup``,
  ``syncwait``, ``handover`` (``lsn`` = the worker's position), ``syncdone``
  (``lsn`` = the boundary: the table's changes of transactions ending at or
  before it were applied by ``sync-tables``, later ones by the worker) and
  ``ready``.

``slot`` names the table's own slot and replication origin while it syncs;
``created``: sync-tables created the target table (its indexes come after the data).
The protocol is in :mod:`applier.synctables`. Nothing is backfilled here (the
migration does not know the origins' ``[tables]``): the worker records the
tables the target has as ``ready`` on its first start with this schema.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE applier.table_sync (
            origin text NOT NULL,
            schema_name text NOT NULL,
            table_name text NOT NULL,
            state text NOT NULL CHECK (state IN ('skipped', 'init', 'copying', 'catchup',
                'syncwait', 'handover', 'syncdone', 'ready')),
            lsn pg_lsn,
            slot text,
            created boolean NOT NULL DEFAULT false,
            updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            PRIMARY KEY (origin, schema_name, table_name)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE applier.table_sync")
