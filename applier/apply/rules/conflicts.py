"""Conflicts: the statements that see them, and the records that keep them.

A conflict is a change the target's rows disagree with (PostgreSQL 18's names:
insert_exists, update_exists, multiple_unique_conflicts, update_missing,
delete_missing, update/delete_origin_differs). What to do is the table's
policy (:mod:`applier.apply.rules.policies`).

Seeing them without a round trip
================================

Changes are pipelined (:mod:`applier.apply.target.pipeline`): a statement's result
arrives long after it was sent, so a conflict must be decided by the statement
itself, on the server, in the order of the changes. Tables whose policies are
the built-in ones keep their plain statements (an UPDATE/DELETE that finds no
row is seen from its row count, and skipped). The others get one statement
per change that decides and reports in one go:

* INSERT with ``insert_exists`` not ``error``: as in PostgreSQL 18, it conflicts
  on any unique index of the target, not only the replica identity's. The
  INSERT runs with ``ON CONFLICT DO NOTHING`` (skip, keep_local: any index is
  its arbiter), or, for apply_remote and last_update_wins (only where the local
  row's commit timestamp is not newer than the remote one), ``ON CONFLICT (key)
  DO UPDATE`` where the identity's key is the target's only unique key. Only
  when the row was not simply inserted does the same statement read the local
  rows that hold any of its unique keys (in its snapshot: as before the
  insert). Elsewhere (FULL identity, another unique key beside it) no single
  arbiter would do: the statement looks the local rows up by every unique key
  first and updates the one that holds them, or inserts (:func:`_by_keys`).
  Either returns (rows written, local rows as jsonb): one local row is
  insert_exists, more is multiple_unique_conflicts (nothing written).
* UPDATE with ``update_missing = apply_remote``: the UPDATE in a CTE; where it
  found nothing, the new row written as the INSERT above (a local row holding
  one of its unique keys is set to it). It returns (rows the UPDATE found, local
  rows). A message that lacks unchanged TOAST values cannot be inserted: that
  row is an error that says so.
* UPDATE/DELETE where the config names ``*_origin_differs``: a CTE locks the
  local row and reads its origin and commit timestamp
  (``pg_xact_commit_timestamp_origin``, so ``track_commit_timestamp = on`` on
  the target); the change runs only where the policy lets it; the statement
  returns the local row, its origin and whether the change ran. A row written
  by this applier's origin, in the open transaction, or with no timestamp
  (frozen, or written before timestamps were on) is no conflict.

update_exists and multiple_unique_conflicts of an UPDATE (a unique key of the
new row taken by another row) fail the statement; they are caught by the
careful replay of the failed transaction
(:meth:`~applier.apply.rules.resolve.Resolver.careful`).

The records of the conflicts met: :mod:`applier.apply.rules.conflictlog`.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from applier.apply.core.states import MergedCtx
from applier.apply.rules.policies import (
    DELETE_ORIGIN,
    INSERT_EXISTS,
    UPDATE_MISSING,
    UPDATE_ORIGIN,
)
from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import INSERT, Formats, Params, Planner, Stmt, compare, param_formats
from applier.apply.sql.stmt import changed_relation, placeholder, qualified
from applier.lsn import pg_timestamp
from applier.protocol import Delete, Insert, Update

TIMESTAMPTZ_OID = 1184
_U = ord("u")


class ConflictPlanner:
    """Builds the statements of "Seeing them without a round trip", cached in the planner."""

    def __init__(self, planner: Planner, our_origin_id: int) -> None:
        self.planner = planner
        self.our_origin_id = our_origin_id
        #: Checked INSERT statement name -> whether its rows may share a statement.
        self._batchable: dict[bytes, bool] = {}

    # -- INSERT ------------------------------------------------------------------------

    def insert(self, rm: RelMap, change: Insert, commit_ts: int) -> tuple[Stmt, Params, Formats]:
        stmt, params, fmts = self.planner.insert(rm, change)
        assert rm.policy is not None
        policy = rm.policy[INSERT_EXISTS]
        key = (rm.version, "ci", stmt.name, b"")
        checked = self.planner.cache.get(key)
        if checked is None:
            checked = self.planner.cache[key] = self._build_insert(rm, stmt, policy)
        if policy == "last_update_wins":
            params = [*params, _ts(commit_ts)]
            if fmts is not None:
                fmts = fmts + b"\x00"
        return checked, params, fmts

    def _build_insert(self, rm: RelMap, plain: Stmt, policy: str) -> Stmt:
        idx = plain.new_idx
        types = plain.types + ((TIMESTAMPTZ_OID,) if policy == "last_update_wins" else ())
        if policy in ("apply_remote", "last_update_wins") and not _key_alone(rm):
            query = self._insert_by_keys(rm, idx, policy)
        else:
            query = self._insert_on_conflict(rm, idx, policy)
        return Stmt(
            self.planner.statement_name(rm, INSERT),
            query.as_bytes(None),
            types,
            idx,
            (),
            False,
            False,
        )

    def _insert_on_conflict(self, rm: RelMap, idx: tuple[int, ...], policy: str) -> sql.Composable:
        """The INSERT with ``ON CONFLICT``: keep the local row (any unique index), or
        update it where the identity's unique index is the target's only one."""
        l_where = _holds_a_key(rm, {i: placeholder(n) for n, i in enumerate(idx, start=1)})
        names = [sql.Identifier(rm.columns[i].name) for i in idx]
        values = sql.SQL(", ").join(placeholder(n) for n in range(1, len(idx) + 1))
        if policy in ("skip", "keep_local"):
            on_conflict: sql.Composable = sql.SQL("ON CONFLICT DO NOTHING")
        else:
            on_conflict = self._do_update(rm, idx, policy, len(idx) + 1)
        # The local rows are read only when the row was not simply inserted (the
        # ELSE's subquery is evaluated only then): a plan the server cached while the
        # table was small (a sequential scan) costs only at conflicts. They are read
        # in the statement's snapshot: as they were before this INSERT.
        return sql.SQL(
            "WITH applier_i AS (INSERT INTO {q} AS applier_t ({names}) OVERRIDING SYSTEM "
            "VALUE VALUES ({values}) {on_conflict} "
            "RETURNING applier_t.xmax::pg_catalog.text = '0' AS inserted) "
            "SELECT (SELECT pg_catalog.count(*) FROM applier_i)::pg_catalog.int4, "
            "CASE WHEN EXISTS (SELECT FROM applier_i WHERE inserted) THEN NULL ELSE "
            "(SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(applier_x)) FROM {src} AS applier_x "
            "WHERE {l_where}) END"
        ).format(
            src=changed_relation(rm), l_where=l_where, q=qualified(rm),
            names=sql.SQL(", ").join(names), values=values, on_conflict=on_conflict,
        )  # fmt: skip

    @staticmethod
    def _insert_by_keys(rm: RelMap, idx: tuple[int, ...], policy: str) -> sql.Composable:
        """The INSERT that updates the local row holding any of its unique keys (see
        :func:`_by_keys`): what ``ON CONFLICT`` cannot, with one arbiter index."""
        allow: sql.Composable = sql.SQL("true")
        if policy == "last_update_wins":
            ts = sql.SQL("pg_catalog.pg_xact_commit_timestamp(applier_t.xmin)")
            allow = sql.SQL("{ts} IS NULL OR {ts} <= {p}").format(
                ts=ts, p=placeholder(len(idx) + 1)
            )
        return sql.SQL(
            "WITH {ctes} "
            "SELECT ((SELECT pg_catalog.count(*) FROM applier_i) "
            "+ (SELECT pg_catalog.count(*) FROM applier_w))::pg_catalog.int4, "
            "CASE WHEN EXISTS (SELECT FROM applier_i) THEN NULL ELSE "
            "(SELECT pg_catalog.jsonb_agg(applier_l.r) FROM applier_l) END"
        ).format(ctes=_by_keys(rm, idx, 1, sql.SQL("true"), allow))

    @staticmethod
    def _do_update(rm: RelMap, idx: tuple[int, ...], policy: str, ts_param: int) -> sql.Composable:
        sets = [
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(rm.columns[i].name))
            for i in idx
            if i not in rm.key
        ] or [sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(rm.columns[rm.key[0]].name))]
        out = sql.SQL("ON CONFLICT ({k}) DO UPDATE SET {s}").format(
            k=sql.SQL(", ").join(sql.Identifier(rm.columns[i].name) for i in rm.key),
            s=sql.SQL(", ").join(sets),
        )
        if policy == "last_update_wins":
            ts = sql.SQL("pg_catalog.pg_xact_commit_timestamp(applier_t.xmin)")
            out = sql.SQL("{o} WHERE {ts} IS NULL OR {ts} <= {p}").format(
                o=out, ts=ts, p=placeholder(ts_param)
            )
        return out

    def forget(self, names: list[bytes]) -> None:
        """Statements of a superseded or evicted mapping (Planner.forget) are gone."""
        for name in names:
            self._batchable.pop(name, None)

    def batchable(self, rm: RelMap, stmt: Stmt) -> bool:
        """Whether checked INSERTs of ``stmt`` may go several per statement: keep the
        local row (skip, keep_local), a key that tells the rows apart (DEFAULT/INDEX:
        unique and not null on the source; FULL's columns may be NULL or repeat), every
        key column sent and comparable with ``=``, and nothing on the target that
        watches rows one by one."""
        hit = self._batchable.get(stmt.name)
        if hit is None:
            hit = self._batchable[stmt.name] = self._can_batch(rm, stmt)
        return hit

    @staticmethod
    def _can_batch(rm: RelMap, stmt: Stmt) -> bool:
        assert rm.policy is not None and rm.target is not None
        return (
            rm.policy[INSERT_EXISTS] in ("skip", "keep_local")
            and rm.replident in ("d", "i")
            and bool(rm.key)
            and all(i in stmt.new_idx and rm.columns[i].has_eq for i in rm.key)
            and not rm.target.observed
        )

    def insert_many(self, rm: RelMap, plain: Stmt, n: int) -> Stmt:
        """``n`` checked INSERTs (skip/keep_local) in one statement; it returns
        (ordinal, local rows) of the rows not inserted."""
        key = (rm.version, "cm", plain.name, b"%d" % n)
        stmt = self.planner.cache.get(key)
        if stmt is None:
            stmt = self.planner.cache[key] = self._build_insert_many(rm, plain, n)
        return stmt

    def _build_insert_many(self, rm: RelMap, plain: Stmt, n: int) -> Stmt:
        idx = plain.new_idx
        width = len(idx)
        cname = {i: sql.Identifier(f"c{j}") for j, i in enumerate(idx)}
        v = sql.Identifier("applier_v")
        rows = sql.SQL(", ").join(
            sql.SQL("({}, {})").format(
                sql.Literal(r + 1),
                sql.SQL(", ").join(placeholder(r * width + j + 1) for j in range(width)),
            )
            for r in range(n)
        )
        l_where = _holds_a_key(rm, {i: sql.SQL("{}.{}").format(v, c) for i, c in cname.items()})
        key_match = sql.SQL(" AND ").join(
            sql.SQL("applier_i.{k} = {v}.{c}").format(
                k=sql.Identifier(rm.columns[i].name), v=v, c=cname[i]
            )
            for i in rm.key
        )
        query = sql.SQL(
            "WITH {v} (applier_o, {cols}) AS (VALUES {rows}), "
            "applier_i AS (INSERT INTO {q} AS applier_t ({names}) OVERRIDING SYSTEM VALUE "
            "SELECT {cols} FROM {v} ORDER BY applier_o ON CONFLICT DO NOTHING "
            "RETURNING {keys}) "
            "SELECT {v}.applier_o, (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(applier_x)) "
            "FROM {src} AS applier_x WHERE {l_where}) "
            "FROM {v} WHERE NOT EXISTS (SELECT FROM applier_i WHERE {key_match})"
        ).format(
            v=v, cols=sql.SQL(", ").join(cname[i] for i in idx), rows=rows, q=qualified(rm),
            names=sql.SQL(", ").join(sql.Identifier(rm.columns[i].name) for i in idx),
            keys=sql.SQL(", ").join(sql.Identifier(rm.columns[i].name) for i in rm.key),
            src=changed_relation(rm), l_where=l_where, key_match=key_match,
        )  # fmt: skip
        return Stmt(
            self.planner.statement_name(rm, "m"), query.as_bytes(None), plain.types * n, idx, (),
            False, False,
        )  # fmt: skip

    # -- UPDATE of a missing row: insert it ----------------------------------------------

    def update(self, rm: RelMap, change: Update) -> tuple[Stmt, Params, Formats] | None:
        """The upsert of ``update_missing = apply_remote``; None when the message lacks
        unchanged TOAST values (the plain statement then runs; a miss is an error)."""
        new = change.new
        if _U in new.kinds:
            return None
        stmt, params, fmts = self.planner.update(rm, change)
        key = (rm.version, "cu", stmt.name, b"")
        checked = self.planner.cache.get(key)
        if checked is None:
            checked = self.planner.cache[key] = self._build_upsert(rm, stmt)
        params = params + list(new.values)
        if fmts is not None or b"b" in new.kinds:
            width = len(stmt.new_idx) + len(stmt.where_idx)
            fmts = (fmts or bytes(width)) + param_formats(new.kinds, tuple(range(len(rm.columns))))
        return checked, params, fmts

    def _build_upsert(self, rm: RelMap, plain: Stmt) -> Stmt:
        first = len(plain.types) + 1
        every = tuple(range(len(rm.columns)))
        missed = sql.SQL("NOT EXISTS (SELECT FROM applier_u)")
        query = sql.SQL(
            "WITH applier_u AS ({update} RETURNING 1), {ctes} "
            "SELECT (SELECT pg_catalog.count(*) FROM applier_u)::pg_catalog.int4, "
            "(SELECT pg_catalog.jsonb_agg(applier_l.r) FROM applier_l)"
        ).format(
            update=sql.SQL(plain.query.decode()),
            ctes=_by_keys(rm, every, first, missed, sql.SQL("true")),
        )
        types = plain.types + tuple(c.type_oid for c in rm.columns)
        return Stmt(
            self.planner.statement_name(rm, "u"), query.as_bytes(None), types, plain.new_idx,
            plain.where_idx, False, False,
        )  # fmt: skip

    # -- origin checks -----------------------------------------------------------------

    def origin_checked(
        self, rm: RelMap, change: Update | Delete, commit_ts: int
    ) -> tuple[Stmt, Params, Formats]:
        is_update = isinstance(change, Update)
        plan = self.planner.update if is_update else self.planner.delete
        stmt, params, fmts = plan(rm, change)  # type: ignore[arg-type]
        assert rm.policy is not None
        policy = rm.policy[UPDATE_ORIGIN if is_update else DELETE_ORIGIN]
        key = (rm.version, "co", stmt.name, policy.encode())
        checked = self.planner.cache.get(key)
        if checked is None:
            checked = self.planner.cache[key] = self._build_origin(rm, stmt, is_update, policy)
        params = [*params, _ts(commit_ts)]
        if fmts is not None:
            fmts = fmts + b"\x00"
        return checked, params, fmts

    def _build_origin(self, rm: RelMap, plain: Stmt, is_update: bool, policy: str) -> Stmt:
        first_where = len(plain.new_idx) + 1
        full = rm.replident == "f"
        conds = sql.SQL(" AND ").join(
            compare(rm.columns[i], _x(rm, i), placeholder(n), full)
            for n, i in enumerate(plain.where_idx, start=first_where)
        ) if plain.where_idx else sql.SQL("true")  # fmt: skip
        ts_param = placeholder(len(plain.types) + 1)
        ours = sql.Literal(self.our_origin_id)
        if policy == "apply_remote":
            allow: sql.Composable = sql.SQL("true")
        elif policy == "last_update_wins":
            allow = sql.SQL(
                "o.roident IS NULL OR o.roident = {ours} OR o.ts IS NULL OR o.ts <= {p}"
            ).format(ours=ours, p=ts_param)
        else:
            allow = sql.SQL("o.roident IS NULL OR o.roident = {ours}").format(ours=ours)
        match = sql.SQL("applier_t.tableoid = o.toid AND applier_t.ctid = o.c AND ({})").format(
            allow
        )
        if is_update:
            sets = sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(rm.columns[i].name), placeholder(n))
                for n, i in enumerate(plain.new_idx, start=1)
            )
            change = sql.SQL(
                "UPDATE {t} AS applier_t SET {sets} FROM o WHERE {m} RETURNING 1"
            ).format(t=changed_relation(rm), sets=sets, m=match)
        else:
            change = sql.SQL("DELETE FROM {t} AS applier_t USING o WHERE {m} RETURNING 1").format(
                t=changed_relation(rm), m=match
            )
        query = sql.SQL(
            "WITH o AS (SELECT applier_x.tableoid AS toid, applier_x.ctid AS c, "
            'pg_catalog.to_jsonb(applier_x) AS r, t.roident, t."timestamp" AS ts '
            "FROM {src} AS applier_x, "
            "pg_catalog.pg_xact_commit_timestamp_origin(applier_x.xmin) AS t "
            "WHERE {conds} LIMIT 1 FOR UPDATE OF applier_x), "
            "applier_c AS ({change}) "
            "SELECT o.roident, o.r, (SELECT pg_catalog.count(*) FROM applier_c)::pg_catalog.int4 "
            "FROM o"
        ).format(src=changed_relation(rm), conds=conds, change=change)
        return Stmt(
            self.planner.statement_name(rm, "o"), query.as_bytes(None),
            (*plain.types, TIMESTAMPTZ_OID), plain.new_idx, plain.where_idx, False, False,
        )  # fmt: skip


def _x(rm: RelMap, i: int) -> sql.Composable:
    """Column ``i`` of the local row (alias ``applier_x``)."""
    return sql.Identifier("applier_x", rm.columns[i].name)


def _holds_a_key(rm: RelMap, values: dict[int, sql.Composable]) -> sql.Composable:
    """A condition on ``applier_x``: it holds one of the target's unique keys with the
    ``values`` (column index -> expression); keys with a column not in ``values``, and
    expression or partial indexes, are left out."""
    assert rm.target is not None
    conds: list[sql.Composable] = []
    for cols in rm.target.unique_sets:
        if cols is None:
            continue
        where = [i for i, c in enumerate(rm.columns) if c.name in cols and i in values]
        if len(where) == len(cols):
            conds.append(
                sql.SQL("({})").format(
                    sql.SQL(" AND ").join(
                        compare(rm.columns[i], _x(rm, i), values[i]) for i in where
                    )
                )
            )
    return sql.SQL(" OR ").join(conds) if conds else sql.SQL("false")


def _key_alone(rm: RelMap) -> bool:
    """The identity's columns are the target's only unique key: ``ON CONFLICT`` on
    them meets every conflict an INSERT can have."""
    assert rm.target is not None
    names = frozenset(rm.columns[i].name for i in rm.key)
    sets = rm.target.unique_sets
    return (
        rm.replident in ("d", "i") and bool(rm.key) and bool(sets) and all(u == names for u in sets)
    )


def _by_keys(
    rm: RelMap, idx: tuple[int, ...], first: int, guard: sql.Composable, allow: sql.Composable
) -> sql.Composable:
    """Three CTEs that write a new row (columns ``idx``, placeholders from ``first``)
    through whichever unique index of the target holds one of its keys, as
    PostgreSQL 18 looks for an INSERT's conflict in every unique index:

    * ``applier_l``: the local rows that hold any of its keys (``toid``, ``c``, ``r``
      the row as jsonb), locked, as they were before the statement;
    * ``applier_w``: that row set to the new row when exactly one holds them (and
      ``allow``, a condition on ``applier_t``, lets it), but for a GENERATED ALWAYS
      identity column; several are multiple_unique_conflicts, left as they are for
      the caller to decide;
    * ``applier_i``: the new row, inserted when none does.

    ``guard`` conditions all of it (the upsert: its UPDATE found nothing). A row a
    concurrent session inserts meanwhile fails the INSERT (a unique violation the
    worker names), rather than being overwritten unseen; so does one that holds a key
    only through an expression or partial index, which no condition here can name.
    """
    vals: dict[int, sql.Composable] = {i: placeholder(n) for n, i in enumerate(idx, start=first)}
    names = [sql.Identifier(rm.columns[i].name) for i in idx]
    # A GENERATED ALWAYS identity column keeps the local row's value: an UPDATE may
    # set it only to DEFAULT. (A table of that one column has nothing else to set.)
    sets = [
        sql.SQL("{} = {}").format(c, vals[i])
        for c, i in zip(names, idx, strict=True)
        if not rm.columns[i].identity_always
    ]
    update: sql.Composable = sql.SQL("SELECT 1 WHERE false")
    if sets:
        update = sql.SQL(
            "UPDATE {src} AS applier_t SET {sets} FROM applier_l "
            "WHERE applier_t.tableoid = applier_l.toid AND applier_t.ctid = applier_l.c "
            "AND (SELECT pg_catalog.count(*) FROM applier_l) = 1 AND ({allow}) RETURNING 1"
        ).format(src=changed_relation(rm), sets=sql.SQL(", ").join(sets), allow=allow)
    return sql.SQL(
        "applier_l AS (SELECT applier_x.tableoid AS toid, applier_x.ctid AS c, "
        "pg_catalog.to_jsonb(applier_x) AS r FROM {src} AS applier_x "
        "WHERE {guard} AND ({l_where}) FOR UPDATE OF applier_x), "
        "applier_w AS ({update}), "
        "applier_i AS (INSERT INTO {q} ({names}) OVERRIDING SYSTEM VALUE SELECT {values} "
        "WHERE {guard} AND NOT EXISTS (SELECT FROM applier_l) RETURNING 1)"
    ).format(
        src=changed_relation(rm), guard=guard, l_where=_holds_a_key(rm, vals), update=update,
        q=qualified(rm), names=sql.SQL(", ").join(names),
        values=sql.SQL(", ").join(vals[i] for i in idx),
    )  # fmt: skip


class CheckedRows(MergedCtx):
    """The context of a multi-row checked INSERT: its rows' contexts, and its reader."""

    __slots__ = ("check",)

    def __init__(self, ctxs: list[Any], check: Any) -> None:
        super().__init__(ctxs)
        self.check = check


def _ts(commit_ts: int) -> bytes:
    return pg_timestamp(commit_ts).isoformat().encode()


__all__ = ["INSERT_EXISTS", "UPDATE_MISSING", "CheckedRows", "ConflictPlanner"]
