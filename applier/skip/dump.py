"""``applier skip dump``: kept changes as SQL a DBA can review and replay by hand.

Input is what :func:`applier.skip.store.kept_changes` read from
``applier.skipped_changes``, in source commit order. The worker stores rows as
jsonb objects of column -> the text the source printed (null for NULL):
``key`` holds the replica identity columns that locate the row (the old key of
an UPDATE that changed it), ``old_row``/``new_row`` every column sent (an
unchanged TOASTed column is absent from ``new_row``, so an UPDATE leaves it as
it is). The SQL:

* one block per source transaction: a header comment (xid, commit and end LSN,
  commit time, rule, errors with SQLSTATE), then ``BEGIN;`` ... ``COMMIT;``;
* a skipped DDL statement (``op = 'ddl'``, migration 0012) as it was kept:
  the ``search_path`` it ran with set for the transaction, then the statement
  (the form the target would have run: ``CONCURRENTLY`` taken out);
* one statement per change: ``INSERT INTO "s"."t" (cols) VALUES (...)``,
  ``UPDATE ONLY "s"."t" SET ... WHERE key``, ``DELETE FROM ONLY ... WHERE key``,
  ``TRUNCATE ONLY ...`` (``ONLY`` as the worker writes them: not for a
  partitioned table, whose partitions the statement must reach). Identifiers
  are quoted by psycopg; values are text literals, which PostgreSQL casts to
  the column's type (``"c" = '42'`` in a WHERE too); a NULL key column is
  ``"c" IS NULL``. Without ``key`` the old row locates the row (REPLICA
  IDENTITY FULL);
* a change the worker **applied** and kept only for context (``dump = all``,
  ``skipped = false``) is written **commented out**, every line prefixed with
  ``-- `` (deleting the prefix restores the statement exactly), so replaying
  the file never applies it twice;
* a value sent in binary (``[apply] binary``) is kept as ``\\x`` and the hex of
  the type's binary form, which no text input reads: a statement with such a
  value is commented out too, with a note naming the columns. A ``\\x``-hex
  value counts as binary unless its target column is ``bytea`` (whose text
  form is exactly that), so the target's catalog is asked for the column types.

Replay with ``psql -v ON_ERROR_STOP=1 -f dump.sql``: a failing transaction
stops there, the earlier ones stay committed.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, TextIO

import psycopg
from psycopg import sql

from .store import KeptChange

# What binary-mode values look like as the worker keeps them.
_HEX = re.compile(r"^\\x(?:[0-9a-fA-F]{2})*$")


@dataclass(frozen=True)
class TableShape:
    """What the dump needs of a target table: partitioned?, which columns are bytea,
    the column order (jsonb keeps keys in its own order)."""

    partitioned: bool = False
    bytea: frozenset[str] = frozenset()
    columns: tuple[str, ...] = ()

    def ordered(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row``'s columns in the table's order (unknown ones last, as they came)."""
        rank = {c: i for i, c in enumerate(self.columns)}
        return dict(sorted(row.items(), key=lambda kv: rank.get(kv[0], len(rank))))


_SHAPES = """
SELECT n.nspname, c.relname, c.relkind = 'p',
       coalesce(array_agg(a.attname::text) FILTER (
           WHERE CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
                 = 'pg_catalog.bytea'::pg_catalog.regtype), '{}'),
       coalesce(array_agg(a.attname::text ORDER BY a.attnum)
                FILTER (WHERE a.attname IS NOT NULL), '{}')
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[])) AS x(s, r)
    ON n.nspname = x.s AND c.relname = x.r
  LEFT JOIN pg_catalog.pg_attribute a
    ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
 GROUP BY 1, 2, 3
"""


def table_shapes(
    conn: psycopg.Connection[Any], changes: Iterable[KeptChange]
) -> dict[tuple[str, str], TableShape]:
    """The target's shape of every table the changes name (absent: no such table)."""
    names = sorted(
        {(c.schema_name, c.table_name) for c in changes if c.schema_name and c.table_name}
    )
    if not names:
        return {}
    rows = conn.execute(_SHAPES, ([s for s, _ in names], [t for _, t in names])).fetchall()
    return {(s, t): TableShape(bool(p), frozenset(b), tuple(c)) for s, t, p, b, c in rows}


def render_json(changes: list[KeptChange], out: TextIO) -> None:
    json.dump([c.as_json() for c in changes], out, indent=2)
    out.write("\n")


@dataclass
class Statement:
    """One change as SQL, and why it must not be replayed as it is (if so)."""

    text: str
    binary: list[str] = field(default_factory=list)
    problem: str | None = None


def render_sql(
    changes: list[KeptChange],
    shapes: dict[tuple[str, str], TableShape],
    out: TextIO,
    *,
    origin: str,
) -> None:
    txns = [list(g) for _, g in groupby(changes, key=lambda c: c.txn)]
    out.write(
        f"-- applier skip dump: origin {origin}, {len(changes)} kept change(s) "
        f"in {len(txns)} transaction(s)\n"
        "-- Replay with: psql -v ON_ERROR_STOP=1 -f <this file>\n"
        "-- Lines starting with '-- ' do not run: changes the worker applied (kept for\n"
        "-- context) and changes that cannot be replayed as written are commented out.\n"
    )
    for txn in txns:
        out.write("\n")
        out.writelines(_transaction(txn, shapes))


def _transaction(txn: list[KeptChange], shapes: dict[tuple[str, str], TableShape]) -> Iterator[str]:
    first = txn[0]
    yield (
        f"-- transaction xid {_show(first.xid)}, commit LSN {_show(first.commit_lsn)}, "
        f"end LSN {_show(first.end_lsn)}, committed {_show(_time(first.commit_time))}\n"
    )
    rules = sorted({c.rule_id for c in txn if c.rule_id is not None})
    removed = any(c.rule_id is None for c in txn)
    skipped = sum(c.skipped for c in txn)
    yield (
        f"-- kept by {_rules(rules, removed)}: {skipped} skipped, "
        f"{len(txn) - skipped} applied (kept for context)\n"
    )
    for c in txn:
        if c.error or c.sqlstate:
            yield from _commented(
                f"error at change {c.change_no} (SQLSTATE {_show(c.sqlstate)}): {c.error or '-'}\n"
            )
    yield "BEGIN;\n"
    for c in txn:
        yield from _change(c, shapes.get((c.schema_name or "", c.table_name or "")))
    yield "COMMIT;\n"


def _change(c: KeptChange, shape: TableShape | None) -> Iterator[str]:
    if c.op == "ddl":
        yield from _ddl(c)
        return
    stmt = statement(c, shape)
    what = f"change {c.change_no}: {c.op} {_rel_name(c)}"
    if not c.skipped:
        yield f"-- {what}, applied, kept for context: do not replay\n"
        yield from _commented(stmt.text + "\n")
        return
    if stmt.problem is not None:
        yield f"-- {what}, skipped; NOT REPLAYABLE as written: {stmt.problem}\n"
        yield from _commented(stmt.text + "\n")
        return
    yield f"-- {what}, skipped\n"
    yield stmt.text + "\n"


def _ddl(c: KeptChange) -> Iterator[str]:
    """A skipped DDL statement, under the search_path it ran with on the source."""
    kept = c.new_row or {}
    tag = kept.get("tag") or "DDL"
    yield f"-- change {c.change_no}: {tag} at LSN {_show(c.change_lsn)}, skipped\n"
    path = kept.get("search_path")
    if path:
        yield (
            sql.SQL("SELECT pg_catalog.set_config('search_path', {}, true);\n")
            .format(sql.Literal(path))
            .as_string(None)
        )
    text = (c.statement or "").rstrip().rstrip(";")
    yield text + ";\n"


def _commented(text: str) -> Iterator[str]:
    for line in text.splitlines():
        yield f"-- {line}\n"


def statement(c: KeptChange, shape: TableShape | None) -> Statement:
    """The SQL that would redo row change ``c`` on the target."""
    shape = shape or TableShape()
    # A row change always names its table (migration 0012's CHECK).
    assert c.schema_name is not None and c.table_name is not None
    rel = sql.Identifier(c.schema_name, c.table_name)
    only = rel if shape.partitioned else sql.Composed([sql.SQL("ONLY "), rel])
    if c.op == "truncate":
        return Statement(sql.SQL("TRUNCATE {};").format(only).as_string(None))
    new = shape.ordered(c.new_row or {})
    where = shape.ordered(c.key or c.old_row or {})
    binary = _binary_columns([new, where], shape)
    problem = f"column(s) {', '.join(binary)} came in binary" if binary else None
    if c.op == "insert":
        if not new:
            return Statement("-- (no row was kept)", problem="no row was kept")
        q = sql.SQL("INSERT INTO {} ({}) VALUES ({});").format(
            rel,
            sql.SQL(", ").join(map(sql.Identifier, new)),
            sql.SQL(", ").join(_literal(v) for v in new.values()),
        )
        return Statement(q.as_string(None), binary, problem)
    if not where:
        return Statement("-- (no key was kept)", problem="no key or old row was kept")
    if c.op == "delete":
        q = sql.SQL("DELETE FROM {} WHERE {};").format(only, _where(where))
        return Statement(q.as_string(None), binary, problem)
    if not new:
        return Statement("-- (no new values were kept)", problem="no new row was kept")
    sets = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(k), _literal(v)) for k, v in new.items()
    )
    q = sql.SQL("UPDATE {} SET {} WHERE {};").format(only, sets, _where(where))
    return Statement(q.as_string(None), binary, problem)


def _where(cols: dict[str, Any]) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("{} IS NULL").format(sql.Identifier(k))
        if v is None
        else sql.SQL("{} = {}").format(sql.Identifier(k), _literal(v))
        for k, v in cols.items()
    )


def _literal(v: Any) -> sql.Composable:
    """A value as a text literal (the worker keeps text; anything else as its JSON)."""
    if v is not None and not isinstance(v, str):
        v = json.dumps(v) if isinstance(v, dict | list) else str(v)
    # psycopg writes " E'...'" for a value with a backslash: no stray space in a list.
    return sql.SQL(sql.Literal(v).as_string(None).lstrip())


def _binary_columns(rows: list[dict[str, Any]], shape: TableShape) -> list[str]:
    cols = {
        k
        for row in rows
        for k, v in row.items()
        if isinstance(v, str) and k not in shape.bytea and _HEX.match(v)
    }
    return sorted(cols)


def _rel_name(c: KeptChange) -> str:
    if c.schema_name is None or c.table_name is None:
        return "-"
    return sql.Identifier(c.schema_name, c.table_name).as_string(None)


def _rules(ids: list[int], removed: bool) -> str:
    parts = [f"rule {', '.join(map(str, ids))}"] if ids else []
    if removed:
        parts.append("a rule since removed")
    return " and ".join(parts) or "-"


def _show(v: Any) -> str:
    return "-" if v is None else str(v)


def _time(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t is not None else None
