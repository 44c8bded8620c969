"""Conflicts and skip rules: what was decided about a change, kept on the target.

``conflict_log``: one row per conflict the worker met (PostgreSQL 18's names:
insert_exists, update_exists, multiple_unique_conflicts, update_missing,
delete_missing, update/delete_origin_differs), with the policy applied, the key,
the local and the remote row. A row is written in the target transaction that
keeps the change's outcome, so a rolled-back group leaves none and its replay
writes it once; a conflict that stops the worker (policy ``error``) is written
on its own and made unique by (origin, commit LSN, change number, type), so a
restart that meets it again does not add a second row.

``skip_rules``: what the worker must not apply (after openGauss's
``GS_SQLAPPLY_SKIP``): a table pattern and operations (``object``), one
transaction by xid or finish LSN (``txn``, used once, then ``done``), or the
changes that fail with given SQLSTATEs (``error``). ``skipped_changes``: what a
rule skipped (and, for ``dump = 'all'``, the rest of its transaction), so that
nothing skipped is lost: ``applier skip dump`` prints it as SQL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE applier.conflict_log (
            id bigserial PRIMARY KEY,
            logged_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            origin text NOT NULL,
            xid bigint,
            commit_lsn pg_lsn,
            end_lsn pg_lsn,
            change_lsn pg_lsn,
            change_no integer NOT NULL,
            schema_name text NOT NULL,
            table_name text NOT NULL,
            conflict text NOT NULL CHECK (conflict IN (
                'insert_exists', 'update_exists', 'multiple_unique_conflicts',
                'update_missing', 'delete_missing',
                'update_origin_differs', 'delete_origin_differs')),
            resolution text NOT NULL CHECK (resolution IN (
                'error', 'skip', 'keep_local', 'apply_remote', 'last_update_wins')),
            key jsonb,
            local_row jsonb,
            remote_row jsonb,
            UNIQUE (origin, commit_lsn, change_no, conflict)
        )
        """
    )
    op.execute(
        "CREATE INDEX conflict_log_table ON applier.conflict_log "
        "(origin, schema_name, table_name, conflict)"
    )
    op.execute(
        """
        CREATE TABLE applier.skip_rules (
            id bigserial PRIMARY KEY,
            origin text NOT NULL,
            kind text NOT NULL CHECK (kind IN ('object', 'txn', 'error')),
            table_pattern text,
            ops text[] CHECK (ops <@ ARRAY['insert', 'update', 'delete', 'truncate']),
            xid bigint CHECK (xid BETWEEN 0 AND 4294967295),
            lsn pg_lsn,
            sqlstates text[],
            dump text NOT NULL CHECK (dump IN ('none', 'skipped', 'all')),
            created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            done boolean NOT NULL DEFAULT false,
            done_at timestamptz,
            done_end_lsn pg_lsn,
            done_gid text,
            CHECK (kind <> 'txn' OR ((xid IS NULL) <> (lsn IS NULL))),
            CHECK (kind = 'txn' OR (xid IS NULL AND lsn IS NULL)),
            CHECK (kind <> 'object' OR table_pattern IS NOT NULL)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE applier.skipped_changes (
            id bigserial PRIMARY KEY,
            recorded_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
            origin text NOT NULL,
            rule_id bigint REFERENCES applier.skip_rules (id) ON DELETE SET NULL,
            xid bigint,
            commit_lsn pg_lsn,
            end_lsn pg_lsn,
            change_lsn pg_lsn,
            change_no integer NOT NULL,
            commit_time timestamptz,
            schema_name text NOT NULL,
            table_name text NOT NULL,
            op text NOT NULL CHECK (op IN ('insert', 'update', 'delete', 'truncate')),
            skipped boolean NOT NULL,
            key jsonb,
            old_row jsonb,
            new_row jsonb,
            error text,
            sqlstate text
        )
        """
    )
    op.execute("CREATE INDEX skipped_changes_txn ON applier.skipped_changes (origin, xid)")


def downgrade() -> None:
    op.execute("DROP TABLE applier.skipped_changes")
    op.execute("DROP TABLE applier.skip_rules")
    op.execute("DROP TABLE applier.conflict_log")
