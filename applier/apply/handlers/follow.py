"""``[schema] follow``: the target follows what a Relation message shows, nothing installed.

When a Relation message names a column the target table lacks, shows a type
widened, or leaves out a target column every INSERT must set, :class:`Follower`
plans the target's statements; the relation cache runs them through the schema
seam (:mod:`applier.apply.handlers.schema`: in the target transaction of the
first change that needs them, recorded in ``applier.schema_changes`` with
``source = 'relation'``) and maps the table again. Nothing is looked up while
the target is up to the message: the differences are seen in the mapping's own
look-up, and only then is the source asked (one connection, closed after).

Added columns
=============

The message carries a column's name, type OID and modifier, not its default.
The source's catalog is read *now*, later than the WAL being applied: the column
must still be there with the type the message gives, else the worker stops
(it was dropped, renamed or retyped since). Its type is ``format_type`` of the
source; a type that is not built in (enum, domain, composite, an extension's)
must exist on the target under the same name, else the worker stops naming it.

The rows that existed before the column was added must read on the target as
they read on the source at that point of the stream. What the source's catalog
says of them:

* ``atthasmissing``: the column was added with a non-volatile default, whose
  value PostgreSQL keeps as the column's missing value (``attmissingval``) for
  every row that existed then; it is cleared only by a rewrite of the table,
  so while it is set, that value is exactly what those rows read, whatever
  ``SET DEFAULT``/``DROP DEFAULT`` did since. The target column is added with
  that value as its default (PostgreSQL's own fast default: no rewrite), then
  given the source's current default (or none).
* no missing value and no default now: the column was added without a default,
  so those rows read NULL. (One history reads the same in the catalog and is
  taken as NULL too: a default that gave rows their own values in a rewrite, a
  volatile one or one followed by a rewrite, and was then dropped.)
* no missing value but a default now, or an identity (or a generated column
  a PostgreSQL 18 source publishes; the target gets a plain column): either
  added with a volatile default (``clock_timestamp()``, ``nextval``: every row got its own
  value in a rewrite), or with a default and the table rewritten since, or
  without one and ``SET DEFAULT`` later (rows NULL). The three cannot be told
  apart, so unless the target table has no rows (then nothing can be wrong) the
  worker stops naming the table and column and saying how to give the target
  the source's values, rather than guess and leave NULLs or a constant.

NOT NULL is added with the column only when existing rows get a value (the
missing value) or there are none. Whether the target table has rows is asked on
the apply session, in its open transaction (rows inserted earlier in it count).

Dropped columns
===============

A Relation message cannot tell a column dropped on the source from one only
the target has, so nothing is ever dropped: the target keeps the column and its
data, and new rows get its default or NULL. A kept column that is NOT NULL
without a default would refuse every new row, so when the source table has a
dropped column (``attisdropped``) and nothing on the target fills it (no
ENABLE ALWAYS/REPLICA trigger or rule), its NOT NULL is dropped, recorded like
any schema change. Dropping columns as the source does is DDL capture's job
(``applier ddl install``), where the statement says what was dropped.

Types
=====

A column whose built-in type differs from the target's is altered when the
source's type *widens* the target's in place (:func:`~applier.apply.sql.ddlplan.widens`:
a longer varchar, varchar to text, more numeric precision at the same scale, a
longer varbit, more fractional-second precision); a type change the message
shows (the message it superseded had the target's type) that is no such
widening stops the worker naming both types. Any other difference is the
mapping's own check, as without follow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from applier.apply.handlers.sourceconn import open_source
from applier.apply.sql.ddlplan import SchemaStatement, widens
from applier.apply.sql.mapping import FIRST_NORMAL_OID, TargetColumn, TargetTable
from applier.errors import SchemaMismatch
from applier.protocol import Column, Relation

#: Runs a query on the apply session (its open transaction's view) and returns the rows.
TargetQuery = Callable[[sql.Composed | str, tuple[Any, ...]], list[tuple[Any, ...]]]

_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod,
       pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasmissing,
       (a.attmissingval::text::text[])[1], pg_catalog.pg_get_expr(d.adbin, d.adrelid),
       a.attidentity <> '' OR a.attgenerated <> '', cn.nspname, co.collname
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  LEFT JOIN pg_catalog.pg_collation co
    ON co.oid = a.attcollation AND a.attcollation <> t.typcollation
  LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace
 WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
   AND a.attname = ANY (%s)
"""
_HAS_DROPPED = """
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                 JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = %s AND c.relname = %s AND a.attisdropped)
"""


class Follower:
    """Plans what brings a target table up to a Relation message (see the module doc)."""

    def __init__(self, source_conninfo: str, target: TargetQuery) -> None:
        self.source_conninfo = source_conninfo
        self.target = target

    def __call__(
        self, rel: Relation, previous: Relation | None, table: TargetTable
    ) -> Sequence[SchemaStatement]:
        missing = [c for c in rel.columns if c.name not in table.columns]
        retyped = _retyped(rel, previous, table)
        names = {c.name for c in rel.columns}
        required = [tc for tc in table.columns.values() if tc.required and tc.name not in names]
        if table.observed:
            required = []  # a trigger or rule may fill it: not ours to change
        if not (missing or retyped or required):
            return ()
        plan = _Plan(rel, self.target)
        for c, tc in retyped:
            plan.retype(c, tc)
        if missing or required:
            with self._source() as src:
                if missing:
                    plan.add(src, missing)
                if required and _has_dropped(src, rel):
                    for tc in required:
                        plan.drop_not_null(tc)
        return plan.statements

    def _source(self) -> psycopg.Connection[Any]:
        return open_source(
            self.source_conninfo,
            "applier schema follow",
            "reading the source's catalog for a schema change",
        )


def _retyped(
    rel: Relation, previous: Relation | None, table: TargetTable
) -> list[tuple[Column, TargetColumn]]:
    """Built-in columns whose type or modifier differs from the target's, where the
    source's widens the target's or the message shows a change (see "Types")."""
    before = {c.name: c for c in previous.columns} if previous is not None else {}
    out = []
    for c in rel.columns:
        tc = table.columns.get(c.name)
        if tc is None or c.type_oid >= FIRST_NORMAL_OID:
            continue
        if (c.type_oid, c.atttypmod) == (tc.type_oid, tc.typmod):
            continue
        was = before.get(c.name)
        changed = was is not None and (was.type_oid, was.atttypmod) == (tc.type_oid, tc.typmod)
        if changed or widens(tc.type_oid, tc.typmod, c.type_oid, c.atttypmod):
            out.append((c, tc))
    return out


def _same(default: str, missing: str | None) -> bool:
    """Whether the default expression is the missing value itself (``9``): the
    column's DEFAULT clause gave it already, spelt the same. (A string's keeps its
    own cast, ``'x'::character varying``: set again, so the two catalogs agree.)"""
    return missing is not None and default == missing


def _has_dropped(src: psycopg.Connection[Any], rel: Relation) -> bool:
    row = src.execute(_HAS_DROPPED, (rel.namespace, rel.name)).fetchone()
    return bool(row and row[0])


class _Plan:
    """The statements for one table, in order."""

    def __init__(self, rel: Relation, target: TargetQuery) -> None:
        self.rel = rel
        self.target = target
        self.name = f"{rel.namespace}.{rel.name}"
        self.table = sql.Identifier(rel.namespace, rel.name)
        self.statements: list[SchemaStatement] = []
        self._has_rows: bool | None = None

    def _stmt(self, statement: sql.Composable) -> None:
        self.statements.append(
            SchemaStatement("relation", "ALTER TABLE", self.rel.namespace, self.rel.name, statement)
        )

    def _alter(self, column: str, action: sql.Composable) -> None:
        self._stmt(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} {}").format(
                self.table, sql.Identifier(column), action
            )
        )

    def has_rows(self) -> bool:
        if self._has_rows is None:
            rows = self.target(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(self.table), ())
            self._has_rows = bool(rows and rows[0][0])
        return self._has_rows

    def retype(self, c: Column, tc: TargetColumn) -> None:
        rows = self.target("SELECT pg_catalog.format_type(%s, %s)", (c.type_oid, c.atttypmod))
        new = str(rows[0][0])
        if not widens(tc.type_oid, tc.typmod, c.type_oid, c.atttypmod):
            raise SchemaMismatch(
                f"table {self.name}: column {c.name!r} changed type on the source from "
                f"{tc.type_sql} to {new}, which the target cannot follow in place (not a "
                "widening PostgreSQL does without rewriting the table)",
                table=self.name,
                column=c.name,
                hint=f"change it on the target yourself (ALTER TABLE {self.table.as_string(None)} "
                f"ALTER COLUMN {sql.Identifier(c.name).as_string(None)} TYPE {new} USING ...; "
                "or keep the target's type if it takes the new values), then restart applier run",
            )
        self._alter(c.name, sql.SQL("TYPE {}").format(sql.SQL(new)))

    def drop_not_null(self, tc: TargetColumn) -> None:
        self._alter(tc.name, sql.SQL("DROP NOT NULL"))

    def add(self, src: psycopg.Connection[Any], missing: list[Column]) -> None:
        rows = src.execute(
            _COLUMNS, (self.rel.namespace, self.rel.name, [c.name for c in missing])
        ).fetchall()
        found = {str(r[0]): r for r in rows}
        for c in missing:
            row = found.get(c.name)
            if row is None or (int(row[1]), int(row[2])) != (c.type_oid, c.atttypmod):
                raise self._changed_since(c, row)
            self._add_one(c, row)

    def _add_one(self, c: Column, row: tuple[Any, ...]) -> None:
        _, oid, _, type_sql, notnull, hasmissing, missing, default, per_row, cns, coll = row
        if oid >= FIRST_NORMAL_OID:
            self._check_type(c, str(type_sql))
        col = sql.Identifier(c.name)
        parts: list[sql.Composable] = [
            sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(self.table, col, sql.SQL(type_sql))
        ]
        if coll is not None:
            parts.append(sql.SQL("COLLATE {}").format(sql.Identifier(cns, coll)))
        if hasmissing and missing is not None:
            value = sql.SQL("{}::{}").format(sql.Literal(str(missing)), sql.SQL(type_sql))
            parts.append(sql.SQL("DEFAULT {}").format(value))
            filled = True
        else:
            unknowable = default is not None or per_row or (hasmissing and missing is None)
            if unknowable and self.has_rows():
                raise self._unknowable(c, str(type_sql), default, bool(per_row))
            filled = False
        if notnull and (filled or not self.has_rows()):
            parts.append(sql.SQL("NOT NULL"))
        self._stmt(sql.SQL(" ").join(parts))
        if hasmissing and missing is not None and default is None:
            self._alter(c.name, sql.SQL("DROP DEFAULT"))  # dropped on the source since
        elif default is not None and not per_row and not _same(default, missing):
            self._alter(c.name, sql.SQL("SET DEFAULT {}").format(sql.SQL(default)))

    def _check_type(self, c: Column, type_sql: str) -> None:
        rows = self.target("SELECT pg_catalog.to_regtype(%s) IS NOT NULL", (type_sql,))
        if rows and rows[0][0]:
            return
        raise SchemaMismatch(
            f"table {self.name}: column {c.name!r} was added on the source with type "
            f"{type_sql}, which does not exist on the target",
            table=self.name,
            column=c.name,
            type=type_sql,
            hint=f"create type {type_sql} on the target as on the source (CREATE TYPE, "
            "CREATE DOMAIN or CREATE EXTENSION), then restart applier run: the column is "
            "added then",
        )

    def _changed_since(self, c: Column, row: tuple[Any, ...] | None) -> SchemaMismatch:
        now = "is no longer there" if row is None else f"has type {row[3]} now"
        return SchemaMismatch(
            f"table {self.name}: column {c.name!r} is missing on the target, and on the "
            f"source it {now} (changed since this point of the stream): its definition "
            "cannot be read",
            table=self.name,
            column=c.name,
            hint=f"add column {c.name!r} on the target by hand with the type it had on the "
            "source then, then restart applier run",
        )

    def _unknowable(
        self, c: Column, type_sql: str, default: str | None, per_row: bool
    ) -> SchemaMismatch:
        how = "an identity or generation expression" if per_row else f"the default {default}"
        col = sql.Identifier(c.name).as_string(None)
        return SchemaMismatch(
            f"table {self.name}: column {c.name!r} was added on the source with {how} "
            "and no value the rows that existed then read is recorded (a volatile default, "
            "a table rewritten since, or a default set later): the target's existing rows "
            "cannot be given the source's values",
            table=self.name,
            column=c.name,
            hint=f"add it on the target yourself (ALTER TABLE {self.table.as_string(None)} "
            f"ADD COLUMN {col} {type_sql}) and give the existing rows the source's values "
            f"(an UPDATE from a copy of the source's {col} by key), then restart applier "
            f"run; applier verify --tables {self.name} says when they match",
        )


__all__ = ["Follower", "TargetQuery"]
