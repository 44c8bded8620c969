"""REPLICA IDENTITY FULL without an index on the target: a batch of changes, one scan.

A FULL identity UPDATE/DELETE locates its row by every column of the old row.
With an index the target can search, one statement per change is cheap
(:mod:`applier.apply.sql.planner` compares with ``=`` and ``IS NULL`` so the index
is used). Without one every statement scans the table, as PostgreSQL's own
subscriber does: 50,000 changes of a 100,000-row table are 50,000 scans.

So within one target transaction (a group of source transactions, see
:mod:`applier.apply.handlers.dispatch`, "Group commit") the FULL identity changes of
such a table are held (:class:`FullHold`, through
:meth:`~applier.apply.batching.merge.UpdateMerger.add_full`) and sent as one statement
that joins them to the table::

    WITH v (o, old.., new..) AS (VALUES (1, $1, ..), ..),
         m AS (SELECT t.ctid, v.o, v.new..,
                      row_number() OVER (PARTITION BY v.o ORDER BY t.ctid) AS i,
                      row_number() OVER (PARTITION BY t.ctid ORDER BY v.o) AS j
                 FROM ONLY tbl t JOIN v ON t.a = v.a AND t.b IS NOT DISTINCT FROM v.b ..)
    UPDATE ONLY tbl t SET .. FROM m WHERE t.ctid = m.ctid AND m.i = m.j RETURNING m.o

Matching
========

* Columns whose old value is non-NULL in every held change are compared with
  ``=``: the join can hash them, so the statement scans the table once. The
  others use ``IS NOT DISTINCT FROM`` (not hashable) as a filter. A change
  that would leave no ``=`` column sends the held ones first; a change whose
  old row is all NULLs goes alone.
* Exactly one row per change, distinct rows for changes with equal old rows:
  the changes and rows that match one another form a complete bipartite block
  (equality is transitive), and ``i = j`` pairs the k-th change with the k-th
  row (by ctid) of its block. More changes than rows: the extra ones find no
  row and are reported missing, as one by one; more rows than changes: the
  extra rows are left alone, as PostgreSQL changes only the first it finds.
* Statements are prepared per power-of-two row count; the rows up to it are
  all-NULL padding, which ``=`` never matches.
* A chain (a row updated A -> B, then B -> C) cannot be seen by one
  statement: a change whose old row is the new row of a held change sends the
  held ones first, as does a change of the other kind (UPDATE after DELETEs)
  or with other columns (unchanged TOAST values), so the table's changes go
  in source order. Any other change of the table sends them too
  (:mod:`applier.apply.batching.merge`, "Order").

Only tables where nothing can tell the order (:func:`~applier.apply.sql.mapping.full_batchable`:
no trigger or rule firing for replication, no unique index or exclusion
constraint, a plain table) and whose columns all have ``=`` (a ``json`` or
``point`` column keeps the statement per change, comparing ``::text``). Rows
not found are reported per change from the ordinals returned, with that
change's context, as a single statement's; a failing statement is replayed one
by one without holding (the worker), so the error names its change.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import (
    MAX_HELD_BYTES,
    Formats,
    Params,
    Planner,
    Stmt,
    max_rows,
    param_formats,
)
from applier.apply.sql.stmt import changed_relation, placeholder
from applier.protocol import Delete, TupleData, Update

#: Changes held per table before they are sent (also the largest statement).
MAX_FULL = 256
#: As :data:`applier.apply.batching.merge.AGAIN`: send the table's held changes, then add again.
AGAIN = -1
_U = ord("u")
_N = ord("n")
#: ``kinds.translate(_NONNULL)``: 1 where a value is present and not NULL.
_NONNULL = bytes(0 if i in (_U, _N) else 1 for i in range(256))
#: ``kinds.translate(_PRESENT)``: 1 where a value was sent (not unchanged TOAST).
_PRESENT = bytes(0 if i == _U else 1 for i in range(256))

#: A statement ready to send: (statement, parameters, formats, change contexts).
FullBatch = tuple[Stmt, Params, Formats, list[Any]]


class FullHold:
    """The held FULL identity changes of one table: all UPDATEs or all DELETEs,
    with the same columns, no one's old row made by another."""

    __slots__ = ("limit", "made", "nonnull", "rm", "rows", "shape", "size", "update")

    def __init__(self, rm: RelMap) -> None:
        self.rm = rm
        self.rows: list[tuple[TupleData, TupleData | None, Any]] = []
        self.update = False
        #: Old columns sent, then new columns sent (b"" for DELETEs).
        self.shape = b""
        #: Old columns non-NULL in every held change (compared with ``=``).
        self.nonnull = b""
        #: The new rows of the held UPDATEs (a later change of one is a chain).
        self.made: set[tuple[bytes | None, ...]] = set()
        self.limit = MAX_FULL
        #: Bytes of the held rows' values (old and new).
        self.size = 0

    def add(self, change: Update | Delete, ctx: Any) -> int:
        """Hold ``change``: how many are held, 0 if it cannot be (no old row, unchanged
        TOAST in it), :data:`AGAIN` if the held ones must go first."""
        old = change.old
        if old is None or _U in old.kinds:
            return 0
        new = change.new if isinstance(change, Update) else None
        update = new is not None
        if new is not None and new.kinds.count(_U) == len(new.kinds):
            return 0  # nothing to SET
        shape = old.kinds.translate(_PRESENT) + (new.kinds.translate(_PRESENT) if new else b"")
        nonnull = old.kinds.translate(_NONNULL)
        if self.rows:
            if (
                update != self.update
                or shape != self.shape
                or len(self.rows) >= self.limit
                or self.size >= MAX_HELD_BYTES
                or tuple(old.values) in self.made
            ):
                return AGAIN
            both = bytes(a & b for a, b in zip(self.nonnull, nonnull, strict=True))
            if 1 not in both:
                return AGAIN
            self.nonnull = both
        else:
            self.update, self.shape, self.nonnull = update, shape, nonnull
            self.limit = max_rows(shape.count(1), MAX_FULL)
        if new is not None:
            ov, nv, nk = old.values, new.values, new.kinds
            self.made.add(tuple([ov[i] if nk[i] == _U else nv[i] for i in range(len(nk))]))
        self.rows.append((old, new, ctx))
        self.size += sum(map(len, filter(None, old.values)))
        if new is not None:
            self.size += sum(map(len, filter(None, new.values)))
        return len(self.rows)

    def plan(self, planner: Planner) -> list[FullBatch]:
        """The one statement for the held changes."""
        rm, rows = self.rm, self.rows
        if not rows:
            return []
        ncols = len(rm.columns)
        old_shape, set_shape = self.shape[:ncols], self.shape[ncols:]
        # 0: not compared, 1: ``=`` (hashable), 2: IS NOT DISTINCT FROM.
        pairs = zip(old_shape, self.nonnull, strict=True)
        match = bytes(0 if not p else 1 if h else 2 for p, h in pairs)
        where = tuple(i for i, m in enumerate(match) if m)
        sets = tuple(i for i, p in enumerate(set_shape) if p)
        # Padding rows (all NULL) match nothing only where some column uses ``=``.
        n = _pow2(len(rows)) if 1 in match else len(rows)
        stmt = statement(planner, rm, match, set_shape, n)
        params: Params = []
        binary = False
        for old, new, _ in rows:
            params += [old.values[i] for i in where]
            binary = binary or b"b" in old.kinds
            if new is not None:
                params += [new.values[i] for i in sets]
                binary = binary or b"b" in new.kinds
        width = len(where) + len(sets)
        params += [None] * (width * (n - len(rows)))
        fmts: Formats = None
        if binary:
            parts = []
            for old, new, _ in rows:
                parts.append(param_formats(old.kinds, where))
                if new is not None:
                    parts.append(param_formats(new.kinds, sets))
            fmts = b"".join(parts) + bytes(width * (n - len(rows)))
        return [(stmt, params, fmts, [row[2] for row in rows])]


def _pow2(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


def statement(planner: Planner, rm: RelMap, match: bytes, set_shape: bytes, n: int) -> Stmt:
    """The statement for ``n`` rows: old columns compared as ``match`` says, then the
    new values of the columns ``set_shape`` marks (none: a DELETE)."""
    op = "fu" if set_shape else "fd"
    key = (rm.version, op, set_shape, match + b"n%d" % n)
    stmt = planner.cache.get(key)
    if stmt is None:
        stmt = planner.cache[key] = _build(planner, rm, match, set_shape, n)
    return stmt


def _build(planner: Planner, rm: RelMap, match: bytes, set_shape: bytes, n: int) -> Stmt:
    where = tuple(i for i, m in enumerate(match) if m)
    sets = tuple(i for i, p in enumerate(set_shape) if p)
    olds = [sql.Identifier(f"o{j}") for j in range(len(where))]
    news = [sql.Identifier(f"n{j}") for j in range(len(sets))]
    width = len(where) + len(sets)
    t, v, m = (sql.Identifier(x) for x in ("applier_t", "applier_v", "applier_m"))
    rows = sql.SQL(", ").join(
        sql.SQL("({}, {})").format(
            sql.Literal(r + 1),
            sql.SQL(", ").join(placeholder(r * width + j + 1) for j in range(width)),
        )
        for r in range(n)
    )
    conds = []
    for j, i in enumerate(where):
        op = sql.SQL(" = " if match[i] == 1 else " IS NOT DISTINCT FROM ")
        col = sql.Identifier(rm.columns[i].name)
        conds.append(sql.SQL("{}.{}{}{}.{}").format(t, col, op, v, olds[j]))
    carried = sql.SQL("").join(sql.SQL(", {}.{}").format(v, c) for c in news)
    q = changed_relation(rm)
    head = sql.SQL(
        "WITH {v} (applier_o, {cols}) AS (VALUES {rows}), "
        "{m} AS (SELECT {t}.ctid AS applier_c, {v}.applier_o{carried}, "
        "pg_catalog.row_number() OVER (PARTITION BY {v}.applier_o ORDER BY {t}.ctid) AS applier_i, "
        "pg_catalog.row_number() OVER (PARTITION BY {t}.ctid ORDER BY {v}.applier_o) AS applier_j "
        "FROM {q} AS {t} JOIN {v} ON {conds}) "
    ).format(
        v=v, cols=sql.SQL(", ").join(olds + news), rows=rows, m=m, t=t, carried=carried,
        q=q, conds=sql.SQL(" AND ").join(conds),
    )  # fmt: skip
    pick = sql.SQL(
        "WHERE {t}.ctid = {m}.applier_c AND {m}.applier_i = {m}.applier_j RETURNING {m}.applier_o"
    ).format(t=t, m=m)
    if sets:
        assign = sql.SQL(", ").join(
            sql.SQL("{} = {}.{}").format(sql.Identifier(rm.columns[i].name), m, news[j])
            for j, i in enumerate(sets)
        )
        body = sql.SQL("UPDATE {q} AS {t} SET {assign} FROM {m} ").format(
            q=q, t=t, assign=assign, m=m
        )
        name = planner.statement_name(rm, "fu")
    else:
        body = sql.SQL("DELETE FROM {q} AS {t} USING {m} ").format(q=q, t=t, m=m)
        name = planner.statement_name(rm, "fd")
    query = sql.Composed([head, body, pick]).as_bytes(None)
    types = tuple(rm.columns[i].type_oid for i in where + sets) * n
    return Stmt(name, query, types, sets, where, True, False)
