"""Skipping a captured DDL statement, and keeping what was skipped.

``skip_rules``: a fourth kind, ``ddl``: one captured statement, named by the
LSN of its ``applier.ddl`` message (``applier skip add --ddl-lsn LSN``, as the
worker's stop prints it); used once, then ``done``, like a ``txn`` rule. It
carries an ``lsn`` and nothing else of a change (no xid, table, operations,
SQLSTATEs).

``skipped_changes``: ``op = 'ddl'`` rows keep the statement the rule skipped
in the new column ``statement``; a statement may name no table (a type, a
schema), so ``schema_name`` and ``table_name`` may be NULL for those rows (and
only for those).

0006 created its CHECKs without names, so PostgreSQL generated them; they are
found here by their definition, and the migration stops if one is not there
(never a silent half-upgrade). The new ones have names.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision: str | None = "0011"
branch_labels = None
depends_on = None

#: Drop the one CHECK of ``table`` whose definition is LIKE ``pattern``.
_DROP_CHECK = """
DO $$
DECLARE
    found text[];
BEGIN
    SELECT pg_catalog.array_agg(conname) INTO found
      FROM pg_catalog.pg_constraint
     WHERE conrelid = '{table}'::pg_catalog.regclass AND contype = 'c'
       AND pg_catalog.pg_get_constraintdef(oid) LIKE '{pattern}';
    IF pg_catalog.cardinality(found) IS DISTINCT FROM 1 THEN
        RAISE EXCEPTION 'migration 0012: expected one CHECK of {table} like %, found %',
            '{pattern}', found;
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE {table} DROP CONSTRAINT %I', found[1]);
END
$$
"""


def _drop_check(table: str, pattern: str) -> None:
    op.execute(_DROP_CHECK.format(table=table, pattern=pattern.replace("'", "''")))


def upgrade() -> None:
    _drop_check("applier.skip_rules", "%ARRAY['object'::text, 'txn'::text, 'error'::text]%")
    _drop_check("applier.skip_rules", "%(kind = 'txn'::text) OR%")
    _drop_check(
        "applier.skipped_changes",
        "%ARRAY['insert'::text, 'update'::text, 'delete'::text, 'truncate'::text]%",
    )
    op.execute(
        """
        ALTER TABLE applier.skip_rules
          ADD CONSTRAINT skip_rules_kind_check
              CHECK (kind IN ('object', 'txn', 'error', 'ddl')),
          ADD CONSTRAINT skip_rules_lsn_check
              CHECK (kind IN ('txn', 'ddl') OR (xid IS NULL AND lsn IS NULL)),
          ADD CONSTRAINT skip_rules_ddl_check
              CHECK (kind <> 'ddl' OR (lsn IS NOT NULL AND xid IS NULL
                     AND table_pattern IS NULL AND ops IS NULL AND sqlstates IS NULL))
        """
    )
    op.execute(
        """
        ALTER TABLE applier.skipped_changes
          ADD COLUMN statement text,
          ALTER COLUMN schema_name DROP NOT NULL,
          ALTER COLUMN table_name DROP NOT NULL,
          ADD CONSTRAINT skipped_changes_op_check
              CHECK (op IN ('insert', 'update', 'delete', 'truncate', 'ddl')),
          ADD CONSTRAINT skipped_changes_ddl_check
              CHECK (CASE WHEN op = 'ddl' THEN statement IS NOT NULL
                     ELSE schema_name IS NOT NULL AND table_name IS NOT NULL END)
        """
    )


def downgrade() -> None:
    op.execute("DELETE FROM applier.skipped_changes WHERE op = 'ddl'")
    op.execute("DELETE FROM applier.skip_rules WHERE kind = 'ddl'")
    op.execute(
        """
        ALTER TABLE applier.skipped_changes
          DROP CONSTRAINT skipped_changes_ddl_check,
          DROP CONSTRAINT skipped_changes_op_check,
          DROP COLUMN statement,
          ALTER COLUMN schema_name SET NOT NULL,
          ALTER COLUMN table_name SET NOT NULL,
          ADD CHECK (op IN ('insert', 'update', 'delete', 'truncate'))
        """
    )
    op.execute(
        """
        ALTER TABLE applier.skip_rules
          DROP CONSTRAINT skip_rules_ddl_check,
          DROP CONSTRAINT skip_rules_lsn_check,
          DROP CONSTRAINT skip_rules_kind_check,
          ADD CHECK (kind IN ('object', 'txn', 'error')),
          ADD CHECK (kind = 'txn' OR (xid IS NULL AND lsn IS NULL))
        """
    )
