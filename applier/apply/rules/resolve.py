"""Conflicts met and changes skipped: what the handlers do with them.

:class:`Resolver`, a part the :class:`~applier.apply.handlers.dispatch.Applier` owns,
decides about changes the target disagrees with (:mod:`applier.apply.rules.conflicts`, policies
in :mod:`applier.apply.rules.policies`) and changes a rule says not to apply
(:mod:`applier.apply.rules.skiprules`).

Careful replay
==============

A change that fails inside the pipeline aborts its whole target transaction,
and nothing after it runs until the Sync: no savepoint can be used without a
round trip per change. So the fast path has none. When a failure is one an
error rule or a policy could resolve (a unique violation of an UPDATE under
update_exists = skip, a failing change under ``applier skip add --error``),
the worker rolls back and replays from the origin, one transaction at a time,
up to the last position received, *carefully*: each change runs inside
``SAVEPOINT`` and is waited for (:meth:`TargetSession.attempt`). A change that
fails is rolled back to its savepoint; if a rule or policy takes it, it is
recorded (skipped_changes or conflict_log) and the transaction goes on,
otherwise the error stops the worker as before. Past that position the fast
path resumes.

Stopping on a conflict
======================

A conflict under policy ``error`` raises :class:`ApplyError` naming the
conflict type, and is recorded on its own (the catalog connection, autocommit:
the target transaction is rolled back): the unique key of ``conflict_log`` keeps
the restarts that meet it again from adding rows. Every error that stops the
worker names the transaction's finish LSN and the command that skips it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
from psycopg import pq, sql

from applier.apply.core.states import ChangeCtx, Txn, op_of
from applier.apply.core.tally import Tally
from applier.apply.rules.conflictlog import (
    LOG_CONFLICT,
    Conflict,
    as_param,
    conflict_params,
    key_json,
    remote_json,
    row_json,
)
from applier.apply.rules.conflicttype import ConflictType
from applier.apply.rules.policies import (
    DELETE_MISSING,
    DELETE_ORIGIN,
    INSERT_EXISTS,
    MULTIPLE,
    UPDATE_EXISTS,
    UPDATE_MISSING,
    UPDATE_ORIGIN,
    Policies,
)
from applier.apply.rules.skiprules import KEEP_DDL, Kept, KeptDdl, Rule, SkipRules, ddl_params
from applier.apply.sql.mapping import RelMap
from applier.apply.sql.planner import Stmt
from applier.apply.sql.stmt import changed_relation
from applier.apply.target.pipeline import error_fields
from applier.apply.target.session import TargetSession
from applier.config import Config
from applier.errors import ApplyError
from applier.lsn import Lsn, pg_timestamp
from applier.protocol import Insert, Truncate, Update

log = logging.getLogger("applier.apply")

KEEP = Stmt(
    b"applier_skipped_change",
    b"INSERT INTO applier.skipped_changes (origin, rule_id, xid, commit_lsn, end_lsn, "
    b"change_lsn, change_no, commit_time, schema_name, table_name, op, skipped, key, "
    b"old_row, new_row, error, sqlstate) VALUES "
    b"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    (25, 20, 20, 3220, 3220, 3220, 23, 1184, 25, 25, 25, 16, 3802, 3802, 3802, 25, 25),
    (),
    (),
    False,
    False,
)
RULE_DONE = Stmt(
    b"applier_skip_rule_done",
    b"UPDATE applier.skip_rules SET done = true, done_at = pg_catalog.now(), "
    b"done_end_lsn = $1, done_gid = $2 WHERE id = $3",
    (3220, 25, 20),
    (),
    (),
    False,
    False,
)

#: LOG_CONFLICT for the catalog connection (psycopg placeholders).
_LOG_ALONE = LOG_CONFLICT.query.decode().split(" VALUES ")[0] + (
    " VALUES (%s, %s, %s::pg_catalog.pg_lsn, %s::pg_catalog.pg_lsn, %s::pg_catalog.pg_lsn, "
    "%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb) "
    "ON CONFLICT (origin, commit_lsn, change_no, conflict) DO NOTHING"
)


class ResolverHost(Protocol):
    """What the resolver reads of the engine that owns it (the Applier)."""

    @property
    def txn(self) -> Txn | None: ...
    @property
    def rules(self) -> SkipRules: ...
    @property
    def tally(self) -> Tally: ...

    skipped_changes: int


class Resolver:
    """Conflicts, careful replay and skip rules: what the handlers do with a change the
    target disagrees with, or a rule says not to apply."""

    def __init__(
        self,
        host: ResolverHost,
        cfg: Config,
        session: TargetSession,
        policies: Policies,
        catalog_conn: psycopg.Connection[Any],
        our_origin_id: int | None,
    ) -> None:
        self.host = host
        self.cfg = cfg
        self.session = session
        self.policies = policies
        self.catalog_conn = catalog_conn
        self.our_origin_id = our_origin_id
        #: Conflicts of the open target transaction, written before its commit.
        self.conflicts: list[Conflict] = []
        #: UPDATEs and DELETEs that found no row (applier.apply.beat logs them).
        self.missing_rows = 0

    def discard(self) -> None:
        """The target transaction was rolled back: its conflicts with it."""
        self.conflicts = []

    def take_conflicts(self) -> list[Conflict]:
        """The conflicts met so far (at a commit's result), no longer in hand."""
        late, self.conflicts = self.conflicts, []
        return late

    # -- conflicts found in results (pipeline callbacks) ---------------------------------

    def missing_row(self, ctx: ChangeCtx) -> None:
        self.missing_rows += 1
        is_update = isinstance(ctx.change, Update)
        kind = UPDATE_MISSING if is_update else DELETE_MISSING
        policy = "skip" if ctx.rm.policy is None else ctx.rm.policy[kind]
        if policy == "error":
            raise self._conflict_error(ctx, kind, None)
        if policy == "apply_remote":
            raise self._conflict_error(
                ctx,
                kind,
                None,
                why="the UPDATE found no row and the message lacks unchanged TOAST values "
                "(the source did not send them), so the row cannot be inserted",
            )
        log.warning(
            "%s found no row on the target; skipped",
            "UPDATE" if is_update else "DELETE",
            extra={"ctx": ctx.describe()},
        )
        self.conflicts.append(Conflict(ctx, kind, "skip", None))

    def insert_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        """A checked INSERT: (rows written, local rows met, or NULL)."""
        raw = res.get_value(0, 1)
        if raw is not None or not int(res.get_value(0, 0) or 0):
            self._insert_met(ctx, raw)

    def rows_checked(self, group: Any, res: pq.abc.PGresult) -> None:
        """A multi-row checked INSERT: (ordinal, local rows) per row not inserted."""
        for r in range(res.ntuples):
            self._insert_met(group.ctxs[int(res.get_value(r, 0) or 0) - 1], res.get_value(r, 1))

    def _insert_met(self, ctx: ChangeCtx, raw: bytes | None) -> None:
        """An INSERT that met local rows (``raw``: their jsonb array, if read)."""
        local = json.loads(raw) if raw else None
        kind = MULTIPLE if local is not None and len(local) > 1 else INSERT_EXISTS
        self._met(ctx, kind, ctx.rm.policy[kind], _one(local))

    def upsert_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        """update_missing = apply_remote: (rows the UPDATE found, local rows holding a
        unique key of the new row when it found none). One such row was set to the new
        row; several are multiple_unique_conflicts, and nothing was written."""
        if int(res.get_value(0, 0) or 0):
            return
        self.missing_rows += 1
        raw = res.get_value(0, 1)
        local = json.loads(raw) if raw else None
        if local is not None and len(local) > 1:
            self._met(ctx, MULTIPLE, ctx.rm.policy[MULTIPLE], _one(local))
        else:
            self._met(ctx, UPDATE_MISSING, "apply_remote", _one(local))

    def _met(self, ctx: ChangeCtx, kind: ConflictType, policy: str, local: str | None) -> None:
        """A conflict the statement resolved by ``policy`` (or left for ``error``)."""
        if policy == "error":
            raise self._conflict_error(ctx, kind, local)
        self.conflicts.append(Conflict(ctx, kind, policy, local))

    def origin_checked(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> None:
        if res.ntuples == 0:
            self.missing_row(ctx)
            return
        roident = res.get_value(0, 0)
        if roident is None or int(roident) == self.our_origin_id:
            return
        kind = UPDATE_ORIGIN if isinstance(ctx.change, Update) else DELETE_ORIGIN
        policy = ctx.rm.policy[kind]
        raw = res.get_value(0, 1)
        local = raw.decode() if raw else None
        if policy == "error":
            raise self._conflict_error(ctx, kind, local)
        self.conflicts.append(Conflict(ctx, kind, policy, local))

    def _conflict_error(
        self, ctx: ChangeCtx, kind: ConflictType, local: str | None, why: str | None = None
    ) -> ApplyError:
        self.record_alone(Conflict(ctx, kind, "error", local))
        err = ApplyError(
            f"conflict {kind} on {ctx.rm.qualname}: " + (why or _WHAT[kind]),
            conflict=kind,
            finish_lsn=str(Lsn(ctx.txn.commit_lsn)),
            **ctx.describe(),
            hint=f"resolve it on the target (or set [conflicts] {kind} for this table) and "
            "restart applier run",
        )
        err.change_ctx = ctx  # type: ignore[attr-defined]
        return err

    def record_alone(self, c: Conflict) -> None:
        """Write a conflict that stops the worker, outside the target transaction."""
        try:
            self.catalog_conn.execute(
                _LOG_ALONE,
                [None if v is None else v.decode() for v in conflict_params(self.cfg.origin, c)],
            )
        except psycopg.Error as e:
            log.warning("could not record the conflict: %s", e)

    def explain_failure(self, e: ApplyError) -> None:
        """Name a unique violation as the conflict it is, record it; add the skip hint."""
        ctx = getattr(e, "change_ctx", None)
        state = e.context.get("sqlstate")
        if getattr(ctx, "change", None) is None or getattr(ctx, "txn", None) is None:
            ctx = None  # a COMMIT, a guard, a multi-row statement: no one change
        if (
            ctx is not None
            and state == "23505"
            and "conflict" not in e.context
            and op_of(ctx.change) in ("insert", "update")
        ):
            # The apply session is failed: what is committed, from the catalog's.
            kind, local = self._unique_conflict(ctx, self.catalog_conn)
            e.context["conflict"] = kind
            e.message = f"conflict {kind}: {e.message}"
            self.record_alone(Conflict(ctx, kind, "error", local))
        finish = e.context.get("finish_lsn")
        if finish is not None:
            path = self.cfg.path or "F"
            skip = f"applier skip add --config {path} --lsn {finish}"
            e.context["skip_command"] = skip
            e.hint = (e.hint + "; or " if e.hint else "") + f"skip this transaction: {skip}"

    # -- careful replay -----------------------------------------------------------------

    def catchable(self, e: ApplyError) -> bool:
        """Whether a rule or policy could take this failure (see "Careful replay")."""
        state = e.context.get("sqlstate")
        table = e.context.get("table")
        if self.host.rules.has_error and self.host.rules.may_catch(table, state):
            return True
        if state == "23505" and isinstance(table, str) and "." in table:
            schema, name = table.split(".", 1)
            return self.policies.for_table(schema, name).catches_unique
        return False

    def careful(self, ctx: ChangeCtx, send: Callable[[], None]) -> None:
        self.session.attempt(send, lambda res: self._caught(ctx, res))

    def _caught(self, ctx: ChangeCtx, res: pq.abc.PGresult) -> bool:
        state, msg = error_fields(res)
        op = op_of(ctx.change)
        rule = self.host.rules.error_rule(ctx.rm.qualname, op, state)
        if rule is not None:
            log.warning(
                "a failing change was skipped by %s: %s",
                rule.describe(),
                msg,
                extra={"ctx": {**ctx.describe(), "sqlstate": state}},
            )
            self.host.skipped_changes += 1
            self.host.tally.skip(ctx.rm.qualname, "error_rule")
            self.host.tally.unapply(ctx.rm.relation.oid, op)
            self.keep(ctx, rule, error=msg, sqlstate=state)
            return True
        policy = ctx.rm.policy
        if state == "23505" and policy is not None and op in ("insert", "update"):
            kind, local = self._unique_conflict(ctx, self.session.conn)
            if policy[kind] in ("skip", "keep_local"):
                log.warning("conflict %s: kept the local row", kind, extra={"ctx": ctx.describe()})
                self.conflicts.append(Conflict(ctx, kind, policy[kind], local))
                return True
        return False

    def _unique_conflict(
        self, ctx: ChangeCtx, conn: psycopg.Connection[Any]
    ) -> tuple[ConflictType, str | None]:
        """A unique violation of an INSERT/UPDATE as the conflict it is, and the local
        row(s) it met (one row as an object, several as an array)."""
        raw = self._local_rows(ctx, conn)
        local = None if raw is None else json.loads(raw)
        if local is not None and len(local) > 1:
            kind = MULTIPLE
        else:
            kind = INSERT_EXISTS if isinstance(ctx.change, Insert) else UPDATE_EXISTS
        return kind, _one(local)

    def _local_rows(self, ctx: ChangeCtx, conn: psycopg.Connection[Any]) -> str | None:
        """The target rows that hold a unique key of the change's new row (jsonb array)."""
        rm: RelMap = ctx.rm
        new = getattr(ctx.change, "new", None)
        if rm.target is None or new is None:
            return None
        conds: list[sql.Composable] = []
        params: list[str | None] = []
        for cols in rm.target.unique_sets:
            if cols is None:
                continue
            idx = [i for i, c in enumerate(rm.columns) if c.name in cols]
            if len(idx) != len(cols) or any(new.kinds[i] != ord("t") for i in idx):
                continue
            conds.append(
                sql.SQL("({})").format(
                    sql.SQL(" AND ").join(
                        sql.SQL("{}::pg_catalog.text = %s").format(
                            sql.Identifier(rm.columns[i].name)
                        )
                        for i in idx
                    )
                )
            )
            params += [bytes(new.values[i] or b"").decode("utf-8", "replace") for i in idx]
        if not conds:
            return None
        where: sql.Composable = sql.SQL(" OR ").join(conds)
        change = ctx.change
        if isinstance(change, Update) and rm.key:
            # Not the updated row itself (it holds its own key).
            own = change.old if change.old is not None else change.new
            if all(own.kinds[i] == ord("t") for i in rm.key):
                mine = sql.SQL(" AND ").join(
                    sql.SQL("{}::pg_catalog.text = %s").format(sql.Identifier(rm.columns[i].name))
                    for i in rm.key
                )
                where = sql.SQL("({}) AND NOT ({})").format(where, mine)
                params += [bytes(own.values[i] or b"").decode("utf-8", "replace") for i in rm.key]
        query = sql.SQL(
            "SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(applier_x))::text "
            "FROM {} AS applier_x WHERE {}"
        ).format(changed_relation(rm), where)
        try:
            row = conn.execute(query, params).fetchone()
        except psycopg.Error as e:
            log.debug("looking up the local rows failed: %s", e)
            if conn is self.session.conn:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK TO SAVEPOINT applier_change")
            return None
        return None if row is None or row[0] is None else str(row[0])

    # -- skipped changes -----------------------------------------------------------------

    def keep(
        self, ctx: ChangeCtx, rule: Rule | None, skipped: bool = True, **error: str | None
    ) -> None:
        if rule is not None and rule.dump == "none":
            return
        txn = self.host.txn
        assert txn is not None
        txn.kept.append(Kept(ctx, rule, skipped, error.get("error"), error.get("sqlstate")))

    def finish_records(self, txn: Txn, end_lsn: Lsn) -> None:
        """At a source transaction's end: its kept changes, and its txn rule marked done."""
        txn.end_lsn = end_lsn
        if not txn.kept and txn.rule is None:
            return
        if not self.session.in_txn:
            self.session.begin()
        dump_all = any(k.rule is not None and k.rule.dump == "all" for k in txn.kept)
        if dump_all and txn.seen:
            skipped = {id(k.ctx) for k in txn.kept if isinstance(k, Kept)}
            txn.kept += [Kept(c, None, False) for c in txn.seen if id(c) not in skipped]
            txn.kept.sort(key=lambda k: k.no)
        for k in txn.kept:
            if isinstance(k, KeptDdl):
                self._keep_ddl(txn, k, end_lsn)
                continue
            self.session.execute(KEEP, self._kept_params(txn, k, end_lsn), None, k.ctx)
        if txn.rule is not None:
            rule = txn.rule
            params = [str(Lsn(end_lsn)).encode(), as_param(txn.gid), str(rule.id).encode()]
            self.session.execute(RULE_DONE, params, None, "marking the skip rule done")
            self.host.rules.done(rule)
            log.warning(
                "skipped a whole transaction by %s",
                rule.describe(),
                extra={"ctx": {"xid": txn.xid, "finish_lsn": str(Lsn(txn.commit_lsn))}},
            )

    def _keep_ddl(self, txn: Txn, k: KeptDdl, end_lsn: Lsn) -> None:
        """A skipped DDL statement: kept (unless dump none), its ddl rule marked done."""
        rule = k.rule
        if rule.dump != "none":
            params = ddl_params(self.cfg.origin, txn, k, end_lsn)
            self.session.execute(KEEP_DDL, params, None, "keeping a skipped DDL statement")
        if rule.kind == "ddl":
            params = [str(Lsn(end_lsn)).encode(), as_param(txn.gid), str(rule.id).encode()]
            self.session.execute(RULE_DONE, params, None, "marking the skip rule done")
            self.host.rules.done(rule)

    def _kept_params(self, txn: Txn, k: Kept, end_lsn: Lsn) -> list[bytes | None]:
        ctx = k.ctx
        rm = ctx.rm
        change = ctx.change
        old = getattr(change, "old", None)
        new = getattr(change, "new", None)
        return [
            self.cfg.origin.encode(),
            None if k.rule is None else str(k.rule.id).encode(),
            str(txn.xid).encode(),
            str(Lsn(txn.commit_lsn)).encode(),
            str(Lsn(end_lsn)).encode(),
            str(Lsn(ctx.lsn)).encode(),
            str(ctx.no).encode(),
            pg_timestamp(txn.commit_ts).isoformat().encode() if txn.commit_ts else None,
            rm.relation.namespace.encode(),
            rm.relation.name.encode(),
            op_of(change).encode(),
            b"t" if k.skipped else b"f",
            as_param(None if isinstance(change, Truncate) else key_json(rm, change)),
            as_param(row_json(rm, old)),
            as_param(row_json(rm, new)),
            as_param(k.error),
            as_param(k.sqlstate),
        ]

    def flush_conflicts(self) -> None:
        """Before a commit or prepare: read the results that may report conflicts, and
        write the conflicts of the transaction into it."""
        self.session.flush_checks()
        if not self.conflicts:
            return
        conflicts, self.conflicts = self.conflicts, []
        self.host.tally.conflicts_met(conflicts)
        origin = self.cfg.origin
        for c in conflicts:
            self.session.execute(LOG_CONFLICT, conflict_params(origin, c), None, c.ctx)


_WHAT = {
    INSERT_EXISTS: "the row already exists on the target",
    UPDATE_EXISTS: "the new row takes a unique key another target row holds",
    MULTIPLE: "the row collides with several target rows on different unique keys",
    UPDATE_MISSING: "the row to update does not exist on the target",
    DELETE_MISSING: "the row to delete does not exist on the target",
    UPDATE_ORIGIN: "the target row was last written by someone else (another origin)",
    DELETE_ORIGIN: "the target row was last written by someone else (another origin)",
}


def _one(local: list[Any] | None) -> str | None:
    if local is None:
        return None
    return json.dumps(local[0] if len(local) == 1 else local, ensure_ascii=False)


__all__ = ["KEEP", "RULE_DONE", "Resolver", "ResolverHost", "op_of", "remote_json"]
