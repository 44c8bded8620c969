"""Source relation -> target table: columns by name, types checked, identity resolved.

Mapping
=======

A pgoutput Relation message describes a source table as the walsender sees
it at that point of the stream. The target table is found by the same
``schema.table`` name; columns are matched by name, so column order may
differ and the target may have extra columns (they get their defaults on
INSERT and are left alone by UPDATE). What the target lacks is a
:class:`~applier.errors.SchemaMismatch` naming the table and the column,
raised when the first change for the table arrives (the change's LSN and xid
are then known), so the worker stops before applying anything of that
transaction.

Types: values travel as the text (or binary) the source's output functions
produced and are parsed by the *target's* input functions, with each
parameter typed by the target column's type OID (OIDs of non-built-in types
differ between clusters, so never the source's). A type is accepted when it
is the same type (same built-in OID, or for non-built-in types the same
``schema.name`` from the Type message), when the target column is a string
type, or when the target has a cast from the source's built-in type. Binary
values need the very same type on both sides, and no user-defined composite
in it (:meth:`Catalog.binary_in_doubt`: its members are read by the target's
member types, unchecked for user-defined ones); arrays of enums and domains
are fine in binary although their OIDs differ between clusters.

Each mapping gets a fresh ``version`` number; the planner's prepared
statement names include it, so a Relation message that changes a table's
shape mid-stream yields new statements and the old ones are never reused.

Comparisons: REPLICA IDENTITY FULL locates rows by every column of the old
row. Types without a default btree or hash operator class (json, point, xml,
arrays or composites of them) cannot use ``=``, so :class:`TargetColumn`
records ``has_eq`` and the planner compares those as ``::text``. Whether an
index could locate a row (:attr:`TargetTable.locatable`) decides whether a
FULL table's changes go one statement each or held together
(:func:`full_batchable`, :mod:`applier.apply.batching.fullident`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from applier.errors import SchemaMismatch
from applier.protocol import Column, Relation

#: First OID of user-defined objects; lower OIDs are the same on every cluster.
FIRST_NORMAL_OID = 16384

_versions = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TargetColumn:
    name: str
    type_oid: int
    type_sql: str  # format_type(), for messages
    has_eq: bool
    generated: bool
    #: GENERATED ALWAYS AS IDENTITY: an INSERT sets it with OVERRIDING SYSTEM VALUE,
    #: an UPDATE may not set it at all (SQLSTATE 428C9).
    identity_always: bool = False
    #: The type modifier (``atttypmod``: a length, a precision; -1 none).
    typmod: int = -1
    #: NOT NULL without a default (nor identity, nor generated): an INSERT must set it.
    required: bool = False


@dataclass(frozen=True, slots=True)
class TargetTable:
    oid: int
    schema: str
    name: str
    relkind: str  # 'r' table, 'p' partitioned table
    columns: dict[str, TargetColumn]
    #: Row-level security enabled: COPY FROM refuses such tables where RLS applies.
    rls: bool = False
    #: Something fires on its changes under ``session_replication_role = replica``
    #: (an ENABLE ALWAYS/REPLICA trigger or rule): it sees the order of changes.
    observed: bool = False
    #: Column names of each unique index and exclusion constraint (None: an
    #: expression or partial index).
    unique_sets: tuple[frozenset[str] | None, ...] = ()
    #: An index could locate a row by column values (btree or hash, not partial,
    #: its first column a plain column): REPLICA IDENTITY FULL goes row by row.
    locatable: bool = False

    @property
    def partitioned(self) -> bool:
        return self.relkind == "p"


@dataclass(frozen=True, slots=True)
class RelMap:
    """How the changes of one source relation are applied (or skipped)."""

    relation: Relation
    version: int
    included: bool
    target: TargetTable | None
    #: Per source column: the target column it goes to.
    columns: tuple[TargetColumn, ...]
    #: Source column indexes of the replica identity (DEFAULT/INDEX).
    key: tuple[int, ...]
    #: UPDATEs that keep the key may be merged per key (see :mod:`applier.apply.batching.merge`).
    merge: bool = False
    #: REPLICA IDENTITY FULL changes may be held and sent in one statement
    #: (see :mod:`applier.apply.batching.fullident`).
    full_batch: bool = False
    #: The table's conflict policies, None when they are the built-in ones
    #: (:mod:`applier.apply.rules.policies`).
    policy: Any = None

    @property
    def qualname(self) -> str:
        return f"{self.relation.namespace}.{self.relation.name}"

    @property
    def replident(self) -> str:
        return self.relation.replident


def skipped(relation: Relation) -> RelMap:
    return RelMap(relation, next(_versions), False, None, (), ())


def build(
    relation: Relation,
    target: TargetTable | None,
    accepts: dict[int, bool] | None = None,
    type_names: dict[int, tuple[str, str]] | None = None,
    column_type: Callable[[Column], str] | None = None,
) -> RelMap:
    """Map an included relation onto its target table, or raise SchemaMismatch.

    ``accepts[i]`` (from :meth:`Catalog.accepts`) says whether the target
    column of source column ``i`` can take the source's type; missing means yes.
    ``column_type`` spells a source column's type in SQL, for the hint of a
    missing column (:meth:`Catalog.source_type_sql`).
    """
    name = f"{relation.namespace}.{relation.name}"
    if target is None:
        raise SchemaMismatch(
            f"table {name} does not exist on the target",
            table=name,
            hint="create it on the target (same schema and name) and restart applier run",
        )
    _check_missing_columns(relation, target, column_type)
    cols: list[TargetColumn] = []
    for i, col in enumerate(relation.columns):
        tc = target.columns[col.name]
        if tc.generated:
            raise SchemaMismatch(
                f"table {name}: column {col.name!r} is a generated column on the target",
                table=name,
                column=col.name,
            )
        if accepts is not None and not accepts.get(i, True):
            src = (type_names or {}).get(col.type_oid)
            src_type = f"{src[0]}.{src[1]}" if src else f"oid {col.type_oid}"
            raise SchemaMismatch(
                f"table {name}: column {col.name!r} has type {tc.type_sql} on the target, "
                f"which cannot take the source's type ({src_type})",
                table=name,
                column=col.name,
                hint="give the target column the source's type (or text) and restart applier run",
            )
        cols.append(tc)
    key = tuple(i for i, c in enumerate(relation.columns) if c.is_key)
    return RelMap(
        relation,
        next(_versions),
        True,
        target,
        tuple(cols),
        key,
        _mergeable(relation, target, cols, key),
        full_batchable(relation, target, cols),
    )


def _check_missing_columns(
    relation: Relation, target: TargetTable, column_type: Callable[[Column], str] | None
) -> None:
    """Raise SchemaMismatch naming every source column the target lacks, with the
    ALTER TABLE that adds them all (the source's types, identifiers quoted)."""
    missing = [c for c in relation.columns if c.name not in target.columns]
    if not missing:
        return
    name = f"{relation.namespace}.{relation.name}"
    names = ", ".join(repr(c.name) for c in missing)
    what = f"column {names} is" if len(missing) == 1 else f"columns {names} are"
    hint = f"add {'it' if len(missing) == 1 else 'them'} on the target"
    if column_type is not None:
        table = sql.Identifier(relation.namespace, relation.name).as_string(None)
        adds = ", ".join(
            f"ADD COLUMN {sql.Identifier(c.name).as_string(None)} {column_type(c)}" for c in missing
        )
        hint += f": ALTER TABLE {table} {adds};"
    else:
        hint += ","
    raise SchemaMismatch(
        f"table {name}: {what} missing on the target",
        table=name,
        column=missing[0].name,
        hint=f"{hint} then restart applier run",
    )


def _mergeable(
    relation: Relation, target: TargetTable, cols: list[TargetColumn], key: tuple[int, ...]
) -> bool:
    """Whether only the final state of each key matters (see :mod:`applier.apply.batching.merge`).

    Not when something on the target watches the changes one by one (a trigger or
    rule that fires for replication), when the rows are not found by a key with
    ``=``, or when a unique index or exclusion constraint other than the key's
    could be violated by an intermediate order of the rows that the source never had,
    or when the target has no unique index on the key.
    """
    if relation.replident not in "di" or not key or target.relkind != "r" or target.observed:
        return False
    if not all(cols[i].has_eq for i in key):
        return False
    # The key must be unique on the target too: a merged statement tells rows not
    # found by how many it returned, which duplicates of a key would blur.
    names = frozenset(cols[i].name for i in key)
    return bool(target.unique_sets) and all(u == names for u in target.unique_sets)


def full_batchable(relation: Relation, target: TargetTable, cols: list[TargetColumn]) -> bool:
    """Whether a table's REPLICA IDENTITY FULL changes may go in one statement
    (:mod:`applier.apply.batching.fullident`): a plain table no index can search (with one,
    a statement per change is cheap), nothing on it that could tell the order of
    the changes (trigger, rule, unique index or exclusion constraint), and ``=``
    for every column."""
    return (
        relation.replident == "f"
        and target.relkind == "r"
        and not target.observed
        and not target.unique_sets
        and not target.locatable
        and all(c.has_eq for c in cols)
    )


class Catalog:
    """Looks up target tables and types on an autocommit connection (never the apply session)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._types: dict[int, tuple[str, int, int, int, str, bool, str, str]] = {}
        self._eq: dict[int, bool] = {}
        self._casts: dict[tuple[int, int], bool] = {}
        self._binary_doubt: dict[int, bool] = {}

    def forget_cached(self) -> None:
        """Drop what was learnt of types and casts (the target's schema changed)."""
        for cache in (self._types, self._eq, self._casts, self._binary_doubt):
            cache.clear()

    def table(self, schema: str, name: str) -> TargetTable | None:
        rows = self.conn.execute(
            """
            SELECT c.oid, c.relkind::text, a.attname, a.atttypid,
                   pg_catalog.format_type(a.atttypid, a.atttypmod), a.attgenerated <> '',
                   c.relrowsecurity, a.attidentity = 'a', a.atttypmod,
                   a.attnotnull AND NOT a.atthasdef AND a.attidentity = ''
                       AND a.attgenerated = ''
              FROM pg_catalog.pg_class c
              JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              LEFT JOIN pg_catalog.pg_attribute a
                ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
             ORDER BY a.attnum
            """,
            (schema, name),
        ).fetchall()
        if not rows:
            return None
        cols = {
            str(r[2]): TargetColumn(
                str(r[2]),
                int(r[3]),
                str(r[4]),
                self.has_eq(int(r[3])),
                bool(r[5]),
                bool(r[7]),
                int(r[8]),
                bool(r[9]),
            )
            for r in rows
            if r[2] is not None
        }
        oid = int(rows[0][0])
        observed, unique_sets, locatable = self._watchers(oid)
        return TargetTable(
            oid, schema, name, str(rows[0][1]), cols, bool(rows[0][6]), observed, unique_sets,
            locatable,
        )  # fmt: skip

    def _watchers(self, oid: int) -> tuple[bool, tuple[frozenset[str] | None, ...], bool]:
        """Triggers/rules that fire for replication, the unique indexes' columns, and
        whether an index could locate a row (see :attr:`TargetTable.locatable`)."""
        row = self.conn.execute(
            """
            SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                            WHERE tgrelid = %(oid)s AND NOT tgisinternal
                              AND tgenabled IN ('A', 'R'))
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite
                            WHERE ev_class = %(oid)s AND rulename <> '_RETURN'
                              AND ev_enabled IN ('A', 'R'))
            """,
            {"oid": oid},
        ).fetchone()
        indexes = self.conn.execute(
            """
            SELECT i.indexprs IS NULL AND i.indpred IS NULL,
                   ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
                          WHERE a.attrelid = i.indrelid
                            AND a.attnum = ANY (i.indkey::pg_catalog.int2[]))
              FROM pg_catalog.pg_index i
             WHERE i.indrelid = %(oid)s AND (i.indisunique OR i.indisexclusion)
            """,
            {"oid": oid},
        ).fetchall()
        sets = tuple(frozenset(str(c) for c in r[1]) if r[0] else None for r in indexes)
        searchable = self.conn.execute(
            """
            SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                             JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
                             JOIN pg_catalog.pg_am m ON m.oid = c.relam
                            WHERE i.indrelid = %(oid)s AND i.indpred IS NULL
                              AND i.indkey[0] <> 0 AND m.amname IN ('btree', 'hash'))
            """,
            {"oid": oid},
        ).fetchone()
        return bool(row and row[0]), sets, bool(searchable and searchable[0])

    def referencing(self, oids: list[int]) -> list[tuple[str, str]]:
        """(referencing, referenced) tables of foreign keys into the tables ``oids``
        (with their partitions) from tables outside them: what TRUNCATE would cascade to."""
        rows = self.conn.execute(
            """
            WITH t(oid) AS (
                SELECT o FROM pg_catalog.unnest(%(oids)s::pg_catalog.oid[]) o
                UNION
                SELECT p.relid FROM pg_catalog.unnest(%(oids)s::pg_catalog.oid[]) o,
                       LATERAL pg_catalog.pg_partition_tree(o) p
            )
            SELECT DISTINCT rn.nspname || '.' || r.relname, fn.nspname || '.' || f.relname
              FROM pg_catalog.pg_constraint c
              JOIN pg_catalog.pg_class r ON r.oid = c.conrelid
              JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
              JOIN pg_catalog.pg_class f ON f.oid = c.confrelid
              JOIN pg_catalog.pg_namespace fn ON fn.oid = f.relnamespace
             WHERE c.contype = 'f' AND c.confrelid IN (SELECT oid FROM t)
               AND c.conrelid NOT IN (SELECT oid FROM t)
             ORDER BY 1, 2
            """,
            {"oids": oids},
        ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def _type(self, oid: int) -> tuple[str, int, int, int, str, bool, str, str]:
        t = self._types.get(oid)
        if t is None:
            row = self.conn.execute(
                """
                SELECT t.typtype::text, t.typelem, t.typbasetype, t.typrelid,
                       t.typcategory::text,
                       EXISTS (SELECT 1 FROM pg_catalog.pg_opclass o
                                 JOIN pg_catalog.pg_am m ON m.oid = o.opcmethod
                                WHERE o.opcdefault AND m.amname IN ('btree', 'hash')
                                  AND o.opcintype = t.oid),
                       n.nspname, t.typname
                  FROM pg_catalog.pg_type t
                  JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
                 WHERE t.oid = %s
                """,
                (oid,),
            ).fetchone()
            if row is None:
                t = ("b", 0, 0, 0, "X", False, "", "")
            else:
                t = (
                    str(row[0]), int(row[1]), int(row[2]), int(row[3]),
                    str(row[4]), bool(row[5]), str(row[6]), str(row[7]),
                )  # fmt: skip
            self._types[oid] = t
        return t

    def type_name(self, oid: int) -> tuple[str, str]:
        t = self._type(oid)
        return (t[6], t[7])

    def source_type_sql(self, col: Column, user_type: tuple[str, str] | None) -> str:
        """A source column's type as SQL, for a hint: a built-in type (the same OID
        on every server) as the target's format_type spells it with the column's
        modifier (``numeric(10,2)``); a user-defined one by the schema and name its
        Type message gave (``"public"."mood"``, an array of it ``"public"."_mood"``)."""
        if col.type_oid < FIRST_NORMAL_OID:
            row = self.conn.execute(
                "SELECT pg_catalog.format_type(%s, %s)", (col.type_oid, col.atttypmod)
            ).fetchone()
            return str(row[0]) if row else f"<type {col.type_oid}>"
        if user_type is not None:
            return sql.Identifier(*user_type).as_string(None)
        return f"<the source's type {col.type_oid}>"

    def has_eq(self, oid: int) -> bool:
        """Whether ``=`` works on the type (default btree/hash opclass, recursively)."""
        cached = self._eq.get(oid)
        if cached is not None:
            return cached
        self._eq[oid] = False  # guards recursive composites
        typtype, elem, base, relid, category, opclass, _, _ = self._type(oid)
        if typtype == "d":
            result = self.has_eq(base)
        elif category == "A" and elem:
            result = self.has_eq(elem)
        elif typtype == "c":
            atts = self.conn.execute(
                "SELECT atttypid FROM pg_catalog.pg_attribute "
                "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
                (relid,),
            ).fetchall()
            result = all(self.has_eq(int(a[0])) for a in atts)
        elif typtype in ("e", "r", "m"):
            result = True
        else:
            result = opclass
        self._eq[oid] = result
        return result

    def binary_in_doubt(self, oid: int) -> bool:
        """Whether binary values of type ``oid`` may be refused or misread although the
        type has the same name on both sides: it is, or holds, a user-defined composite.

        Measured on PostgreSQL 15 and 18: ``array_recv`` and ``record_recv`` accept
        element and column type OIDs that differ when they are user-defined (arrays of
        enums, composites of user types, domains over them, arrays of composites all
        arrive), but a composite's members are read by the *target's* member types:
        built-in members that differ (int4 on the source, int8 on the target) are
        refused (42804) where text would convert, and user-defined members that differ
        are not even checked. Those columns go as text (bootstrap) or are refused up
        front with ``[apply] binary`` (pgoutput has no per-column format).
        """
        cached = self._binary_doubt.get(oid)
        if cached is not None:
            return cached
        self._binary_doubt[oid] = False  # guards recursive types
        typtype, elem, base, _, category, _, _, _ = self._type(oid)
        if typtype == "c":
            result = oid >= FIRST_NORMAL_OID
        elif typtype == "d":
            result = self.binary_in_doubt(base)
        elif category == "A" and elem:
            result = self.binary_in_doubt(elem)
        else:
            result = False
        self._binary_doubt[oid] = result
        return result

    def binary_doubts(self, schema: str, name: str) -> list[str]:
        """The columns of table ``schema.name`` whose binary values are in doubt."""
        table = self.table(schema, name)
        if table is None:
            return []
        return [c.name for c in table.columns.values() if self.binary_in_doubt(c.type_oid)]

    def accepts(
        self, src_oid: int, src_name: tuple[str, str] | None, tgt_oid: int, binary: bool
    ) -> bool:
        """Whether a target column of type ``tgt_oid`` can take values of the source's type."""
        if binary and self.binary_in_doubt(tgt_oid):
            return False
        if src_oid == tgt_oid and src_oid < FIRST_NORMAL_OID:
            return True
        typtype, _, base, _, category, _, nsp, name = self._type(tgt_oid)
        if src_oid >= FIRST_NORMAL_OID:
            if src_name is None:
                return not binary
            if (nsp, name) == src_name:
                return True
            if typtype == "d" and base:
                # pgoutput names a domain column's type by its base type; a domain's
                # binary form is its base type's (domain_recv), so binary is fine too.
                b = self._type(base)
                if (b[6], b[7]) == src_name:
                    return True
            return category == "S" and not binary
        if binary:
            return False
        if typtype == "d" and base == src_oid:
            return True
        if category == "S":
            return True
        if category == "A":
            src = self._type(src_oid)
            tgt_elem = self._type(tgt_oid)[1]
            return src[4] == "A" and self.accepts(src[1], None, tgt_elem, binary)
        key = (src_oid, base if typtype == "d" else tgt_oid)
        ok = self._casts.get(key)
        if ok is None:
            row = self.conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_cast "
                "WHERE castsource = %s AND casttarget = %s)",
                key,
            ).fetchone()
            ok = bool(row and row[0])
            self._casts[key] = ok
        return ok
