"""The stamp triggers stamp last: nothing after the stamp may let a termination in.

``pg_replication_origin_xact_setup`` sets session values that an *abort*
record carries too, and the abort advances the origin with them. The
triggers of migrations 0003 and 0005 stamped first and then deleted their
row; a backend terminated while that DELETE ran (``pg_terminate_backend``,
a fast shutdown of the target) aborted with the stamp set, and a restart
skipped a transaction that never committed.

Now the DELETE comes first and the stamp is the last thing the trigger
evaluates, inside the RETURN expression: PL/pgSQL checks for interrupts
before each statement, not after its expression, and from the trigger's
return to ``HOLD_INTERRUPTS()`` in CommitTransaction/PrepareTransaction
nothing checks (no cursors, ON COMMIT actions, NOTIFY or serializable
isolation on the apply session). A termination lands either before the
stamp (an abort without origin values) or after the commit record.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None

_NEW = {
    "commit_stamp": "DELETE FROM applier.commit_stamp; "
    "RETURN CASE WHEN pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts) "
    "IS NULL THEN NULL END;",
    "prepare_stamp": "DELETE FROM applier.prepare_stamp; "
    "RETURN CASE WHEN pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts) "
    "IS NULL THEN NULL END;",
}
_OLD = {
    "commit_stamp": "PERFORM pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts); "
    "DELETE FROM applier.commit_stamp; RETURN NULL;",
    "prepare_stamp": "PERFORM pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts); "
    "DELETE FROM applier.prepare_stamp; RETURN NULL;",
}


def _define(bodies: dict[str, str]) -> None:
    for name, body in bodies.items():
        op.execute(
            f"CREATE OR REPLACE FUNCTION applier.{name}() RETURNS trigger LANGUAGE plpgsql "
            f"SET search_path = pg_catalog AS $$ BEGIN {body} END $$"
        )


def upgrade() -> None:
    _define(_NEW)


def downgrade() -> None:
    _define(_OLD)
