"""The origin stamp, made from inside COMMIT and PREPARE TRANSACTION.

``pg_replication_origin_xact_setup`` sets session values that the next commit
record carries; but an *abort* record carries them too and advances the
origin as well (seen on PG15 and PG18: a backend that exits between the stamp
and COMMIT; on PG18 also a COMMIT that fails after it), so a restart would
skip a transaction that never committed. Hence the stamp is made from inside
COMMIT: a commit inserts one row into ``applier.commit_stamp`` (migration
0005), whose deferred constraint trigger (ENABLE ALWAYS) deletes the row and
then, as the very last thing it evaluates, calls ``xact_setup`` with the
row's values (migration 0007); it fires in COMMIT after every deferred
trigger queued before it. A client that dies before COMMIT reached the
server leaves the origin alone, and so does a backend terminated inside
COMMIT: nothing between the stamp and the commit record checks for
interrupts. A failure inside COMMIT after the stamp (a deferred trigger
queued by another one, hence after ours) is undone while the session lives
(``applier.apply.target.origin.rewind``). PREPARE TRANSACTION stamps the same way
through ``applier.prepare_stamp`` (migration 0003).

There is no other way: a role that cannot write those tables is refused at
start (:func:`check_stamp`) with the GRANT to run, rather than stamped by a
statement before COMMIT (which earlier versions fell back to, and which can
skip a transaction after a restart). The tables are permanent (a session's
temporary table, used before, cannot be touched by a transaction that is then
prepared, and needs the TEMPORARY privilege); each stays empty, as every
session only sees its own uncommitted row.
"""

from __future__ import annotations

from typing import Any

import psycopg

from applier.apply.sql.planner import Params
from applier.errors import PermanentError
from applier.lsn import Lsn, pg_timestamp

STAMP = (
    b"INSERT INTO applier.commit_stamp VALUES ($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)"
)
PREPARE_STAMP = (
    b"INSERT INTO applier.prepare_stamp VALUES ($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)"
)

_TABLES = ("commit_stamp", "prepare_stamp")


def check_stamp(conn: psycopg.Connection[Any]) -> None:
    """Refuse a role that cannot stamp the origin inside COMMIT/PREPARE (see above)."""
    rows = conn.execute(
        "SELECT c.relname, pg_catalog.has_schema_privilege(n.oid, 'USAGE'), "
        "pg_catalog.has_table_privilege(c.oid, 'INSERT'), "
        "pg_catalog.has_table_privilege(c.oid, 'DELETE') "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'applier' AND c.relname = ANY(%s)",
        (list(_TABLES),),
    ).fetchall()
    if len(rows) != len(_TABLES):
        raise PermanentError(
            "the target has no applier.commit_stamp/applier.prepare_stamp tables "
            "(the applier schema is not at the current version)",
            hint="run `applier migrate --config FILE` (applier run does it at start)",
        )
    missing = []
    if not all(r[1] for r in rows):
        missing.append("USAGE ON SCHEMA applier")
    for name, _usage, insert, delete in rows:
        if not (insert and delete):
            missing.append(f"INSERT, DELETE ON applier.{name}")
    row = conn.execute(
        "SELECT pg_catalog.has_function_privilege("
        "'pg_catalog.pg_replication_origin_xact_setup(pg_lsn, timestamptz)', 'EXECUTE')"
    ).fetchone()
    if not row or not row[0]:
        missing.append("EXECUTE ON FUNCTION pg_replication_origin_xact_setup(pg_lsn, timestamptz)")
    if missing:
        role = str(conn.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
        raise PermanentError(
            f"role {role} cannot stamp the replication origin inside COMMIT: it lacks "
            + "; ".join(missing),
            hint=f"as the owner of the applier schema (or a superuser) run: "
            f"{_grants(missing, role)}",
        )


def _grants(missing: list[str], role: str) -> str:
    quoted = '"' + role.replace('"', '""') + '"'
    out = []
    if any(m.startswith("USAGE") for m in missing):
        out.append(f"GRANT USAGE ON SCHEMA applier TO {quoted};")
    if any(" ON applier." in m for m in missing):
        out.append(
            f"GRANT INSERT, DELETE ON applier.commit_stamp, applier.prepare_stamp TO {quoted};"
        )
    if any(m.startswith("EXECUTE") for m in missing):
        out.append(
            "GRANT EXECUTE ON FUNCTION pg_replication_origin_xact_setup(pg_lsn, timestamptz) "
            f"TO {quoted};"
        )
    return " ".join(out)


def stamp_params(end_lsn: Lsn, ts: int) -> Params:
    """(end_lsn, commit timestamp) as text parameters of an origin stamp."""
    return [str(Lsn(end_lsn)).encode(), pg_timestamp(ts).isoformat().encode()]


def literal(text: str) -> bytes:
    """A string literal (a GID: PREPARE TRANSACTION takes no parameter)."""
    return ("'" + text.replace("'", "''") + "'").encode()
