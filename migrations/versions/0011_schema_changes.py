"""Schema changes the worker made on the target, kept beside the data they shaped.

``schema_changes``: one row per statement the worker ran on the target because
the stream said the source's schema changed, written in the target transaction
that ran it (so a rolled-back transaction leaves none and its replay writes it
once, exactly as the origin's progress):

* ``source = 'relation'``: a Relation message named what the target lacked
  (a column added on the source, a type widened; ``[schema] follow``); the
  statement is the one applier planned.
* ``source = 'ddl'``: a statement captured on the source (``applier ddl
  install``'s event trigger or ``applier ddl run``) and replayed at its
  position in the stream; ``source_statement`` is what the source ran,
  ``statement`` what the target ran (the same, but for forms a transaction
  cannot hold, such as ``CONCURRENTLY``).

``lsn`` is the position of the message that brought the change (the DDL
message, or the change that first needed the column); ``commit_lsn`` that of
its source transaction.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE applier.schema_changes (
            id bigserial PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            origin text NOT NULL,
            source text NOT NULL CHECK (source IN ('relation', 'ddl')),
            xid bigint,
            commit_lsn pg_lsn,
            lsn pg_lsn,
            command_tag text NOT NULL,
            schema_name text,
            table_name text,
            statement text NOT NULL,
            source_statement text
        )
        """
    )
    op.execute("CREATE INDEX schema_changes_origin ON applier.schema_changes (origin, lsn)")


def downgrade() -> None:
    op.execute("DROP TABLE applier.schema_changes")
