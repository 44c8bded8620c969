"""``applier ddl install`` and ``uninstall``: the capture on the source, checked and reported.

Both connect with the config's ``[source] dsn`` (``APPLIER_SOURCE__DSN``
overrides it for one run: the worker's replication role is seldom a
superuser, and need not be one), check the role before changing anything
(:data:`applier.privileges.NEEDS`: a superuser, exit 3 otherwise), make the
change in one transaction and return the line that says what they did.
Running either twice is safe: ``install`` replaces (or upgrades) what is
there, ``uninstall`` of nothing says so and exits 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from .. import pgconn, privileges
from ..config import Config
from ..errors import PermanentError, TransientError
from ..redact import redact_dsn
from . import capture

Conn = psycopg.Connection[Any]


@contextmanager
def source(cfg: Config, purpose: str) -> Iterator[Conn]:
    """A writable connection to the source (applier's others there are read-only)."""
    try:
        conn = pgconn.connect(
            cfg.source.conninfo(),
            side="source",
            purpose=purpose,
            extra={"default_transaction_read_only": "off"},
        )
    except psycopg.OperationalError as e:
        raise TransientError(
            f"source unreachable ({redact_dsn(cfg.source.dsn)}): {first_line(e)}",
            hint="check [source] dsn and that the server is up; nothing was changed",
        ) from None
    with conn:
        yield conn


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _where(conn: Conn) -> str:
    return f"database {conn.info.dbname} on the source"


def _check_superuser(conn: Conn, command: str) -> None:
    role, lacking = privileges.missing(
        conn, privileges.NEEDS[command], privileges.Scope(large_objects=False)
    )
    if lacking:
        raise privileges.MissingPrivileges(
            f"applier {command}: the source role {_ident(role)} is not a superuser, and PostgreSQL "
            "(15 to 18) lets only a superuser create or drop an event trigger; nothing was changed",
            hint="run it once with a superuser's DSN (APPLIER_SOURCE__DSN='... user=postgres' "
            f"applier {command} --config F); the worker's role needs nothing more. Without "
            "event triggers, applier ddl run emits the statements you run through it",
        )


def install(cfg: Config, run_roles: tuple[str, ...] = ()) -> str:
    """Install (or replace, or upgrade) the capture, ``run_roles`` granted ``ddl run``;
    the line saying what was done."""
    with source(cfg, "applier ddl install") as conn:
        _check_superuser(conn, "ddl install")
        before = capture.state(conn)
        if before.schema and not before.ours:
            raise PermanentError(
                f"applier ddl install: the schema {capture.SCHEMA} exists in the "
                f"{_where(conn)} and is not applier's (no applier comment); nothing was changed",
                hint=f"rename or drop that schema: applier keeps its capture in {capture.SCHEMA}",
            )
        if before.version is not None and before.version > capture.CAPTURE_VERSION:
            raise PermanentError(
                f"applier ddl install: the {_where(conn)} has DDL capture version "
                f"{before.version}, newer than this applier's {capture.CAPTURE_VERSION}; "
                "nothing was changed",
                hint="install with the newer applier (or uninstall first to go back)",
            )
        with _errors("ddl install"):
            capture.install(conn, before, run_roles)
        return f"{_done(before)} in the {_where(conn)}: {_what()}"


def _done(before: capture.State) -> str:
    new = capture.CAPTURE_VERSION
    if before.version is None and not before.schema and not before.triggers:
        return f"installed DDL capture version {new}"
    if before.version is None or not before.installed:
        return f"repaired DDL capture (was partly installed), now version {new}"
    if before.version < new:
        return f"upgraded DDL capture from version {before.version} to {new}"
    return f"replaced DDL capture version {new} (the same version was installed)"


def _what() -> str:
    triggers = ", ".join(f"{n} ({e})" for e, n in capture.TRIGGERS.items())
    return f"schema {capture.SCHEMA}, event triggers {triggers}"


def uninstall(cfg: Config) -> str:
    """Remove what ``install`` created; the line saying what was done."""
    with source(cfg, "applier ddl uninstall") as conn:
        before = capture.state(conn)
        if not before.triggers and not before.ours:
            return f"DDL capture is not installed in the {_where(conn)}: nothing to remove"
        _check_superuser(conn, "ddl uninstall")
        with _errors("ddl uninstall"):
            capture.uninstall(conn, before)
        kept = (
            f" (the schema {capture.SCHEMA} is not applier's and stays)"
            if before.schema and not before.ours
            else ""
        )
        return f"removed DDL capture from the {_where(conn)}: {_what()}{kept}"


@contextmanager
def _errors(command: str) -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as e:
        raise TransientError(
            f"applier {command}: the source connection failed: {first_line(e)}",
            hint=f"run applier {command} again: it is one transaction, nothing half done",
        ) from None
    except psycopg.Error as e:
        raise PermanentError(
            f"applier {command}: the source refused: {first_line(e)}; nothing was changed",
            sqlstate=e.sqlstate,
        ) from None
