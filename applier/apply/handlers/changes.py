"""Row changes: Insert, Update, Delete and Truncate messages -> statements on the target.

:class:`RowChanges`, a part the :class:`~applier.apply.handlers.dispatch.Applier` owns,
turns one change into work for the session: it finds the change's table mapping (an excluded table
or a skip rule ends it here, counted and kept as the rule says), checks the
tuple's width against the Relation message (a :class:`ProtocolError` before
anything of the transaction commits), and sends the plain statement, a
policy-checked one (:mod:`applier.apply.rules.conflicts`), a held UPDATE or DELETE
(:mod:`applier.apply.batching.merge`, :mod:`applier.apply.batching.fullident`) or, in a careful
replay, a statement under its own savepoint (:mod:`applier.apply.rules.resolve`).
TRUNCATE never cascades on the target. Transaction boundaries, dispatch and group commit stay in
:mod:`applier.apply.handlers.dispatch`. It reads the Applier through
:class:`ChangesHost` (which the lanes it hands changes to read too) and calls
the resolver through :class:`~applier.apply.handlers.ports.Resolution`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from applier.apply.batching.host import LaneHost
from applier.apply.batching.insertlane import offer_insert_run
from applier.apply.batching.merge import AGAIN, UpdateMerger
from applier.apply.batching.mergelane import SEND, hold_update
from applier.apply.batching.paths import paths_of
from applier.apply.core.states import ChangeCtx, Txn
from applier.apply.handlers.ports import Resolution
from applier.apply.rules.conflicts import CheckedRows, ConflictPlanner
from applier.apply.sql.mapping import Catalog, RelMap
from applier.apply.sql.planner import Planner
from applier.apply.sql.stmt import MAX_HELD
from applier.apply.target.session import TargetSession
from applier.errors import ApplyError, ProtocolError, TransientError
from applier.lsn import Lsn
from applier.protocol import Delete, Insert, InsertRun, Truncate, Update, decode_insert


class ChangesHost(LaneHost, Protocol):
    """What the row-change handlers read and count of the Applier (and hand the lanes)."""

    skipped_changes: int

    @property
    def relations(self) -> dict[int, Any]: ...

    def relmap(self, oid: int, lsn: Lsn) -> RelMap:
        """The mapping of ``oid`` (built at its first change)."""


class RowChanges:
    """One handler per row change: INSERT, UPDATE, DELETE, TRUNCATE, and runs of INSERTs."""

    def __init__(
        self,
        host: ChangesHost,
        resolution: Resolution,
        session: TargetSession,
        planner: Planner,
        cplanner: ConflictPlanner,
        merger: UpdateMerger,
        catalog: Catalog,
    ) -> None:
        self.host = host
        self.resolution = resolution
        self.session = session
        self.planner = planner
        self.cplanner = cplanner
        self.merger = merger
        self.catalog = catalog
        # The Applier's own dicts (filled by it, read here per change).
        self.relmaps = host.relmaps
        self.relations = host.relations
        self.paths = host.paths

    def _target(self, lsn: Lsn, oid: int, m: Any, op: str) -> ChangeCtx | None:
        """The change's context, or None when it is not to be applied (already applied,
        excluded table, skipped by a rule: then kept as the rule says)."""
        txn = self.host.txn
        assert txn is not None
        if txn.skip:
            return None
        # Tables sync-tables copies (applier.apply.rules.tablesync): one lookup per change;
        # the decision by name only at a relation's first change (a mapping miss).
        rm = self.relmaps.get(oid)
        syncs = self.host.syncs
        cut = (
            syncs.cut.get(oid)
            if rm is not None
            else syncs.classify(oid, self.relations.get(oid), lsn, txn.xid)
        )
        if cut is not None and txn.commit_lsn < cut:
            self.host.skipped_changes += 1
            self.host.tally.skip(
                rm.qualname if rm is not None else syncs.qualname(oid), "table_sync"
            )
            return None
        if rm is None:
            rm = self.host.relmap(oid, lsn)
        if not rm.included:
            self.host.skipped_changes += 1
            self.host.tally.skip(rm.qualname, "excluded")
            return None
        if op != "truncate":  # before any rule: a corrupt stream is an error, kept or not
            self._check_width(lsn, rm, m)
        txn.n += 1
        ctx = ChangeCtx(lsn, txn, rm, m)
        if txn.rule is not None:
            self.host.skipped_changes += 1
            self.host.tally.skip(rm.qualname, "transaction_rule")
            self.resolution.keep(ctx, txn.rule)
            return None
        if self.host.rules.has_object:
            skips = self.host.rules.for_table(rm.qualname)
            if skips is not None and op in skips.by_op:
                self.host.skipped_changes += 1
                self.host.tally.skip(rm.qualname, "table_rule")
                self.resolution.keep(ctx, skips.by_op[op])
                return None
        counts, k = self.host.tally.changes, (oid, op)  # per table and op: applier.apply.core.tally
        counts[k] = counts.get(k, 0) + 1
        if txn.seen is not None:
            txn.seen.append(ctx)
        if not self.session.in_txn:
            self.session.begin()
        return ctx

    def _check_width(self, lsn: Lsn, rm: RelMap, m: Insert | Update | Delete) -> None:
        """The change's tuples have as many values as its Relation message has columns."""
        width = len(rm.columns)
        if isinstance(m, Update):
            tuples = (m.new, m.old)
        else:
            tuples = (m.new, None) if isinstance(m, Insert) else (m.old, None)
        for tup in tuples:
            if tup is not None and len(tup.kinds) != width:
                raise self._width_error(lsn, rm, len(tup.kinds))

    def _width_error(self, lsn: Lsn, rm: RelMap, got: int) -> ProtocolError:
        want = len(rm.relation.columns)
        return ProtocolError(
            f"a change for {rm.qualname} carries {got} column values, its Relation message "
            f"has {want} columns",
            lsn=str(Lsn(lsn)),
            xid=self._xid(),
            table=rm.qualname,
            hint="the stream is corrupt or out of order; nothing of this transaction was "
            "applied, applier run restarts from the origin",
        )

    def on_insert(self, lsn: Lsn, m: Insert) -> None:
        ctx = self._target(lsn, m.relation_oid, m, "insert")
        if ctx is None:
            return
        rm, txn = ctx.rm, ctx.txn
        if self.merger.tables:
            self._before_change(rm)
        session = self.session
        runs = (self.paths.get(rm.version) or paths_of(self.host, rm, txn)).runs
        if rm.policy is not None and rm.policy.checked_insert:
            stmt, params, fmts = self._planned(ctx, self.cplanner.insert, txn.commit_ts)
            ctx.check = self.resolution.insert_checked
            if session.multi_row and runs and self.cplanner.batchable(rm, stmt):
                new = m.new.values
                ctx.key = tuple([new[i] for i in rm.key])
                session.insert_checked(stmt, params, fmts, ctx, self._checked_rows)
                return
            self._send(ctx, lambda: session.execute(stmt, params, fmts, ctx, checked=True))
            return
        stmt, params, fmts = self.planner.insert(rm, m)
        if self.host.careful:
            self.resolution.careful(ctx, lambda: session.execute(stmt, params, fmts, ctx))
        elif runs:
            session.insert(stmt, params, fmts, ctx)
        else:
            session.execute(stmt, params, fmts, ctx)

    def on_insert_run(self, lsn: Lsn, m: InsertRun) -> None:
        """Inserts into one relation in a row: the first through :meth:`on_insert`, the
        others through the insert lane (applier.apply.batching.insertlane) where it takes them;
        in a transaction applied before, the others are only decoded (checked)."""
        self.on_insert(lsn, m.first)
        txn = self.host.txn
        if txn is None or txn.skip:  # applied already: so is every row of it
            # Each row decoded all the same, as the stream decodes every Insert
            # outside a run (of a run's rows it read only the head): a corrupt
            # stream is an error, skipped or not.
            for data in m.datas:
                decode_insert(data)
            return
        # Whether the lane may take any of them is the same for every row: asked once.
        rm = self.relmaps.get(m.first.relation_oid)
        lane = rm is not None and paths_of(self.host, rm, txn).insert_lane
        datas, lsns = m.datas, m.lsns
        i, n = 0, len(datas)
        while i < n:
            took = offer_insert_run(self.host, m, i) if lane else 0
            if took:
                i += took
                continue
            change = decode_insert(datas[i])
            datas[i] = b""  # its values are the Insert's now: not held twice
            self.on_insert(Lsn(lsns[i]), change)
            i += 1

    def on_update(self, lsn: Lsn, m: Update) -> None:
        # The common case in one step: the table holds merged UPDATEs already.
        held = hold_update(self.host, lsn, m)
        if held:
            if held == SEND:
                self.send_held(m.relation_oid)
            return
        ctx = self._target(lsn, m.relation_oid, m, "update")
        if ctx is None:
            return
        rm = ctx.rm
        if rm.policy is not None and self._policy_change(ctx):
            return
        p = self.paths.get(rm.version) or paths_of(self.host, rm, ctx.txn)
        if p.merged or p.full:
            merger = self.merger
            if self._hold(ctx, merger.add if p.merged else merger.add_full):
                return
        self._keyed_change(ctx, self.planner.update)

    def on_delete(self, lsn: Lsn, m: Delete) -> None:
        ctx = self._target(lsn, m.relation_oid, m, "delete")
        if ctx is None:
            return
        rm = ctx.rm
        if rm.policy is not None and self._policy_change(ctx):
            return
        p = self.paths.get(rm.version) or paths_of(self.host, rm, ctx.txn)
        if p.merged or p.full:
            merger = self.merger
            if self._hold(ctx, merger.add_delete if p.merged else merger.add_full):
                return
        self._keyed_change(ctx, self.planner.delete)

    def _checked_rows(self, stmt: Any, n: int, ctxs: list[Any]) -> Any:
        """For a run of checked INSERTs: the statement for n rows, and its context."""
        return self.cplanner.insert_many(ctxs[0].rm, stmt, n), CheckedRows(
            ctxs, self.resolution.rows_checked
        )

    def _planned(self, ctx: ChangeCtx, plan: Callable[..., Any], *args: Any) -> Any:
        """Plan a change; a refusal (REPLICA IDENTITY NOTHING) gets its context."""
        try:
            return plan(ctx.rm, ctx.change, *args)
        except ApplyError as e:
            e.context.update(ctx.describe())
            raise

    def _keyed_change(self, ctx: ChangeCtx, plan: Callable[[RelMap, Any], Any]) -> None:
        """UPDATE/DELETE with the plain statement."""
        if self.merger.tables:
            self._before_change(ctx.rm)
        stmt, params, fmts = self._planned(ctx, plan)
        if self.host.careful:
            session = self.session
            self.resolution.careful(ctx, lambda: session.execute(stmt, params, fmts, ctx))
        else:
            self.session.execute(stmt, params, fmts, ctx)

    def _policy_change(self, ctx: ChangeCtx) -> bool:
        """An UPDATE/DELETE under a policy that needs its own statement (see
        applier.apply.rules.conflicts); False when the plain statement will do."""
        rm, m = ctx.rm, ctx.change
        txn = self.host.txn
        assert txn is not None
        planned: Any = None
        if rm.policy.check_origin:
            planned = self._planned(ctx, self.cplanner.origin_checked, txn.commit_ts)
            ctx.check = self.resolution.origin_checked
        elif isinstance(m, Update) and rm.policy.checked_update:
            planned = self._planned(ctx, self.cplanner.update)
            ctx.check = self.resolution.upsert_checked
        if planned is None:
            return False
        if self.merger.tables:
            self._before_change(rm)
        stmt, params, fmts = planned
        session = self.session
        self._send(ctx, lambda: session.execute(stmt, params, fmts, ctx, checked=True))
        return True

    def _send(self, ctx: ChangeCtx, send: Callable[[], None]) -> None:
        if self.host.careful:
            self.resolution.careful(ctx, send)
        else:
            send()

    def on_truncate(self, lsn: Lsn, m: Truncate) -> None:
        txn = self.host.txn
        assert txn is not None
        if txn.skip:
            return
        oids = [o for o in m.relation_oids if not self._held(o, lsn, txn)]
        rms = [self.host.relmap(oid, lsn) for oid in oids]
        included = [rm for rm in rms if rm.included]
        self.host.skipped_changes += len(rms) - len(included)
        for rm in rms:
            if not rm.included:
                self.host.tally.skip(rm.qualname, "excluded")
        if not included:
            return
        ctxs = [self._truncated(lsn, rm, m) for rm in included]
        included = [c.rm for c in ctxs if c is not None]
        if not included:
            return
        self._check_truncate(lsn, included)
        if not self.session.in_txn:
            self.session.begin()
        self.send_held()
        query = self.planner.truncate(included, m.restart_identity)
        ctx = ChangeCtx(lsn, txn, included[0], m)
        session = self.session
        self._send(ctx, lambda: session.execute_sql(query, ctx))

    def _held(self, oid: int, lsn: Lsn, txn: Txn) -> bool:
        """A TRUNCATE's relation that sync-tables holds back (counted as skipped)."""
        syncs = self.host.syncs
        cut = (
            syncs.cut.get(oid)
            if oid in self.relmaps
            else syncs.classify(oid, self.relations.get(oid), lsn, txn.xid)
        )
        if cut is None or txn.commit_lsn >= cut:
            return False
        self.host.skipped_changes += 1
        self.host.tally.skip(syncs.qualname(oid), "table_sync")
        return True

    def _truncated(self, lsn: Lsn, rm: RelMap, m: Truncate) -> ChangeCtx | None:
        """One relation of a TRUNCATE, as a change that rules may skip."""
        return self._target(lsn, rm.relation.oid, m, "truncate")

    def _check_truncate(self, lsn: Lsn, rms: list[RelMap]) -> None:
        """Never cascade on the target (worker.c: RESTRICT): refuse, naming the tables,
        when a table outside the message references one it truncates."""
        oids = [rm.target.oid for rm in rms if rm.target is not None]
        try:
            refs = self.catalog.referencing(oids)
        except psycopg.OperationalError as e:
            raise TransientError(f"catalog lookup failed: {str(e).strip()}") from None
        except psycopg.Error as e:
            raise ApplyError(
                f"looking up foreign keys on the target failed: {str(e).strip()}",
                lsn=str(Lsn(lsn)),
                xid=self._xid(),
                sqlstate=e.sqlstate,
            ) from None
        if refs:
            referencing, referenced = refs[0]
            others = f" (and {len(refs) - 1} more)" if len(refs) > 1 else ""
            raise ApplyError(
                f"TRUNCATE of {referenced} would cascade on the target: {referencing} "
                f"references it{others}, and the source did not truncate {referencing}",
                lsn=str(Lsn(lsn)),
                xid=self._xid(),
                table=referenced,
                referencing=referencing,
                hint=f"empty {referencing} on the target (or drop its foreign key to "
                f"{referenced}, or publish it), then restart applier run",
            )

    # -- held UPDATEs and DELETEs (see applier.apply.batching.merge) ------------------------------

    def _hold(self, ctx: ChangeCtx, add: Callable[[RelMap, Any, Any], int]) -> bool:
        """Hold an UPDATE/DELETE in the merger; False when it goes out as usual."""
        oid = ctx.rm.relation.oid
        held = add(ctx.rm, ctx.change, ctx)
        if held == AGAIN:  # the table holds what must go first
            self.send_held(oid)
            held = add(ctx.rm, ctx.change, ctx)
        if held <= 0:
            return False
        if held >= MAX_HELD:
            self.send_held(oid)
        return True

    def _before_change(self, rm: RelMap) -> None:
        """Keep source order where it can be seen: before a change that is not merged."""
        if rm.target is not None and rm.target.observed:
            self.send_held()
        elif self.merger.holds(rm.relation.oid):
            self.send_held(rm.relation.oid)

    def _xid(self) -> int | None:
        txn = self.host.txn
        return txn.xid if txn is not None else None

    def send_held(self, oid: int | None = None) -> None:
        """Send the rows held for one table (``oid``) or for all."""
        merger = self.merger
        if not merger.tables:
            return
        batches = merger.take_all() if oid is None else merger.take(oid)
        for stmt, params, fmts, ctx in batches:
            self.session.execute(stmt, params, fmts, ctx, merged=True)
