"""What each command needs of the role it connects as, checked before it changes anything.

Why
===

A privilege found missing half-way is the worst time to find it: a bootstrap
had created its slot (holding WAL on the source) and the applier schema when
``permission denied for sequence ...`` ended it with a traceback and exit 1,
so systemd restarted it into the same wall. So every command that writes
asks both servers first, with ``pg_catalog.has_*_privilege`` in one query per
server, collects *every* privilege its roles lack and refuses once, in one
line giving the GRANT statements to run (identifiers quoted), with exit 3
(:class:`MissingPrivileges`): a person must grant, a restart cannot.

The table
=========

:data:`NEEDS` says, per command, what is checked on which server; the
README's "Privileges" section is the same list in words
(``tests/test_privileges_table.py`` holds them together). The objects come
from the command (:class:`Scope`): the included tables and their sequences
(as the bootstrap's discovery finds them), the target tables it will create.
A superuser has every privilege (``has_*_privilege`` says so), and the
owner of an object every privilege on it.

Not checked here: the source's ``REPLICATION`` for ``run`` (its only source
connection is the replication connection, refused without it, with its
own error), per-table write privileges for ``run`` (the tables arrive with
the stream; the target's refusal is an apply error naming the table), and
what a trigger or a foreign key on a target table may need.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import psycopg
from psycopg import sql

from .errors import PermanentError

Conn = psycopg.Connection[Any]
Rel = tuple[str, str]
Side = Literal["source", "target"]


class MissingPrivileges(PermanentError):
    """A role lacks privileges a command needs; the hint gives the GRANTs (exit 3)."""


@dataclass(frozen=True)
class Need:
    """One kind of privilege, on one server; ``text`` is the README's wording."""

    side: Side
    key: str
    text: str
    functions: tuple[str, ...] = ()


REPLICATION = Need("source", "replication", "`REPLICATION` (or superuser), for the slot")
SOURCE_SCHEMAS = Need("source", "schema_usage", "`USAGE` on the schema of each included table")
SOURCE_TABLES = Need(
    "source", "table_select", "`SELECT` on each included table (partitions and parents too)"
)
SOURCE_SEQUENCES = Need(
    "source",
    "sequence_select",
    "`SELECT` on each sequence an included table owns or calls in a default",
)
APPLIER_SCHEMA = Need(
    "target",
    "applier_schema",
    "`CREATE` on the database while the `applier` schema does not exist (the migrations "
    "create it); once it does, `USAGE` on it, `SELECT, INSERT, UPDATE, DELETE` on its "
    "tables and `USAGE` on its sequences",
)
TARGET_CREATE = Need(
    "target",
    "create",
    "`CREATE` on the schema of each table and enum type it creates (on the database, "
    "for a schema it creates)",
)
TARGET_COPY = Need(
    "target",
    "table_copy",
    "`USAGE` on the schema and `SELECT, INSERT` on each included table the target has "
    "already (`TRUNCATE` too with `--truncate`)",
)
TARGET_SELECT = Need(
    "target", "table_select", "`USAGE` on the schema and `SELECT` on each included table"
)
TARGET_SEQUENCES = Need(
    "target",
    "sequence_update",
    "`UPDATE` on each sequence of the included tables the target has (setval)",
)
REPLICA_ROLE = Need(
    "target", "replica_role", "`SET` on the parameter `session_replication_role` (15+)"
)

_RUN_FUNCTIONS = (
    "pg_replication_origin_create(text)",
    "pg_replication_origin_session_setup(text)",
    "pg_replication_origin_session_reset()",
    "pg_replication_origin_session_progress(boolean)",
    "pg_replication_origin_xact_setup(pg_lsn, timestamptz)",
    "pg_replication_origin_xact_reset()",
    "pg_replication_origin_advance(text, pg_lsn)",
    "pg_replication_origin_progress(text, boolean)",
)


def _origin_functions(*names: str) -> Need:
    listed = ", ".join(f"`{n}`" for n in names)
    return Need("target", "origin_functions", f"`EXECUTE` on {listed}", names)


_RUN = (APPLIER_SCHEMA, _origin_functions(*_RUN_FUNCTIONS), REPLICA_ROLE)
_SEQUENCES = (SOURCE_SCHEMAS, SOURCE_SEQUENCES, TARGET_SEQUENCES)

#: What each command checks, in the order the README lists it.
NEEDS: dict[str, tuple[Need, ...]] = {
    "bootstrap": (
        REPLICATION, SOURCE_SCHEMAS, SOURCE_TABLES, SOURCE_SEQUENCES,
        APPLIER_SCHEMA, TARGET_CREATE, TARGET_COPY, TARGET_SEQUENCES,
        _origin_functions(
            "pg_replication_origin_create(text)", "pg_replication_origin_advance(text, pg_lsn)"
        ),
        REPLICA_ROLE,
    ),
    "run": _RUN,
    "sync-tables": (
        REPLICATION, SOURCE_SCHEMAS, SOURCE_TABLES, SOURCE_SEQUENCES,
        APPLIER_SCHEMA, TARGET_CREATE, TARGET_COPY, TARGET_SEQUENCES,
        _origin_functions(*_RUN_FUNCTIONS, "pg_replication_origin_drop(text)"),
        REPLICA_ROLE,
    ),
    "sync-sequences": _SEQUENCES,
    "cutover": (*_SEQUENCES, *_RUN),
    "verify": (
        SOURCE_SCHEMAS, SOURCE_TABLES, TARGET_SELECT,
        _origin_functions("pg_replication_origin_progress(text, boolean)"),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Scope:
    """The objects a command works on (names as on the source; the target's are the same)."""

    #: The included tables (with partition parents), and their sequences.
    tables: Sequence[Rel] = ()
    sequences: Sequence[Rel] = ()
    #: Schemas the command creates tables or enum types in, on the target.
    create_in: Iterable[str] = ()
    truncate: bool = False


@dataclass(frozen=True)
class Probe:
    """One privilege: a boolean expression (true when held) and how to grant it."""

    expr: str  # with %s placeholders for ``params``
    params: tuple[Any, ...]
    privilege: str  # "SELECT", "SELECT, INSERT", "REPLICATION", ...
    kind: str  # "TABLE", "SEQUENCE", "SCHEMA", "FUNCTION", "DATABASE", "PARAMETER", "ROLE"
    obj: str  # as the GRANT names it (quoted)


@dataclass
class _Facts:
    """What one server has, read before the probes are made."""

    role: str
    database: str
    server_version: int
    schemas: set[str] = field(default_factory=set)
    relations: set[Rel] = field(default_factory=set)  # of the scope's, those that exist
    applier_tables: list[Rel] = field(default_factory=list)
    applier_sequences: list[Rel] = field(default_factory=list)
    has_applier: bool = False


def _qual(rel: Rel) -> str:
    return sql.Identifier(*rel).as_string(None)


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _table(privs: Iterable[str], rel: Rel, kind: str = "TABLE") -> Probe:
    fn = "has_sequence_privilege" if kind == "SEQUENCE" else "has_table_privilege"
    privs = list(privs)
    expr = " AND ".join(
        f"pg_catalog.{fn}(%s::pg_catalog.regclass, '{p}')"
        for p in privs  # our own constants, never input
    )
    return Probe(expr, tuple(_qual(rel) for _ in privs), ", ".join(privs), kind, _qual(rel))


def _schema(priv: str, name: str) -> Probe:
    return Probe(
        f"pg_catalog.has_schema_privilege(%s, '{priv}')", (name,), priv, "SCHEMA", _ident(name)
    )


def _database_create(f: _Facts) -> Probe:
    return Probe(
        "pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')",
        (), "CREATE", "DATABASE", _ident(f.database),
    )  # fmt: skip


def _probes(need: Need, scope: Scope, f: _Facts) -> list[Probe]:
    """The probes of one need against what the server has."""
    schemas = sorted({s for s, _ in scope.tables})
    here = [t for t in scope.tables if t in f.relations]
    if need.key == "replication":
        return [
            Probe(
                "(SELECT rolreplication OR rolsuper FROM pg_catalog.pg_roles "
                "WHERE rolname = current_user)",
                (), "REPLICATION", "ROLE", _ident(f.role),
            )
        ]  # fmt: skip
    if need.key == "schema_usage":
        return [_schema("USAGE", s) for s in schemas]
    if need.key == "table_select":
        on = scope.tables if need.side == "source" else here
        return [
            _schema("USAGE", s) for s in sorted({s for s, _ in on}) if need.side == "target"
        ] + [_table(["SELECT"], t) for t in on]
    if need.key == "sequence_select":
        return [_table(["SELECT"], s, "SEQUENCE") for s in scope.sequences]
    if need.key == "sequence_update":
        return [_table(["UPDATE"], s, "SEQUENCE") for s in scope.sequences if s in f.relations]
    if need.key == "table_copy":
        privs = ["SELECT", "INSERT", *(["TRUNCATE"] if scope.truncate else [])]
        usage = [_schema("USAGE", s) for s in sorted({s for s, _ in here})]
        return usage + [_table(privs, t) for t in here]
    if need.key == "create":
        wanted = sorted(set(scope.create_in))
        out = [_schema("CREATE", s) for s in wanted if s in f.schemas]
        if any(s not in f.schemas for s in wanted):
            out.append(_database_create(f))
        return out
    if need.key == "applier_schema":
        if not f.has_applier:
            return [_database_create(f)]
        # One GRANT ... ON ALL ... IN SCHEMA for all of them, not a list of its tables.
        dml = ["SELECT", "INSERT", "UPDATE", "DELETE"]
        every = {"kind": "ALL TABLES IN SCHEMA", "obj": _ident("applier")}
        seqs = {"kind": "ALL SEQUENCES IN SCHEMA", "obj": _ident("applier")}
        return [
            _schema("USAGE", "applier"),
            *(replace(_table(dml, t), **every) for t in f.applier_tables),
            *(replace(_table(["USAGE"], s, "SEQUENCE"), **seqs) for s in f.applier_sequences),
        ]
    if need.key == "origin_functions":
        return [
            Probe(
                "pg_catalog.has_function_privilege(%s, 'EXECUTE')",
                (f"pg_catalog.{fn}",), "EXECUTE", "FUNCTION", f"pg_catalog.{fn}",
            )
            for fn in need.functions
        ]  # fmt: skip
    if need.key == "replica_role":
        if f.server_version < 150000:  # no GRANT SET ON PARAMETER before 15: superuser only
            return [Probe("(SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)",
                          (), "SUPERUSER", "ROLE", _ident(f.role))]  # fmt: skip
        return [
            Probe(
                "pg_catalog.has_parameter_privilege('session_replication_role', 'SET')",
                (), "SET", "PARAMETER", "session_replication_role",
            )
        ]  # fmt: skip
    raise AssertionError(f"unknown need {need.key}")


_FACTS = """
SELECT current_user, pg_catalog.current_database(),
  pg_catalog.current_setting('server_version_num')::int,
  ARRAY(SELECT nspname::text FROM pg_catalog.pg_namespace),
  ARRAY(SELECT x FROM pg_catalog.unnest(%s::text[]) x WHERE pg_catalog.to_regclass(x) IS NOT NULL),
  ARRAY(SELECT c.relname::text || '.' || c.relkind::text FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'applier' AND c.relkind IN ('r', 'p', 'S') ORDER BY 1)
"""


def _facts(conn: Conn, scope: Scope) -> _Facts:
    rels = {_qual(t): t for t in (*scope.tables, *scope.sequences)}
    row = conn.execute(_FACTS, (list(rels),)).fetchone()
    assert row is not None
    applier = [tuple(x.rsplit(".", 1)) for x in row[5]]
    return _Facts(
        role=str(row[0]),
        database=str(row[1]),
        server_version=int(row[2]),
        schemas=set(row[3]),
        relations={rels[x] for x in row[4]},
        applier_tables=[("applier", n) for n, k in applier if k in ("r", "p")],
        applier_sequences=[("applier", n) for n, k in applier if k == "S"],
        has_applier="applier" in set(row[3]),
    )


def missing(conn: Conn, needs: Iterable[Need], scope: Scope) -> tuple[str, list[Probe]]:
    """The role's name and the probes of ``needs`` it fails, in one query."""
    f = _facts(conn, scope)
    probes = list({p: None for n in needs for p in _probes(n, scope, f)})
    if not probes:
        return f.role, []
    q = "SELECT " + ", ".join(f"coalesce({p.expr}, false)" for p in probes)
    params = [x for p in probes for x in p.params]
    row = conn.execute(q, params).fetchone()
    assert row is not None
    return f.role, [p for p, ok in zip(probes, row, strict=True) if not ok]


def grants(role: str, lacking: list[Probe]) -> list[str]:
    """GRANT (and ALTER ROLE) statements giving ``role`` what it lacks, one per kind."""
    who = _ident(role)
    groups: dict[tuple[str, str], list[str]] = {}
    for p in lacking:
        groups.setdefault((p.privilege, p.kind), []).append(p.obj)
    out = []
    for (priv, kind), objs in groups.items():
        if kind == "ROLE":
            out.append(f"ALTER ROLE {who} {priv};")
        else:
            out.append(f"GRANT {priv} ON {kind} {', '.join(dict.fromkeys(objs))} TO {who};")
    return out


def check(
    command: str, scope: Scope, *, source: Conn | None = None, target: Conn | None = None
) -> None:
    """Refuse (:class:`MissingPrivileges`) if a role lacks what ``command`` needs."""
    given: list[tuple[Side, Conn | None]] = [("source", source), ("target", target)]
    sides = [(side, c) for side, c in given if c is not None]
    lacks: list[tuple[Side, str, list[Probe]]] = []
    for side, conn in sides:
        needs = [n for n in NEEDS[command] if n.side == side]
        role, failed = missing(conn, needs, scope)
        if failed:
            lacks.append((side, role, failed))
    if not lacks:
        return
    who = " and ".join(f"the {side} role {_ident(role)}" for side, role, _ in lacks)
    todo = " and ".join(
        f"on the {side}: {' '.join(grants(role, failed))}" for side, role, failed in lacks
    )
    raise MissingPrivileges(
        f"applier {command}: {who} lack{'s' if len(lacks) == 1 else ''} privileges it needs "
        "(see the README, 'Privileges')",
        hint=f"as a superuser or the objects' owner, run {todo}",
    )


def describe() -> list[str]:
    """The README's list of what is checked (tests hold the README to it)."""
    out, seen = [], set()
    for needs in NEEDS.values():
        for n in needs:
            if (n.side, n.key) not in seen and not n.functions:
                seen.add((n.side, n.key))
                out.append(f"- {n.side}, *{_label(n)}*: {n.text}.")
    out.append(
        "- target, *origin functions*: `EXECUTE` on the `pg_replication_origin_*` functions "
        "the command calls (the table's last column)."
    )
    out += ["", "| command | source | target | origin functions |", "|---|---|---|---|"]
    for command, needs in NEEDS.items():
        cells = [
            ", ".join(_label(n) for n in needs if n.side == side and not n.functions) or "-"
            for side in ("source", "target")
        ]
        fns = ", ".join(f"`{f.split('(')[0].removeprefix('pg_replication_origin_')}`"
                        for n in needs for f in n.functions)  # fmt: skip
        out.append(f"| `{command}` | {cells[0]} | {cells[1]} | {fns or '-'} |")
    return out


def _label(n: Need) -> str:
    return n.key.replace("_", " ")
