"""Create the tables the target lacks, from the source's own definitions.

``pg_dump --schema-only -t <each table>`` under the exported snapshot
(``--snapshot``), so the definitions are those of the data being copied.
``--section=pre-data`` (schemas, owned sequences, tables, partitions,
defaults) runs before the copy; ``--section=post-data`` (primary keys,
indexes, constraints, foreign keys, triggers) is dumped at the same time,
kept in the bookkeeping, and run after the data, when building indexes in one
pass is much cheaper than maintaining them row by row. Only tables the target
lacked get either; existing (empty) target tables are used as they are.

The pg_dump is one of the source's major version or newer
(:func:`.clients.pick`): a newer pg_dump reads older servers. Its output is cleaned for the
target: psql meta-commands (``\\restrict``) and ``SET`` of settings the target
server does not know (e.g. ``transaction_timeout`` on PG<17) are dropped. It
dumps in UTF8 (``--encoding``), the target sessions' client encoding. It gets
the connection string as ``--dbname`` with the secrets taken out (they go in
its environment: :mod:`.sessions`), so the password is never on a command
line or in a log.

Column types outside pg_catalog must exist on the target before CREATE TABLE:
enum types are created from ``pg_enum``, types of an extension by ``CREATE
EXTENSION IF NOT EXISTS``; anything else is a clear error naming the type.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .. import pgconn
from ..errors import BootstrapError, BootstrapRefused
from .clients import program
from .plan import quote_qual
from .sessions import child_connection

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]


def dump(
    conninfo: str,
    tables: Iterable[tuple[str, str]],
    section: str,
    snapshot: str | None,
    bindir: Path | None = None,
) -> str:
    """pg_dump's schema-only SQL of ``section`` for exactly ``tables``.

    ``bindir``: the client tools :func:`.clients.pick` chose for the source
    (None: the newest found, whatever the source's version).
    """
    pg_dump = str(bindir / "pg_dump") if bindir else program("pg_dump", conninfo)
    args = [
        pg_dump, "--schema-only", f"--section={section}",
        "--encoding=UTF8", "--no-owner",
        "--no-privileges", "--no-publications", "--no-subscriptions", "--no-tablespaces",
        "--no-security-labels",
    ]  # fmt: skip
    if snapshot:
        args.append(f"--snapshot={snapshot}")
    for schema, name in tables:
        args += ["-t", quote_qual(schema, name)]  # quoted: an exact name, not a pattern
    with child_connection(pgconn.pinned_conninfo(conninfo, "source")) as child:
        args.append(f"--dbname={child.dbname}")
        proc = subprocess.run(args, env=child.env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise dump_failure(proc.stderr)
    return proc.stdout


def dump_failure(stderr: str) -> BootstrapError:
    """pg_dump's failure as one line; a pg_dump older than the source is permanent (exit 3):
    rerunning picks the same program (:mod:`.clients` picks the newest there is)."""
    lines = stderr.strip().splitlines() or ["(no message)"]
    if any("server version mismatch" in line for line in lines):
        detail = next((ln for ln in lines if "server version:" in ln), lines[-1])
        return BootstrapRefused(
            f"pg_dump is older than the source: {detail.removeprefix('pg_dump: detail: ')}",
            hint="install the PostgreSQL client tools of the source's major version or newer "
            "(pg_dump refuses newer servers)",
        )
    return BootstrapError(f"pg_dump of the source schema failed: {lines[-1]}")


_SET = re.compile(r"^SET\s+(\w+)\s*=")


def clean_script(script: str, known_settings: set[str]) -> str:
    """Drop psql meta-commands and SETs of settings the target does not have."""
    out = []
    for line in script.splitlines():
        if line.startswith("\\"):
            continue
        m = _SET.match(line)
        if m and m.group(1).lower() not in known_settings:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def run_script(tgt: Conn, script: str, what: str) -> None:
    """Run a pg_dump script on the target in one transaction."""
    known = {r[0] for r in tgt.execute("SELECT name FROM pg_settings").fetchall()}
    try:
        with tgt.transaction():
            tgt.execute(clean_script(script, known).encode(), prepare=False)
            # pg_dump empties search_path for the session; give it back.
            tgt.execute("RESET search_path")
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0]
        raise BootstrapError(
            f"creating {what} on the target failed: {first}",
            hint="create the object named on the target (or fix it there) and rerun",
        ) from None


def missing_tables(tgt: Conn, tables: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for schema, name in tables:
        row = tgt.execute("SELECT to_regclass(%s)", (quote_qual(schema, name),)).fetchone()
        if row is None or row[0] is None:
            out.append((schema, name))
    return out


def ensure_schemas(tgt: Conn, schemas: Iterable[str]) -> None:
    for schema in sorted(set(schemas)):
        tgt.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


_USER_TYPES = """
SELECT DISTINCT tn.nspname, t.typname, t.typtype, e.extname
FROM pg_attribute a
JOIN pg_type t0 ON t0.oid = a.atttypid
JOIN pg_type t ON t.oid = CASE WHEN t0.typcategory = 'A' THEN t0.typelem ELSE t0.oid END
JOIN pg_namespace tn ON tn.oid = t.typnamespace
LEFT JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
LEFT JOIN pg_extension e ON e.oid = d.refobjid
WHERE a.attrelid = ANY(%s::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped
  AND tn.nspname NOT IN ('pg_catalog', 'information_schema')
"""


MissingType = tuple[str, str, str, str | None]  # schema, name, typtype, extension


def missing_types(src: Conn, tgt: Conn, tables: Iterable[tuple[str, str]]) -> list[MissingType]:
    """The non-built-in column types of ``tables`` that the target lacks.

    Raises for one that bootstrap cannot create (neither an enum nor an
    extension's), before anything is created.
    """
    regs = [quote_qual(s, n) for s, n in tables]
    if not regs:
        return []
    out: list[MissingType] = []
    for nsp, typ, kind, ext in src.execute(_USER_TYPES, (regs,)).fetchall():
        qual = quote_qual(nsp, typ)
        if tgt.execute("SELECT to_regtype(%s)", (qual,)).fetchone() != (None,):
            continue
        if not ext and kind != "e":
            raise BootstrapRefused(
                f"type {nsp}.{typ} used by the copied tables does not exist on the target",
                hint="create it on the target (same definition as on the source) and rerun",
            )
        out.append((nsp, typ, kind, ext))
    return out


def create_types(src: Conn, tgt: Conn, types: Iterable[MissingType]) -> None:
    """Create what :func:`missing_types` found: extensions (which may fail) first, enums."""
    for nsp, typ, _kind, ext in sorted(types, key=lambda t: t[3] is None):
        if ext:
            _create_extension(tgt, ext, nsp, typ)
        else:
            _create_enum(src, tgt, nsp, typ)


def _create_extension(tgt: Conn, ext: str, nsp: str, typ: str) -> None:
    qual = quote_qual(nsp, typ)
    try:
        # In the type's schema: with search_path pinned to pg_catalog (pgconn), the
        # default would be pg_catalog, where nothing may be created.
        ensure_schemas(tgt, [nsp])
        tgt.execute(
            sql.SQL("CREATE EXTENSION IF NOT EXISTS {} SCHEMA {}").format(
                sql.Identifier(ext), sql.Identifier(nsp)
            )
        )
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0]
        raise BootstrapRefused(
            f"type {qual} (extension {ext}) is missing on the target and CREATE EXTENSION "
            f"failed: {first}",
            hint=f"install extension {ext} on the target server and rerun",
        ) from None
    log.info("extension created on the target", extra={"ctx": {"extension": ext}})


def _create_enum(src: Conn, tgt: Conn, nsp: str, typ: str) -> None:
    labels = [
        r[0]
        for r in src.execute(
            "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s::regtype ORDER BY enumsortorder",
            (quote_qual(nsp, typ),),
        ).fetchall()
    ]
    ensure_schemas(tgt, [nsp])
    tgt.execute(
        sql.SQL("CREATE TYPE {} AS ENUM ({})").format(
            sql.Identifier(nsp, typ), sql.SQL(", ").join(sql.Literal(x) for x in labels)
        )
    )
    log.info("enum type created on the target", extra={"ctx": {"type": f"{nsp}.{typ}"}})
