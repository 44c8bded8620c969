"""Pure statement planning: (relation mapping, change) -> (prepared statement, parameters).

No database here: everything is decided from the :class:`~.mapping.RelMap`
and the change, so it is unit-tested without a server.

Statements
==========

Every statement is parameterised, identifiers always quoted through
:class:`psycopg.sql.Identifier` and schema-qualified. Values are the exact
bytes the protocol carried, passed as ``$n`` parameters whose type OIDs are
the *target* columns' types (so the target's input function parses the
source's output text: no round trip through Python types), in text format
(``t``) or binary (``b``) as they came. One statement is prepared per
(mapping version, operation, shape); the shape is which columns take part:

* INSERT lists every column the change carries.
* UPDATE sets every new column except unchanged TOAST values (kind ``u``:
  the value was not sent and the target keeps its own).
* UPDATE/DELETE locate the row by the replica identity. DEFAULT and INDEX
  use the key columns the Relation flags, with the old key when the change
  carries one (the key changed) and the new row's key otherwise. FULL uses
  every sent column of the old row: ``=`` for a value, ``IS NULL`` for a NULL
  (one statement per pattern of NULLs; ``IS NOT DISTINCT FROM`` would be the
  same but can never use an index, so every change would scan the table),
  comparing ``::text`` for types without ``=``, and changes exactly
  one row even when the target holds duplicates:
  ``WHERE ctid = (SELECT ctid ... LIMIT 1)``, joined on ``tableoid`` too
  for partitioned targets where a ctid is only unique per partition.
  NOTHING cannot locate a row: UPDATE/DELETE raise :class:`ApplyError`.
  UPDATE and DELETE (with the FULL subselect and the merged form) name a
  plain table with ``ONLY``: with table inheritance a parent's statement must
  not reach a child's row with the same key, nor the child row at the same
  ctid (each inheritance child has its own changes in the stream).
* Multi-row INSERTs (:func:`insert_rows`): the rows of a run of INSERTs too
  short for COPY (:mod:`applier.apply.sql.copyrun`), in one VALUES list. Neither
  COPY nor multi-row INSERTs (nor merged UPDATEs, see
  :func:`~applier.apply.sql.mapping._mergeable`) for a target table with an
  enabled ALWAYS/REPLICA trigger or rule (:attr:`TargetTable.observed`): its
  changes go one statement per row, so rules fire (COPY ignores them) and
  statement triggers and transition tables see one row per statement.
* Merged UPDATEs (:mod:`applier.apply.batching.merge`): ``n`` rows of new values in
  one ``UPDATE ... FROM (VALUES ...) WHERE key = v.key RETURNING ordinal``,
  one statement per (mapping, SET shape, n); the ordinals returned say which
  rows were found. Held DELETEs by key likewise: ``DELETE ... USING (VALUES
  ...) WHERE key = v.key RETURNING ordinal`` (:meth:`Planner.delete_many`).
  Held FULL identity changes of a table no index can search:
  :mod:`applier.apply.batching.fullident`.
* TRUNCATE lists every included relation of the message in one statement,
  ``ONLY`` for plain tables (a partitioned target is truncated with its
  partitions), with RESTART IDENTITY when the source used it, and always
  RESTRICT, as worker.c: the message already lists every published relation
  the source's CASCADE reached, and cascading on the target would also empty
  target-only or excluded tables (the handler refuses those first).

Parameter formats are per execution, not per prepared statement, so a shape
does not depend on whether a value came as text or binary.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from applier.apply.sql.mapping import RelMap
from applier.apply.sql.stmt import (
    MAX_HELD_BYTES,
    MAX_PARAMS,
    Formats,
    Params,
    Stmt,
    changed_relation,
    compare,
    identity_tuple,
    insert_rows,
    key_of,
    max_rows,
    param_formats,
    placeholder,
    qualified,
    values_rows,
)
from applier.errors import ApplyError
from applier.protocol import Delete, Insert, TupleData, Update

#: ``kinds.translate(_PRESENT)``: 1 where a value is present (t/b/n), 0 for unchanged TOAST.
_PRESENT = bytes(0 if i == ord("u") else 1 for i in range(256))
#: ``kinds.translate(_FULL)``: how FULL identity compares each old value: 0 not at
#: all (unchanged TOAST), 1 with ``=``, 2 ``IS NULL`` (both can use an index).
_FULL = bytes(0 if i == ord("u") else 2 if i == ord("n") else 1 for i in range(256))
INSERT, UPDATE, DELETE = "i", "u", "d"


def _present(kinds: bytes) -> bytes:
    return kinds.translate(_PRESENT)


class Planner:
    """Builds and caches statements; the executor prepares each name once per session."""

    def __init__(self) -> None:
        #: Statements by (mapping version, operation, shape): the conflict planner and
        #: the FULL identity batches keep theirs here too, forgotten with the mapping.
        self.cache: dict[tuple[int, str, bytes, bytes], Stmt] = {}
        #: Statement names are never reused in a session (entries are forgotten).
        self._serial = itertools.count()
        #: (mapping version, new kinds, old kinds) -> statement and parameter formats:
        #: the column kinds decide both, so the hot path is one lookup per change.
        self._inserts: dict[tuple[int, bytes], tuple[Stmt, Formats]] = {}
        self._updates: dict[tuple[int, bytes, bytes | None], tuple[Stmt, Formats]] = {}
        self._deletes: dict[tuple[int, bytes], tuple[Stmt, Formats]] = {}

    # -- public ------------------------------------------------------------------

    def insert(self, rm: RelMap, change: Insert) -> tuple[Stmt, Params, Formats]:
        new = change.new
        hit = self._inserts.get((rm.version, new.kinds))
        if hit is None:
            # Kinds that differ only by NULLs share one statement (and so one COPY run).
            shape = _present(new.kinds)
            stmt = self.cache.get((rm.version, INSERT, shape, b"")) or self._build_insert(rm, shape)
            fmts = _fmt(new, stmt.new_idx) if b"b" in new.kinds else None
            hit = self._inserts[(rm.version, new.kinds)] = (stmt, fmts)
        stmt, fmts = hit
        values = new.values
        if stmt.all_new:
            return stmt, list(values), fmts
        return stmt, [values[i] for i in stmt.new_idx], fmts

    def all_columns_insert(self, rm: RelMap) -> Stmt | None:
        """The INSERT :meth:`insert` gives a row of ``rm`` without unchanged TOAST
        values, if it was built already (applier.apply.batching.insertlane)."""
        return self.cache.get((rm.version, INSERT, b"\x01" * len(rm.columns), b""))

    def update(self, rm: RelMap, change: Update) -> tuple[Stmt, Params, Formats]:
        new, old = change.new, change.old
        key = (rm.version, new.kinds, None if old is None else old.kinds)
        hit = self._updates.get(key)
        if hit is None:
            hit = self._updates[key] = self._plan_update(rm, change)
        stmt, fmts = hit
        nv = new.values
        ov = nv if old is None else old.values
        params: Params = [nv[i] for i in stmt.new_idx]
        params += [ov[i] for i in stmt.where_idx]
        return stmt, params, fmts

    def delete(self, rm: RelMap, change: Delete) -> tuple[Stmt, Params, Formats]:
        old = change.old
        hit = self._deletes.get((rm.version, old.kinds))
        if hit is None:
            self._check_identity(rm, "DELETE")
            old_shape = self._where_shape(rm, old, True)
            stmt = self.cache.get((rm.version, DELETE, b"", old_shape))
            if stmt is None:
                stmt = self._build_delete(rm, old_shape)
            fmts = _fmt(old, stmt.where_idx) if b"b" in old.kinds else None
            hit = self._deletes[(rm.version, old.kinds)] = (stmt, fmts)
        stmt, fmts = hit
        ov = old.values
        return stmt, [ov[i] for i in stmt.where_idx], fmts

    def _plan_update(self, rm: RelMap, change: Update) -> tuple[Stmt, Formats]:
        self._check_identity(rm, "UPDATE")
        new = change.new
        old = change.old if change.old is not None else new
        if change.old is None and rm.key:
            new_shape = self.set_shape(rm, new.kinds)
        else:
            new_shape = _present(new.kinds)
        old_shape = self._where_shape(rm, old, change.old is not None)
        stmt = self.cache.get((rm.version, UPDATE, new_shape, old_shape))
        if stmt is None:
            stmt = self._build_update(rm, new_shape, old_shape)
        binary = b"b" in new.kinds or b"b" in old.kinds
        fmts = _fmt(new, stmt.new_idx) + _fmt(old, stmt.where_idx) if binary else None
        return stmt, fmts

    def update_many(self, rm: RelMap, shape: bytes, n: int) -> Stmt:
        """UPDATE of ``n`` rows located by their (unchanged) key: ``shape`` as for
        :meth:`update`; parameters per row are the SET values then the key."""
        stmt = self.cache.get((rm.version, UPDATE, shape, b"n%d" % n))
        if stmt is None:
            stmt = self._build_update_many(rm, shape, n)
        return stmt

    def delete_many(self, rm: RelMap, n: int) -> Stmt:
        """DELETE of ``n`` rows located by their key; parameters per row are the key."""
        stmt = self.cache.get((rm.version, DELETE, b"", b"n%d" % n))
        if stmt is None:
            stmt = self._build_delete_many(rm, n)
        return stmt

    def forget(self, version: int) -> list[bytes]:
        """Drop what was planned for mapping ``version``; the names of its statements."""
        names = [stmt.name for key, stmt in self.cache.items() if key[0] == version]
        caches: tuple[dict[Any, Any], ...] = (
            self.cache, self._inserts, self._updates, self._deletes,
        )  # fmt: skip
        for cache in caches:
            for key in [k for k in cache if k[0] == version]:
                del cache[key]
        return names

    @staticmethod
    def set_shape(rm: RelMap, kinds: bytes) -> bytes:
        """The SET columns of an UPDATE that keeps its key (no old key part sent).

        The key columns did not change, so they stay out of SET. Besides saving
        work, a GENERATED ALWAYS identity key could not be SET at all (SQLSTATE 428C9).
        """
        shape = _present(kinds)
        masked = bytearray(shape)
        for i in rm.key:
            masked[i] = 0
        # A table of key columns only keeps them in SET (a no-op update that
        # still proves the row exists).
        return bytes(masked) if any(masked) else shape

    @staticmethod
    def truncate(rms: Sequence[RelMap], restart_identity: bool) -> bytes:
        """TRUNCATE of the message's included relations, never CASCADE (see module doc)."""
        q = sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(changed_relation(rm) for rm in rms))
        if restart_identity:
            q = sql.Composed([q, sql.SQL(" RESTART IDENTITY")])
        return sql.Composed([q, sql.SQL(" RESTRICT")]).as_bytes(None)

    # -- identity ----------------------------------------------------------------

    @staticmethod
    def _check_identity(rm: RelMap, op: str) -> None:
        if rm.replident == "n" or (rm.replident in "di" and not rm.key):
            raise ApplyError(
                f"table {rm.qualname} has REPLICA IDENTITY NOTHING (or no key): "
                f"cannot locate the row for {op}",
                table=rm.qualname,
                hint="give the source table a primary key or REPLICA IDENTITY FULL/INDEX",
            )

    @staticmethod
    def _where_shape(rm: RelMap, old: TupleData, has_old: bool) -> bytes:
        if rm.replident == "f" and has_old:
            return b"f" + old.kinds.translate(_FULL)
        return b"k"

    def _where_cols(self, rm: RelMap, old_shape: bytes) -> tuple[int, ...]:
        if old_shape.startswith(b"f"):
            return tuple(i for i, p in enumerate(old_shape[1:]) if p)
        return rm.key

    # -- building ----------------------------------------------------------------

    def statement_name(self, rm: RelMap, op: str) -> bytes:
        """A new prepared statement's name, unique in the session (its mapping's version)."""
        return f"applier_{rm.version}_{op}{next(self._serial)}".encode()

    def _build_insert(self, rm: RelMap, shape: bytes) -> Stmt:
        idx = tuple(i for i, p in enumerate(shape) if p)
        cols = [sql.Identifier(rm.columns[i].name) for i in idx]
        # OVERRIDING SYSTEM VALUE: the source already chose the value of a
        # GENERATED ALWAYS identity column; without it the target refuses the
        # row (SQLSTATE 428C9). It is a no-op for tables without identity.
        head = sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE VALUES ").format(
            qualified(rm), sql.SQL(", ").join(cols)
        )
        q = sql.SQL("{}({})").format(
            head, sql.SQL(", ").join(placeholder(n) for n in range(1, len(idx) + 1))
        )
        # COPY writes identity columns like OVERRIDING SYSTEM VALUE. It refuses
        # tables where row-level security applies, so those keep INSERT. A table
        # something watches (an ALWAYS/REPLICA trigger or rule) gets one INSERT per
        # row: COPY fires no rules, and COPY or a multi-row INSERT fire statement
        # triggers (and fill transition tables) once for many rows and AFTER ROW
        # triggers after all of them; no copy statement means no run, so neither.
        copy = b""
        if rm.target is not None and not rm.target.rls and not rm.target.observed:
            copy = (
                sql.SQL("COPY {} ({}) FROM STDIN")
                .format(qualified(rm), sql.SQL(", ").join(cols))
                .as_bytes(None)
            )
        stmt = Stmt(
            self.statement_name(rm, INSERT),
            q.as_bytes(None),
            tuple(rm.columns[i].type_oid for i in idx),
            idx,
            (),
            False,
            len(idx) == len(rm.columns),
            copy,
            head.as_bytes(None),
        )
        self.cache[(rm.version, INSERT, shape, b"")] = stmt
        return stmt

    def _conditions(
        self, rm: RelMap, where: tuple[int, ...], first: int, old_shape: bytes
    ) -> sql.Composable:
        """The key's columns ``=`` their parameters; for FULL, a NULL old value is
        ``IS NULL`` (its parameter, NULL, stays unused) so that every condition can
        use an index (``IS NOT DISTINCT FROM`` never does: a scan per change)."""
        full = old_shape.startswith(b"f")
        conds: list[sql.Composable] = []
        for n, i in enumerate(where, start=first):
            ident = sql.Identifier(rm.columns[i].name)
            if full and old_shape[1 + i] == 2:
                conds.append(sql.Composed([ident, sql.SQL(" IS NULL")]))
            else:
                conds.append(compare(rm.columns[i], ident, placeholder(n)))
        if not conds:
            return sql.SQL("true")
        return sql.SQL(" AND ").join(conds)

    def _locate(
        self,
        rm: RelMap,
        head: sql.Composable,
        where: tuple[int, ...],
        first: int,
        old_shape: bytes,
        join: str = "USING",
    ) -> sql.Composable:
        """``head`` + a WHERE clause that hits the identity's row (exactly one for FULL)."""
        full = old_shape.startswith(b"f")
        cond = self._conditions(rm, where, first, old_shape)
        if not full:
            return sql.Composed([head, sql.SQL(" WHERE "), cond])
        q = changed_relation(rm)
        if rm.target is not None and rm.target.partitioned:
            return sql.SQL(
                "{head} {join} (SELECT tableoid AS o, ctid AS c FROM {q} WHERE {cond} LIMIT 1) "
                "AS applier_r WHERE applier_t.tableoid = applier_r.o "
                "AND applier_t.ctid = applier_r.c"
            ).format(head=head, join=sql.SQL(join), q=q, cond=cond)
        return sql.SQL("{head} WHERE ctid = (SELECT ctid FROM {q} WHERE {cond} LIMIT 1)").format(
            head=head, q=q, cond=cond
        )

    def _build_update(self, rm: RelMap, new_shape: bytes, old_shape: bytes) -> Stmt:
        new_idx = tuple(i for i, p in enumerate(new_shape) if p)
        where = self._where_cols(rm, old_shape)
        full = old_shape.startswith(b"f")
        partitioned = full and rm.target is not None and rm.target.partitioned
        sets = sql.SQL(", ").join(
            sql.Composed([sql.Identifier(rm.columns[i].name), sql.SQL(" = "), placeholder(n)])
            for n, i in enumerate(new_idx, start=1)
        )
        if partitioned:
            head = sql.SQL("UPDATE {} AS applier_t SET {}").format(changed_relation(rm), sets)
            body = self._locate(rm, head, where, len(new_idx) + 1, old_shape, join="FROM")
            query = body.as_bytes(None)
        else:
            head = sql.SQL("UPDATE {} SET {}").format(changed_relation(rm), sets)
            query = self._locate(rm, head, where, len(new_idx) + 1, old_shape).as_bytes(None)
        types = tuple(rm.columns[i].type_oid for i in new_idx + where)
        stmt = Stmt(self.statement_name(rm, UPDATE), query, types, new_idx, where, True, False)
        self.cache[(rm.version, UPDATE, new_shape, old_shape)] = stmt
        return stmt

    def _build_update_many(self, rm: RelMap, shape: bytes, n: int) -> Stmt:
        new_idx = tuple(i for i, p in enumerate(shape) if p)
        cols = new_idx + rm.key
        width = len(cols)
        names = [sql.Identifier(f"c{j}") for j in range(width)]
        rows = values_rows(n, width)
        v = sql.Identifier("applier_v")
        sets = sql.SQL(", ").join(
            sql.SQL("{} = {}.{}").format(sql.Identifier(rm.columns[i].name), v, names[j])
            for j, i in enumerate(new_idx)
        )
        t = sql.Identifier("applier_t")
        match = sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}.{}").format(
                t, sql.Identifier(rm.columns[i].name), v, names[len(new_idx) + j]
            )
            for j, i in enumerate(rm.key)
        )
        query = sql.SQL(
            "UPDATE {q} AS {t} SET {sets} FROM (VALUES {rows}) AS {v} (applier_o, {names}) "
            "WHERE {match} RETURNING {v}.applier_o"
        ).format(
            q=changed_relation(rm), t=t, sets=sets, rows=rows, v=v,
            names=sql.SQL(", ").join(names), match=match,
        )  # fmt: skip
        types = tuple(rm.columns[i].type_oid for i in cols) * n
        stmt = Stmt(
            self.statement_name(rm, UPDATE),
            query.as_bytes(None),
            types,
            new_idx,
            rm.key,
            True,
            False,
        )
        self.cache[(rm.version, UPDATE, shape, b"n%d" % n)] = stmt
        return stmt

    def _build_delete_many(self, rm: RelMap, n: int) -> Stmt:
        width = len(rm.key)
        names = [sql.Identifier(f"c{j}") for j in range(width)]
        v, t = sql.Identifier("applier_v"), sql.Identifier("applier_t")
        match = sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}.{}").format(t, sql.Identifier(rm.columns[i].name), v, names[j])
            for j, i in enumerate(rm.key)
        )
        query = sql.SQL(
            "DELETE FROM {q} AS {t} USING (VALUES {rows}) AS {v} (applier_o, {names}) "
            "WHERE {match} RETURNING {v}.applier_o"
        ).format(
            q=changed_relation(rm), t=t, rows=values_rows(n, width), v=v,
            names=sql.SQL(", ").join(names), match=match,
        )  # fmt: skip
        types = tuple(rm.columns[i].type_oid for i in rm.key) * n
        stmt = Stmt(
            self.statement_name(rm, DELETE), query.as_bytes(None), types, (), rm.key, True, False
        )
        self.cache[(rm.version, DELETE, b"", b"n%d" % n)] = stmt
        return stmt

    def _build_delete(self, rm: RelMap, old_shape: bytes) -> Stmt:
        where = self._where_cols(rm, old_shape)
        full = old_shape.startswith(b"f")
        if full and rm.target is not None and rm.target.partitioned:
            head = sql.SQL("DELETE FROM {} AS applier_t").format(changed_relation(rm))
        else:
            head = sql.SQL("DELETE FROM {}").format(changed_relation(rm))
        query = self._locate(rm, head, where, 1, old_shape).as_bytes(None)
        types = tuple(rm.columns[i].type_oid for i in where)
        stmt = Stmt(self.statement_name(rm, DELETE), query, types, (), where, True, False)
        self.cache[(rm.version, DELETE, b"", old_shape)] = stmt
        return stmt


def _fmt(tup: TupleData, idx: tuple[int, ...]) -> bytes:
    return param_formats(tup.kinds, idx)


__all__ = [
    "DELETE",
    "INSERT",
    "MAX_HELD_BYTES",
    "MAX_PARAMS",
    "UPDATE",
    "Formats",
    "Params",
    "Planner",
    "Stmt",
    "compare",
    "identity_tuple",
    "insert_rows",
    "key_of",
    "max_rows",
    "param_formats",
    "values_rows",
]
