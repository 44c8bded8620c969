"""The origin stamp of PREPARE TRANSACTION, made from inside PREPARE.

``pg_replication_origin_xact_setup`` called as a statement before PREPARE
would advance the origin even if the session died before PREPARE ran (abort
records carry the origin too), and a restart would skip a transaction that was
never prepared. COMMIT uses a session-local temporary table for this, but a
transaction that touched a temporary table cannot be prepared. So this is a
regular table: the apply session inserts one row just before PREPARE, and the
deferred constraint trigger (ENABLE ALWAYS: it must fire under
``session_replication_role = replica``) calls ``xact_setup`` with the row's
values inside PREPARE and deletes the row again, so the table stays empty.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE applier.prepare_stamp "
        "(lsn pg_catalog.pg_lsn NOT NULL, ts pg_catalog.timestamptz NOT NULL)"
    )
    op.execute(
        "CREATE FUNCTION applier.prepare_stamp() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path = pg_catalog AS $$ BEGIN "
        "PERFORM pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts); "
        "DELETE FROM applier.prepare_stamp; "
        "RETURN NULL; END $$"
    )
    op.execute(
        "CREATE CONSTRAINT TRIGGER prepare_stamp AFTER INSERT ON applier.prepare_stamp "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION applier.prepare_stamp()"
    )
    op.execute("ALTER TABLE applier.prepare_stamp ENABLE ALWAYS TRIGGER prepare_stamp")


def downgrade() -> None:
    op.execute("DROP TABLE applier.prepare_stamp")
    op.execute("DROP FUNCTION applier.prepare_stamp()")
