"""The origin stamp of COMMIT, made from inside COMMIT for every role.

``pg_replication_origin_xact_setup`` called as a statement before COMMIT
would advance the origin even if the session died before COMMIT ran (abort
records carry the origin too), and a restart would skip a transaction that
never committed. The apply session used to create a temporary table for this,
and fell back to that unsafe statement for a role without the TEMPORARY
privilege. This permanent table works for every role that may write it (as
``applier.prepare_stamp`` of migration 0003 does for PREPARE TRANSACTION): the
session inserts one row just before COMMIT; the deferred constraint trigger
(ENABLE ALWAYS: it must fire under ``session_replication_role = replica``)
calls ``xact_setup`` with the row's values inside COMMIT, after every deferred
trigger queued before it, and deletes the row again, so the table stays
empty (each session only ever sees its own uncommitted row).

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE applier.commit_stamp "
        "(lsn pg_catalog.pg_lsn NOT NULL, ts pg_catalog.timestamptz NOT NULL)"
    )
    op.execute(
        "CREATE FUNCTION applier.commit_stamp() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path = pg_catalog AS $$ BEGIN "
        "PERFORM pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts); "
        "DELETE FROM applier.commit_stamp; "
        "RETURN NULL; END $$"
    )
    op.execute(
        "CREATE CONSTRAINT TRIGGER commit_stamp AFTER INSERT ON applier.commit_stamp "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION applier.commit_stamp()"
    )
    op.execute("ALTER TABLE applier.commit_stamp ENABLE ALWAYS TRIGGER commit_stamp")


def downgrade() -> None:
    op.execute("DROP TABLE applier.commit_stamp")
    op.execute("DROP FUNCTION applier.commit_stamp()")
