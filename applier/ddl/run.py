"""``applier ddl run``: one statement run on the source and emitted, in one transaction.

As pglogical's ``replicate_ddl_command``: for a user who wants to choose what
follows, or who cannot install event triggers (they need a superuser). In
one source transaction:

1. ``search_path`` is set (transaction-local) to what the role has in that
   database without applier's pinned ``pg_catalog`` (``ALTER ROLE/DATABASE
   ... SET search_path``, else PostgreSQL's default ``"$user", public``), or
   to ``--search-path``;
2. ``applier_ddl.capture`` is set to ``run`` (transaction-local), so that an
   installed capture does not emit the statement a second time (it leaves
   the objects it found in ``applier_ddl.run_objects``: the message carries
   them);
3. the statement runs, alone: it goes through the extended query protocol,
   which takes one statement, so ``"A; B"`` is the server's refusal, not two
   statements behind one message;
4. the ``applier.ddl`` message (via ``run``) is emitted with the statement's
   text as given, signed by the capture's ``applier_ddl.emit_run`` (``SECURITY
   DEFINER``: the role needs ``EXECUTE`` on it, which ``applier ddl install
   --run-role`` grants; without the capture installed nothing is run), and the
   transaction commits.

A failing statement rolls all of it back and its error is printed in one line
(exit 3). What the stream carries by itself is refused before it runs (data
changes, queries, transaction control: exit 2), as is an empty statement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from .. import privileges
from ..config import Config
from ..errors import ApplierError, ConfigError, PermanentError, TransientError
from . import capture
from .message import DdlMessage, DdlObject
from .source import first_line, source

Conn = psycopg.Connection[Any]

#: Command tags of statements ``ddl run`` refuses: the stream carries their effect
#: (DML), they change nothing (queries), or they would end the transaction the
#: message must share (transaction control).
NOT_DDL = frozenset(
    {
        "SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "COPY", "VALUES", "TABLE", "WITH",
        "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE",
        "PREPARE", "EXECUTE", "SET", "RESET", "SHOW", "EXPLAIN", "FETCH", "MOVE", "CLOSE",
        "DECLARE", "LISTEN", "NOTIFY", "UNLISTEN", "LOCK", "VACUUM", "ANALYZE", "CHECKPOINT",
        "DISCARD", "LOAD", "CALL", "DO",
    }
)  # fmt: skip

#: The role's own search_path in this database, as a session without applier's pin
#: would have it (most specific first: role and database, role, database).
_DEFAULT_PATH = """
SELECT pg_catalog.substr(c, 13)
FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) c
WHERE c LIKE 'search\\_path=%%'
  AND s.setrole IN (0, (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user))
  AND s.setdatabase IN (0, (SELECT oid FROM pg_catalog.pg_database
                            WHERE datname = pg_catalog.current_database()))
ORDER BY s.setrole = 0, s.setdatabase = 0
LIMIT 1
"""
POSTGRES_DEFAULT_PATH = '"$user", public'


@dataclass(frozen=True)
class Ran:
    """What ``ddl run`` did: the message it emitted (None: nothing to emit) and where."""

    tag: str
    message: DdlMessage | None
    lsn: str | None


def check_statement(statement: str) -> str:
    """The statement to run; an empty one is a usage error."""
    if not statement.strip().strip(";").strip():
        raise ConfigError(
            "applier ddl run: the statement is empty",
            hint='give the statement as one argument: applier ddl run --config F "ALTER TABLE ..."',
        )
    if _first_word(statement) in NOT_DDL:
        raise ConfigError(
            f"applier ddl run: {_first_word(statement)} is not a schema change; nothing was run",
            hint="ddl run is for DDL (CREATE, ALTER, DROP, ...): run data changes on the "
            "source as usual, the stream carries them",
        )
    return statement


def _first_word(statement: str) -> str:
    text = statement.lstrip().lstrip("(")
    return (text.split(None, 1) or [""])[0].rstrip(";").upper()


def run(cfg: Config, statement: str, search_path: str | None) -> Ran:
    """Run ``statement`` on the source and emit it, in one transaction (see the module doc)."""
    check_statement(statement)
    with source(cfg, "applier ddl run") as conn:
        privileges.check("ddl run", privileges.Scope(large_objects=False), source=conn)
        _check_signer(conn)
        path = search_path if search_path is not None else _default_path(conn)
        try:
            with conn.transaction():
                return _run_in(conn, statement, path)
        except psycopg.OperationalError as e:
            if conn.closed:
                raise TransientError(
                    f"applier ddl run: the source connection failed: {first_line(e)}",
                    hint="see on the source whether it committed (the statement's effect) "
                    "before running it again",
                ) from None
            raise _refused(e) from None
        except psycopg.Error as e:
            raise _refused(e) from None


#: The capture's function that signs and emits ``ddl run``'s message (its owner's key).
EMIT_RUN = f"{capture.SCHEMA}.emit_run(bytea)"


def _check_signer(conn: Conn) -> None:
    """The message must be signed (the worker runs no other): by ``emit_run``, which
    ``applier ddl install`` creates and grants."""
    row = conn.execute(
        "SELECT pg_catalog.to_regprocedure(%s) IS NOT NULL, current_user", (EMIT_RUN,)
    ).fetchone()
    assert row is not None
    if not row[0]:
        raise PermanentError(
            f"applier ddl run: the source has no {EMIT_RUN}, which signs the message "
            "(the worker runs only messages signed with the capture's key); nothing was run",
            hint="install the DDL capture once as a superuser: APPLIER_SOURCE__DSN='... "
            "user=postgres' applier ddl install --config F --run-role ROLE",
        )
    may = conn.execute(
        "SELECT pg_catalog.has_function_privilege(%s, 'EXECUTE')", (EMIT_RUN,)
    ).fetchone()
    if not may or not may[0]:
        raise PermanentError(
            f"applier ddl run: the source role {row[1]} may not sign applier's messages "
            f"(EXECUTE on {EMIT_RUN}); nothing was run",
            hint=f"a superuser grants it: applier ddl install --config F --run-role {row[1]} "
            f"(or GRANT EXECUTE ON FUNCTION {EMIT_RUN} TO {row[1]})",
        )


def _default_path(conn: Conn) -> str:
    row = conn.execute(_DEFAULT_PATH).fetchone()
    return str(row[0]) if row else POSTGRES_DEFAULT_PATH


def _run_in(conn: Conn, statement: str, path: str) -> Ran:
    conn.execute(
        "SELECT pg_catalog.set_config('search_path', %s, true), "
        "pg_catalog.set_config(%s, 'run', true), pg_catalog.set_config(%s, '', true)",
        (path, capture.MODE, capture.RUN_OBJECTS),
    )
    # Binary: psycopg then takes the extended protocol even without parameters,
    # and the server runs one statement or refuses (see the module doc).
    with conn.cursor(binary=True) as cur:
        cur.execute(statement.encode(), prepare=False)
        tag = _tag(cur.statusmessage or "")
    if tag.split(" ")[0] in NOT_DDL:
        # CREATE TABLE AS and SELECT INTO say SELECT: a table made and filled at
        # once, which the worker refuses to replay (it would fill it twice).
        raise ConfigError(
            f"applier ddl run: the statement ran as {tag}, not a schema change; rolled back",
            hint="ddl run is for DDL: for CREATE TABLE AS / SELECT INTO, create the table "
            "with ddl run, then fill it with INSERT ... SELECT on the source",
        )
    found = _found(conn)
    if found is not None and found[1] and not found[0]:
        # The capture saw only temporary objects (or applier's own): nothing to send.
        return Ran(tag, None, None)
    msg = DdlMessage(
        tag=tag,
        statement=statement,
        search_path=path,
        objects=found[0] if found is not None else (),
        via="run",
    )
    row = conn.execute(
        sql.SQL("SELECT {}.emit_run(%s)::text").format(sql.Identifier(capture.SCHEMA)),
        (msg.encode(),),
    ).fetchone()
    return Ran(tag, msg, str(row[0]) if row else None)


def _tag(status: str) -> str:
    """The command tag of a statement's status (``INSERT 0 1`` -> ``INSERT``)."""
    words = [w for w in status.split() if not w.isdigit()]
    return " ".join(words)


def _found(conn: Conn) -> tuple[tuple[DdlObject, ...], bool] | None:
    """What an installed capture left for this statement: (objects, some left out);
    None without one (its setting stays empty)."""
    row = conn.execute(
        "SELECT pg_catalog.current_setting(%s, true)", (capture.RUN_OBJECTS,)
    ).fetchone()
    if not row or not row[0]:
        return None
    doc = json.loads(row[0])
    objects = tuple(
        DdlObject(o["kind"], o["schema"], o["identity"], bool(o["dropped"])) for o in doc["objects"]
    )
    return objects, bool(doc["skipped"])


def _refused(e: psycopg.Error) -> ApplierError:
    if e.sqlstate == "42601" and "multiple commands" in str(e):
        return ConfigError(
            "applier ddl run: the argument holds more than one statement; nothing was run",
            hint="ddl run takes one statement: run each with its own ddl run",
        )
    hint = "nothing was changed on the source (rolled back); fix the statement and run it again"
    if e.sqlstate == "25001":  # active_sql_transaction: CONCURRENTLY and the like
        hint = (
            "this statement cannot run inside a transaction, and ddl run emits in the "
            "statement's transaction: run it on the source with the capture installed "
            "(applier ddl install), or without CONCURRENTLY"
        )
    return PermanentError(
        f"applier ddl run: the source refused the statement: {first_line(e)}",
        hint=hint,
        sqlstate=e.sqlstate,
    )
