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
README's "Privileges" section is :func:`describe`'s text (a test in
``tests/bootstrap/test_privileges.py`` holds them together). The objects come
from :func:`scope_of`: the published, included tables with their partition
trees and sequences, as the bootstrap's discovery finds them but by OID
(naming a table needs ``USAGE`` on its schema, which may be what is lacking).
A superuser has every privilege (``has_*_privilege`` says so), and the
owner of an object every privilege on it.

Not checked here: the source's ``REPLICATION`` for ``run`` (its only source
connection is the replication connection, refused without it, with its
own error), per-table write privileges for ``run`` (the tables arrive with
the stream; the target's refusal is an apply error naming the table), an
enum type's schema that holds no included table, and what a trigger or a
foreign key on a target table may need.
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
    "`CREATE` on the schema of each included table the target lacks (it creates them; "
    "on the database when that schema is missing too)",
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
# Large objects (applier.largeobjects): read with lo_get, which checks SELECT on each.
SOURCE_LARGE_OBJECTS = Need(
    "source",
    "large_object_select",
    "`SELECT` on each large object (`GRANT SELECT ON LARGE OBJECT ...`, or "
    "`lo_compat_privileges` on for the role, which skips the checks)",
)
TARGET_LARGE_OBJECTS = Need(
    "target", "large_object_select", "`SELECT` on each large object the target has (as above)"
)
LARGE_OBJECT_OWNERS = Need(
    "target",
    "large_object_owners",
    "membership in each role that owns a source large object or granted a privilege on "
    "one (`GRANT owner TO applier`: it gives each copy its owner and ACL; a superuser "
    "has it)",
)

# DDL capture on the source (applier.ddl): event triggers are a superuser's alone
# (checked on 15, 17 and 18: "Must be superuser to create an event trigger").
SOURCE_SUPERUSER = Need(
    "source",
    "superuser",
    "PostgreSQL (15 to 18) lets only a superuser create or drop an event trigger",
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
        SOURCE_LARGE_OBJECTS,
        APPLIER_SCHEMA, TARGET_CREATE, TARGET_COPY, TARGET_SEQUENCES,
        _origin_functions(
            "pg_replication_origin_create(text)", "pg_replication_origin_advance(text, pg_lsn)"
        ),
        REPLICA_ROLE, LARGE_OBJECT_OWNERS,
    ),
    "run": _RUN,
    "sync-tables": (
        REPLICATION, SOURCE_SCHEMAS, SOURCE_TABLES, SOURCE_SEQUENCES,
        APPLIER_SCHEMA, TARGET_CREATE, TARGET_COPY, TARGET_SEQUENCES,
        _origin_functions(*_RUN_FUNCTIONS, "pg_replication_origin_drop(text)"),
        REPLICA_ROLE,
    ),
    "sync-sequences": _SEQUENCES,
    "cutover": (*_SEQUENCES, SOURCE_LARGE_OBJECTS, *_RUN, LARGE_OBJECT_OWNERS),
    "verify": (
        SOURCE_SCHEMAS, SOURCE_TABLES, SOURCE_LARGE_OBJECTS, TARGET_SELECT, TARGET_LARGE_OBJECTS,
        _origin_functions("pg_replication_origin_progress(text, boolean)"),
    ),
    "ddl install": (SOURCE_SUPERUSER,),
    "ddl uninstall": (SOURCE_SUPERUSER,),
    "ddl run": (),  # EXECUTE on applier_ddl.emit_run, checked by ddl run itself
}  # fmt: skip


@dataclass(frozen=True)
class Scope:
    """The objects a command works on (names as on the source; the target's are the same).

    Build it with :func:`scope_of`: by OID, so that a role without ``USAGE``
    on a schema is told so instead of failing to name the schema's tables.
    """

    #: The included tables (with partitions and parents), and their sequences.
    tables: Sequence[Rel] = ()
    sequences: Sequence[Rel] = ()
    #: The command creates the included tables the target lacks.
    creates: bool = False
    truncate: bool = False
    #: The command reads large objects (``[bootstrap] large_objects = false``: not)
    #: and the roles that own a source large object or granted a privilege on one.
    large_objects: bool = True
    large_object_roles: Sequence[str] = ()


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
    #: The OIDs of the scope's relations (and the applier schema's) that exist here.
    oids: dict[Rel, int] = field(default_factory=dict)
    applier_tables: list[Rel] = field(default_factory=list)
    applier_sequences: list[Rel] = field(default_factory=list)

    @property
    def has_applier(self) -> bool:
        return "applier" in self.schemas


def _qual(rel: Rel) -> str:
    return sql.Identifier(*rel).as_string(None)


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _table(privs: Iterable[str], rel: Rel, oid: int, kind: str = "TABLE") -> Probe:
    # By OID: a name would need USAGE on its schema to be looked up at all.
    fn = "has_sequence_privilege" if kind == "SEQUENCE" else "has_table_privilege"
    privs = list(privs)
    expr = " AND ".join(
        f"pg_catalog.{fn}(%s::pg_catalog.oid, '{p}')"
        for p in privs  # our own constants, never input
    )
    return Probe(expr, tuple(oid for _ in privs), ", ".join(privs), kind, _qual(rel))


def _schema(priv: str, name: str) -> Probe:
    return Probe(
        f"pg_catalog.has_schema_privilege(%s, '{priv}')", (name,), priv, "SCHEMA", _ident(name)
    )


def _database_create(f: _Facts) -> Probe:
    return Probe(
        "pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')",
        (), "CREATE", "DATABASE", _ident(f.database),
    )  # fmt: skip


def _usage(rels: Iterable[Rel]) -> list[Probe]:
    return [_schema("USAGE", s) for s in sorted({s for s, _ in rels})]


def _probes(need: Need, scope: Scope, f: _Facts) -> list[Probe]:
    """The probes of one need against what the server has."""
    here = [t for t in scope.tables if t in f.oids]
    seqs = [s for s in scope.sequences if s in f.oids]
    if need.key == "replication":
        return [
            Probe(
                "(SELECT rolreplication OR rolsuper FROM pg_catalog.pg_roles "
                "WHERE rolname = current_user)",
                (), "REPLICATION", "ROLE", _ident(f.role),
            )
        ]  # fmt: skip
    if need.key == "schema_usage":
        return _usage(here)
    if need.key == "table_select":
        return _usage(here) + [_table(["SELECT"], t, f.oids[t]) for t in here]
    if need.key == "sequence_select":
        return [_table(["SELECT"], s, f.oids[s], "SEQUENCE") for s in seqs]
    if need.key == "sequence_update":
        return [_table(["UPDATE"], s, f.oids[s], "SEQUENCE") for s in seqs]
    if need.key == "table_copy":
        privs = ["SELECT", "INSERT", *(["TRUNCATE"] if scope.truncate else [])]
        return _usage(here) + [_table(privs, t, f.oids[t]) for t in here]
    if need.key == "create":
        wanted = sorted(
            {s for s, n in scope.tables if (s, n) not in f.oids} if scope.creates else ()
        )
        out = [_schema("CREATE", s) for s in wanted if s in f.schemas]
        if any(s not in f.schemas for s in wanted):
            out.append(_database_create(f))
        return out
    if need.key == "applier_schema":
        if not f.has_applier:
            return [_database_create(f)]
        # One GRANT ... ON ALL ... IN SCHEMA for all of them, not a list of its tables.
        dml = ["SELECT", "INSERT", "UPDATE", "DELETE"]
        schema = _ident("applier")
        return [
            _schema("USAGE", "applier"),
            *(
                replace(_table(dml, t, f.oids[t]), kind="ALL TABLES IN SCHEMA", obj=schema)
                for t in f.applier_tables
            ),
            *(
                replace(
                    _table(["USAGE"], s, f.oids[s], "SEQUENCE"),
                    kind="ALL SEQUENCES IN SCHEMA",
                    obj=schema,
                )
                for s in f.applier_sequences
            ),
        ]
    if need.key == "origin_functions":
        return [
            Probe(
                "pg_catalog.has_function_privilege(%s, 'EXECUTE')",
                (f"pg_catalog.{fn}",), "EXECUTE", "FUNCTION", f"pg_catalog.{fn}",
            )
            for fn in need.functions
        ]  # fmt: skip
    if need.key == "large_object_select":
        return [_large_object_select(f)] if scope.large_objects else []
    if need.key == "large_object_owners":
        return [_member(role, f) for role in scope.large_object_roles]
    if need.key == "superuser":
        return [_superuser(f)]
    if need.key == "replica_role":
        if f.server_version < 150000:  # no GRANT SET ON PARAMETER before 15: superuser only
            return [_superuser(f)]
        return [
            Probe(
                "pg_catalog.has_parameter_privilege('session_replication_role', 'SET')",
                (), "SET", "PARAMETER", "session_replication_role",
            )
        ]  # fmt: skip
    raise AssertionError(f"unknown need {need.key}")


def _superuser(f: _Facts) -> Probe:
    return Probe(
        "(SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)",
        (), "SUPERUSER", "ROLE", _ident(f.role),
    )  # fmt: skip


#: Every large object readable: lo_compat_privileges, superuser, or SELECT through
#: its ACL (NULL: the owner's default) granted to PUBLIC or to a role we act as.
_LARGE_OBJECTS_READABLE = """(
  pg_catalog.current_setting('lo_compat_privileges')::bool
  OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
  OR NOT EXISTS (
    SELECT 1 FROM pg_catalog.pg_largeobject_metadata m
    WHERE NOT EXISTS (
      SELECT 1 FROM pg_catalog.aclexplode(
        coalesce(m.lomacl, pg_catalog.acldefault('L', m.lomowner))) a
      WHERE a.privilege_type = 'SELECT'
        AND (a.grantee = 0 OR pg_catalog.pg_has_role(a.grantee, 'USAGE')))))"""


def _large_object_select(f: _Facts) -> Probe:
    # One probe, not one per object: a GRANT per object could be millions of
    # them; the role setting is one line (run as a superuser; a pinned session
    # keeps it, applier.pgconn pins no such setting).
    return Probe(
        _LARGE_OBJECTS_READABLE, (), "SET lo_compat_privileges = on", "ROLE", _ident(f.role)
    )


#: A member of the role (16+: with SET, which ALTER ... OWNER TO asks); true for a
#: role the target lacks: the copy's own check names it (create it).
_MEMBER = (
    "coalesce((SELECT pg_catalog.pg_has_role(r.oid, 'USAGE') "
    "FROM pg_catalog.pg_roles r WHERE r.rolname = %s), true)"
)
_MEMBER_16 = (
    "coalesce((SELECT pg_catalog.pg_has_role(r.oid, 'USAGE') "
    "AND pg_catalog.pg_has_role(r.oid, 'SET') "
    "FROM pg_catalog.pg_roles r WHERE r.rolname = %s), true)"
)


def _member(role: str, f: _Facts) -> Probe:
    expr = _MEMBER_16 if f.server_version >= 160000 else _MEMBER
    return Probe(expr, (role,), "", "MEMBERSHIP", _ident(role))


_FACTS = """
SELECT current_user, pg_catalog.current_database(),
  pg_catalog.current_setting('server_version_num')::int,
  ARRAY(SELECT nspname::text FROM pg_catalog.pg_namespace)
"""

#: The OIDs of named relations and of the applier schema's, from the catalogs
#: (a cast to regclass would need USAGE on the schema).
_OIDS = """
SELECT n.nspname, c.relname, c.oid, c.relkind
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE (n.nspname::text, c.relname::text) IN
      (SELECT * FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[])))
   OR (n.nspname = 'applier' AND c.relkind IN ('r', 'p', 'S'))
ORDER BY 1, 2
"""


def _facts(conn: Conn, scope: Scope) -> _Facts:
    row = conn.execute(_FACTS).fetchone()
    assert row is not None
    named = [*scope.tables, *scope.sequences]
    rows = conn.execute(_OIDS, ([s for s, _ in named], [n for _, n in named])).fetchall()
    ours = [r for r in rows if r[0] == "applier"]
    return _Facts(
        role=str(row[0]),
        database=str(row[1]),
        server_version=int(row[2]),
        schemas=set(row[3]),
        oids={(r[0], r[1]): int(r[2]) for r in rows},
        applier_tables=[(r[0], r[1]) for r in ours if r[3] in ("r", "p")],
        applier_sequences=[(r[0], r[1]) for r in ours if r[3] == "S"],
    )


#: The tables' partition trees (down and up) and the sequences they own or call
#: in a default, as bootstrap's discovery and ``sequences_of`` find them, but by
#: OID only: a role without USAGE on a schema can still be told what it lacks.
_SCOPE = """
WITH RECURSIVE start AS (
  SELECT c.oid
  FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[])) AS x(nsp, rel)
  JOIN pg_catalog.pg_namespace n ON n.nspname::text = x.nsp
  JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname::text = x.rel
), down(oid) AS (
  SELECT oid FROM start
  UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN down d ON i.inhparent = d.oid
  JOIN pg_catalog.pg_class ch ON ch.oid = i.inhrelid AND ch.relispartition
), up(oid) AS (
  SELECT oid FROM start
  UNION SELECT i.inhparent FROM pg_catalog.pg_inherits i JOIN up u ON i.inhrelid = u.oid
  JOIN pg_catalog.pg_class ch ON ch.oid = i.inhrelid AND ch.relispartition
), rels AS (SELECT oid FROM down UNION SELECT oid FROM up)
SELECT n.nspname, c.relname, c.relkind = 'S' FROM (
  SELECT oid FROM rels
  UNION
  SELECT d.objid FROM pg_catalog.pg_depend d
  WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
    AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
    AND d.refobjid IN (SELECT oid FROM rels) AND d.deptype IN ('a', 'i')
  UNION
  SELECT d.refobjid FROM pg_catalog.pg_attrdef ad
  JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass
    AND d.objid = ad.oid AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
  WHERE ad.adrelid IN (SELECT oid FROM rels)
) x JOIN pg_catalog.pg_class c ON c.oid = x.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'S') ORDER BY 1, 2
"""


def scope_of(
    src: Conn,
    tables: Iterable[Rel],
    *,
    creates: bool = False,
    truncate: bool = False,
    large_objects: bool = True,
) -> Scope:
    """The scope of ``tables`` (as published): with their partition trees and sequences,
    and (``large_objects``) the roles of the source's large objects."""
    names = list(tables)
    rows = src.execute(_SCOPE, ([s for s, _ in names], [n for _, n in names])).fetchall()
    return Scope(
        tables=[(r[0], r[1]) for r in rows if not r[2]],
        sequences=[(r[0], r[1]) for r in rows if r[2]],
        creates=creates,
        truncate=truncate,
        large_objects=large_objects,
        large_object_roles=[str(r[0]) for r in src.execute(_LARGE_OBJECT_ROLES).fetchall()]
        if large_objects
        else [],
    )


_LARGE_OBJECT_ROLES = """
SELECT pg_catalog.pg_get_userbyid(m.lomowner)::text FROM pg_catalog.pg_largeobject_metadata m
UNION
SELECT pg_catalog.pg_get_userbyid(a.grantor)::text
FROM pg_catalog.pg_largeobject_metadata m, pg_catalog.aclexplode(m.lomacl) a
ORDER BY 1
"""


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
        elif kind == "MEMBERSHIP":
            out.append(f"GRANT {', '.join(dict.fromkeys(objs))} TO {who};")
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
