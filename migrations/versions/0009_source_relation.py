"""Source tables by OID: a table renamed on the source is not taken for a new one.

``source_relation``: one row per (origin, source relation OID), with the schema
and name under which the worker last applied that source table. A Relation
message whose OID has a row under another name, for a table the target lacks,
is a table renamed (or moved to another schema) on the source: the worker stops
and says what to run on the target, where it would otherwise take it for a
table added to the publication and skip its changes (:mod:`applier.apply.rules.tablesync`).
Nothing is backfilled: the worker records each table the first time it maps it.

``bootstrap_table.src_relid``: the OID of each table a bootstrap copied, read
under its snapshot, so that a table renamed after the snapshot and before the
worker first applied it is known too.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE applier.source_relation (
            origin text NOT NULL,
            relid oid NOT NULL,
            schema_name text NOT NULL,
            table_name text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            PRIMARY KEY (origin, relid)
        )
        """
    )
    op.execute("ALTER TABLE applier.bootstrap_table ADD COLUMN src_relid oid")


def downgrade() -> None:
    op.execute("ALTER TABLE applier.bootstrap_table DROP COLUMN src_relid")
    op.execute("DROP TABLE applier.source_relation")
