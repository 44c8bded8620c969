"""Schema statements run on the apply session, inside its open transaction.

The session's changes travel pipelined (:mod:`applier.apply.target.pipeline`); a
schema statement does not: :func:`run_statements` sends the run in hand, syncs
the pipeline (every change queued before it has reached the target and its
result is known: an earlier failure is raised as that change's), leaves
pipeline mode and runs each statement synchronously in the still open
transaction, under its own ``search_path`` if it has one (set local to the
transaction, the session's pinned path put back right after), then writes its
row of ``applier.schema_changes`` in the same transaction. The pipeline is
entered again whatever happens, so the session's rollback works as after any
failure. The statement and its record commit with the origin's stamp, or not
at all: a crash anywhere before that COMMIT leaves neither, and the stream
brings the transaction again.

:func:`session_view` lends the session's connection, out of pipeline mode, for
catalog look-ups that must see what the open transaction changed (a mapping
rebuilt after a column was added): the catalog connection sees only what is
committed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from applier.apply.sql.ddlplan import SchemaStatement
from applier.apply.target.pipeline import is_transient_sqlstate, lost
from applier.apply.target.session import TargetSession
from applier.errors import ApplyError, ConnectionLost
from applier.lsn import Lsn

#: One row per statement run (migration 0011).
_RECORD = (
    "INSERT INTO applier.schema_changes (origin, source, xid, commit_lsn, lsn, command_tag, "
    "schema_name, table_name, statement, source_statement) "
    "VALUES (%s, %s, %s, %s::pg_catalog.pg_lsn, %s::pg_catalog.pg_lsn, %s, %s, %s, %s, %s)"
)
_SET_PATH = "SELECT pg_catalog.set_config('search_path', %s, true)"
_GET_PATH = "SELECT pg_catalog.current_setting('search_path')"


def _leave_pipeline(session: TargetSession) -> None:
    """Send what is held, wait for every result, leave pipeline mode (in a transaction)."""
    session.runs.end_run()
    session.sync_pipeline()
    if session.failure is not None:
        session.reenter_pipeline()
        session.raise_failure()


def run_statements(
    session: TargetSession, lsn: Lsn, xid: int, commit_lsn: Lsn, changes: Sequence[SchemaStatement]
) -> list[str]:
    """Run ``changes`` in the open target transaction and record them; their texts.

    A statement the target refuses raises :class:`~applier.errors.ApplyError`
    (exit 3) naming it, the LSN, xid and table; a lost connection (or a deadlock,
    a serialization failure) a transient error, retried from the origin.
    """
    assert session.in_txn
    _leave_pipeline(session)
    try:
        return _run_all(session.conn, session.origin, lsn, xid, commit_lsn, changes)
    finally:
        session.reenter_pipeline()


def run_statements_apart(
    conn: psycopg.Connection[Any],
    origin: str,
    lsn: Lsn,
    xid: int,
    commit_lsn: Lsn,
    changes: Sequence[SchemaStatement],
) -> list[str]:
    """Run ``changes`` and record them in a transaction of their own on ``conn`` (an
    autocommit connection beside the session); their texts.

    For what a prepared transaction must not hold: a column the source added and
    committed before it (``[schema] follow``). Inside it, the ALTER's lock would
    last until COMMIT PREPARED and stop every transaction between PREPARE and it
    that changes the table (on the source they run: their ALTER was committed).
    Committed apart, a crash before the PREPARE leaves the column, which following
    again finds there (nothing is run twice)."""
    with conn.transaction():
        return _run_all(conn, origin, lsn, xid, commit_lsn, changes)


def _run_all(
    conn: psycopg.Connection[Any],
    origin: str,
    lsn: Lsn,
    xid: int,
    commit_lsn: Lsn,
    changes: Sequence[SchemaStatement],
) -> list[str]:
    texts: list[str] = []
    for st in changes:
        text = st.statement if isinstance(st.statement, str) else st.statement.as_string(conn)
        try:
            _run_one(conn, st, text)
            conn.execute(
                _RECORD,
                (
                    origin, st.source, xid, str(Lsn(commit_lsn)), str(Lsn(lsn)),
                    st.command_tag, st.schema_name, st.table_name, text, st.source_statement,
                ),
            )  # fmt: skip
        except psycopg.Error as e:
            raise _failed(e, st, text, lsn, xid) from None
        texts.append(text)
    return texts


def _run_one(conn: psycopg.Connection[Any], st: SchemaStatement, text: str) -> None:
    if st.search_path is None:
        conn.execute(text.encode())
        return
    row = conn.execute(_GET_PATH).fetchone()
    pinned = str(row[0]) if row else "pg_catalog"
    conn.execute(_SET_PATH, (st.search_path,))
    conn.execute(text.encode())
    conn.execute(_SET_PATH, (pinned,))


def _failed(
    e: psycopg.Error, st: SchemaStatement, text: str, lsn: Lsn, xid: int
) -> ApplyError | ConnectionLost:
    state = e.sqlstate
    if isinstance(e, psycopg.OperationalError) and state is None:
        return lost(e)
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if is_transient_sqlstate(state):
        return ConnectionLost(f"a schema change failed on the target: {detail}", sqlstate=state)
    return ApplyError(
        f"the target refused a schema change ({st.command_tag}, from the "
        f"{'Relation message' if st.source == 'relation' else 'captured DDL'}): "
        f"{detail}",
        lsn=str(Lsn(lsn)),
        xid=xid,
        table=st.qualname,
        sqlstate=state,
        statement=text,
        hint=st.hint
        or "make the target accept this statement (create what it needs there) or make "
        "the change there by hand, then restart applier run: what is still needed runs "
        "again, in the target transaction of the change that needs it",
    )


@contextmanager
def session_view(session: TargetSession) -> Iterator[psycopg.Connection[Any]]:
    """The session's connection, out of pipeline mode, for catalog look-ups that
    must see the open transaction's schema changes (or the last one committed)."""
    if not session.in_txn:
        session.settle()  # commits in flight are done; pipeline left (begin() enters it)
        yield session.conn
        return
    _leave_pipeline(session)
    try:
        yield session.conn
    except psycopg.OperationalError as e:
        raise lost(e) from None
    finally:
        session.reenter_pipeline()


__all__ = ["run_statements", "session_view"]
