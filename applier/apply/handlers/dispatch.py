"""The message handlers: one per pgoutput message kind, session states in one place.

This is the ``apply_handle_*`` half of PostgreSQL's
``src/backend/replication/logical/worker.c``: :class:`Applier` turns each
decoded message into work for the target session (:mod:`applier.apply.target.session`),
and :mod:`applier.apply.worker` runs it inside a process with retries.

Session states
==============

``IDLE`` between transactions; ``TXN`` between Begin and Commit; ``PREPARE``
between Begin Prepare and Prepare; ``STREAM`` between Stream Start and Stream
Stop. Stream Commit/Abort/Prepare, Commit/Rollback Prepared arrive in
``IDLE``. A spooled transaction is replayed at its Stream Commit through the
same handlers in state ``TXN``. The dispatch table says which message may come
in which state; a handler moves the state only by :meth:`Applier.move`, checked
against the one table of moves (:data:`~applier.apply.core.states.TRANSITIONS`).

Parts
=====

The Applier holds the session state (the C dispatch loop reads ``state`` and
``live``) and owns its parts, each given the Protocol of what it uses
(:mod:`applier.apply.handlers.ports`): row changes (:mod:`applier.apply.handlers.changes`),
conflicts and skip rules (:mod:`applier.apply.rules.resolve`), streamed transactions
(:mod:`applier.apply.handlers.streamed`), two-phase (:mod:`applier.apply.handlers.twophase`),
schema changes (:mod:`applier.apply.handlers.schema`, the seam they all go through),
captured DDL (:mod:`applier.apply.handlers.ddl`).

LSN tracking and feedback
=========================

See :mod:`applier.apply.target.origin`. Each applied transaction commits with
``pg_replication_origin_xact_setup(end_lsn, commit_ts)``; the pair (end_lsn,
local commit LSN) goes to the :class:`FlushTracker`, and only source
positions whose local commit is flushed on the target are confirmed to the
slot. Empty transactions and idle periods are confirmed once nothing before
them is pending. Every message that brings a commit (Begin, Stream Commit, the
two-phase ones) is noted in :attr:`Applier.pending` before its handler runs,
with its commit time: the lag in seconds (:mod:`applier.lag`).

Bad input
=========

A change whose tuple has more or fewer values than its Relation message has
columns, and a Stream Start that continues (not first segment) a transaction
whose first segment never came, are :class:`~applier.errors.ProtocolError`
naming LSN, xid and table, raised before anything of the transaction is
committed. Relation and Type messages and the mappings built from them are in
:mod:`applier.apply.handlers.relations` (bounded; catalog errors there are clear errors
too).

TOAST
=====

An UPDATE whose unchanged TOASTed columns were not sent (kind ``u``) leaves
them out of SET; the target keeps its value, which is the source's too.

Conflicts and skip rules
========================

Changes the target's rows disagree with are conflicts, resolved by the
table's ``[conflicts]`` policy and recorded (:mod:`applier.apply.rules.conflicts`,
:mod:`applier.apply.rules.policies`); rules may skip tables, one transaction or
failing changes, keeping what they skipped (:mod:`applier.apply.rules.skiprules`).
Both are decided in :mod:`applier.apply.rules.resolve`, with the careful replay
(a savepoint per change) that only a failed range pays for.

Group commit
============

Several consecutive source transactions may share one target transaction
(``[apply] group_commit``); when a group stays open, what commits it and what a
failure inside it does: :mod:`applier.apply.handlers.groupcommit`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import Any

from applier.apply.batching.merge import UpdateMerger
from applier.apply.batching.paths import Paths
from applier.apply.batching.paths import refresh as refresh_paths
from applier.apply.core.states import State, Txn, check_move
from applier.apply.core.tally import Tally
from applier.apply.handlers.changes import RowChanges
from applier.apply.handlers.ddl import DdlReplay
from applier.apply.handlers.follow import Follower
from applier.apply.handlers.groupcommit import max_age
from applier.apply.handlers.pending import note_pending
from applier.apply.handlers.relations import RelationCache
from applier.apply.handlers.schema import SchemaChanges
from applier.apply.handlers.spool import SpoolSet
from applier.apply.handlers.streamed import Live, StreamedTxns
from applier.apply.handlers.twophase import TwoPhaseTxns
from applier.apply.rules.conflicts import ConflictPlanner
from applier.apply.rules.originfilter import OriginFilter
from applier.apply.rules.resolve import Resolver
from applier.apply.rules.skiprules import SkipRules
from applier.apply.rules.tablesync import NO_SYNCS, TableSyncs
from applier.apply.sql.mapping import Catalog, RelMap
from applier.apply.sql.planner import Planner
from applier.apply.target.origin import FLUSHED, FlushTracker
from applier.apply.target.session import TargetSession
from applier.config import Config
from applier.errors import ProtocolError
from applier.lag import PendingCommits
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    InsertRun,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamedChange,
    StreamedRun,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)

log = logging.getLogger("applier.apply")


IDLE, TXN, PREPARE, STREAM = State.IDLE, State.TXN, State.PREPARE, State.STREAM
_CHANGE_STATES = frozenset({TXN, PREPARE})
#: In a stream block, changes and the schema they see arrive as StreamedChange.
_NOT_STREAM = frozenset({IDLE, TXN, PREPARE})
_ANY = frozenset(State)
#: Messages that need the session before a live streamed transaction commits
#: (applier.apply.handlers.streamed, "Live apply"): it is dropped first.
_DROPS_LIVE = frozenset({Begin, BeginPrepare, CommitPrepared, RollbackPrepared, StreamPrepare})


class Applier:
    """The message state machine: one handler per message kind, states in one place."""

    def __init__(
        self,
        cfg: Config,
        session: TargetSession,
        catalog: Catalog,
        spools: SpoolSet,
        progress: Lsn,
        group_limit: int = 1,
        no_group_until: Lsn = FLUSHED,
        rules: SkipRules | None = None,
        careful_until: Lsn = FLUSHED,
        our_origin_id: int | None = None,
        no_live: set[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.catalog = catalog
        self.spools = spools
        self.progress = progress
        self.planner = Planner()
        self.merger = UpdateMerger(self.planner)
        self.merge_updates = cfg.apply.merge_updates
        #: Merge UPDATEs per key in the transaction in hand (not in one-by-one replay).
        self.merging = False
        self.flush = FlushTracker()
        self.state = IDLE
        self.txn: Txn | None = None
        #: The streamed transaction applied as it arrives (applier.apply.handlers.streamed);
        #: the C dispatch loop reads it by name.
        self.live: Live | None = None
        #: Rows that went through the lanes (logged with each streamed commit).
        self.lane_rows = 0
        self.rels = RelationCache(cfg, catalog, self._forget)
        self.relations = self.rels.relations
        self.relmaps = self.rels.relmaps
        self.applied_txns = 0
        self.skipped_changes = 0
        self.skipped_txns = 0
        #: Changes by table and operation, of committed transactions (applier.apply.metrics).
        self.tally = Tally()
        self.last_commit_lsn: Lsn | None = None
        self.last_commit_ts: int | None = None
        #: ``[source] origin = "none"``: see applier.apply.rules.originfilter.
        self.origins = OriginFilter(cfg.source.origin)
        #: Group commit: at most this many source transactions per target transaction.
        self.group_limit = max(1, group_limit)
        #: Transactions up to this source position are applied one by one (after a
        #: failed group, so the error names the exact transaction).
        self.no_group_until = no_group_until
        #: Source transactions ended but not yet committed: they share the open target
        #: transaction, which commits with the last one's (end_lsn, commit_ts).
        self.group_txns = 0
        self.group_end: tuple[Lsn, int] = (Lsn(0), 0)
        self.group_opened = 0.0
        #: Every commit waits for its result (a parallel apply session: the next
        #: session's turn comes only once this COMMIT returned).
        self.commit_waits = False
        #: Every transaction joins the open group, committed only when its turn comes
        #: (a parallel member: :meth:`commit_group` with ``turn``).
        self.hold_commits = False
        #: Called with (end_lsn, commit_ts, local_lsn) once a commit succeeded.
        self.on_committed: Callable[[Lsn, int, Lsn], None] | None = None
        #: The send_time of the stream's last read (the worker sets it per batch).
        self.sent_at = 0
        self.rules = rules if rules is not None else SkipRules(cfg.origin)
        #: Conflicts, careful replay and skip rules (applier.apply.rules.resolve).
        self.resolver = Resolver(
            self, cfg, session, self.rels.policies, catalog.conn, our_origin_id
        )
        session.on_missing = self.resolver.missing_row
        #: Streamed transactions, spooled or applied live (applier.apply.handlers.streamed).
        self.streamed = StreamedTxns(
            self,
            self.resolver,
            cfg.apply.streaming == "parallel",
            no_live if no_live is not None else set(),
        )
        #: Begin Prepare .. Commit/Rollback Prepared (applier.apply.handlers.twophase).
        self.cplanner = ConflictPlanner(self.planner, our_origin_id or 0)
        #: Transactions up to this source position are replayed carefully (see
        #: applier.apply.rules.resolve, "Careful replay"): a savepoint per change.
        self.careful_until = careful_until
        self.careful = False
        #: Per mapping version: the paths its changes may take (applier.apply.batching.paths),
        #: and the inputs they were decided on.
        self.paths: dict[int, Paths] = {}
        self.paths_stamp: tuple[Any, ...] = ((), -1, -1)
        #: Tables held back while sync-tables copies them (the worker sets its own).
        self.syncs: TableSyncs = NO_SYNCS
        #: INSERT, UPDATE, DELETE, TRUNCATE (applier.apply.handlers.changes).
        self.changes = RowChanges(
            self, self.resolver, session, self.planner, self.cplanner, self.merger, catalog
        )
        #: The seam every schema change goes through (applier.apply.handlers.schema).
        self.schema = SchemaChanges(self, session, self.rels)
        #: Captured DDL, run through the seam (applier.apply.handlers.ddl).
        self.ddl = DdlReplay(self, cfg, self.schema)
        self.on_message = self.ddl.on_message
        if cfg.schema.follow:  # applier.apply.handlers.follow
            self.rels.follow = Follower(cfg.source.conninfo(), self.schema.query)
        self.twophase = TwoPhaseTxns(
            self,
            self.resolver,
            self.streamed,
            self.changes,
            self.origins,
            f"applier_{cfg.origin}_",
            lambda: self.rels.forget_tables(None),
        )
        # The change handlers by their names, as the dispatch table holds them.
        self.on_insert = self.changes.on_insert
        self.on_insert_run = self.changes.on_insert_run
        self.on_update = self.changes.on_update
        self.on_delete = self.changes.on_delete
        self.on_truncate = self.changes.on_truncate
        H = Callable[[Lsn, Any], None]
        self.handlers: dict[type, tuple[frozenset[State], H]] = {
            Begin: (frozenset({IDLE}), self.on_begin),
            Commit: (frozenset({TXN}), self.on_commit),
            Origin: (frozenset({TXN, PREPARE, STREAM}), self.on_origin),
            Relation: (_NOT_STREAM, self.on_relation),
            Type: (_NOT_STREAM, self.on_type),
            StreamedChange: (frozenset({STREAM}), self.streamed.on_streamed_change),
            StreamedRun: (frozenset({STREAM}), self.streamed.on_streamed_run),
            Insert: (_CHANGE_STATES, self.on_insert),
            InsertRun: (_CHANGE_STATES, self.on_insert_run),
            Update: (_CHANGE_STATES, self.on_update),
            Delete: (_CHANGE_STATES, self.on_delete),
            Truncate: (_CHANGE_STATES, self.on_truncate),
            Message: (_ANY, self.on_message),
            StreamStart: (frozenset({IDLE}), self.streamed.on_stream_start),
            StreamStop: (frozenset({STREAM}), self.streamed.on_stream_stop),
            StreamCommit: (frozenset({IDLE}), self.streamed.on_stream_commit),
            StreamAbort: (frozenset({IDLE}), self.streamed.on_stream_abort),
            StreamPrepare: (frozenset({IDLE}), self.twophase.on_stream_prepare),
            BeginPrepare: (frozenset({IDLE}), self.twophase.on_begin_prepare),
            Prepare: (frozenset({PREPARE}), self.twophase.on_prepare),
            CommitPrepared: (frozenset({IDLE}), self.twophase.on_commit_prepared),
            RollbackPrepared: (frozenset({IDLE}), self.twophase.on_rollback_prepared),
        }
        #: Commits received and not finished (applier.lag); the worker's outlives sessions.
        self.pending = PendingCommits()
        note_pending(self.handlers, lambda: self.pending)

    # -- dispatch --------------------------------------------------------------------

    def move(self, to: State) -> None:
        """Move the session state to ``to``: only as TRANSITIONS allows (states.py)."""
        self.state = check_move(self.state, to)

    def dispatch(self, lsn: Lsn, msg: PgOutputMessage) -> None:
        entry = self.handlers.get(type(msg))
        if entry is None or self.state not in entry[0]:
            raise ProtocolError(
                f"unexpected {getattr(msg, 'kind', type(msg).__name__)} message while "
                f"{self.state.value}",
                lsn=str(lsn),
                hint="the stream is out of order; applier run restarts from the origin",
            )
        if self.live is not None and type(msg) in _DROPS_LIVE:
            self.drop_live(f"a {msg.kind} message needs the session")
        entry[1](lsn, msg)

    def send_held(self, oid: int | None = None) -> None:
        """Send the merged rows held for one table or for all (the lanes call it)."""
        self.changes.send_held(oid)

    def drop_live(self, why: str) -> None:
        """Roll the live transaction back (applier.apply.handlers.streamed)."""
        self.streamed.drop_live(why)

    # -- transactions ------------------------------------------------------------------

    def start_txn(
        self, xid: int, commit_lsn: Lsn, skip: bool, gid: str | None = None, ts: int = 0
    ) -> None:
        txn = self.txn = Txn(xid, commit_lsn, skip, gid, ts)
        # One by one after a failure (commit_lsn < no_group_until <=> end_lsn <=
        # no_group_until): unmerged, so an error names its own change.
        batched = commit_lsn >= self.no_group_until
        self.merging = batched and self.merge_updates
        self.session.multi_row = batched
        self.careful = commit_lsn < self.careful_until
        rules = self.rules
        if rules.has_txn and not skip:
            txn.rule = rules.txn_rule(xid, commit_lsn)
        if rules.dump_all:
            txn.seen = []
        refresh_paths(self, txn)
        # The LSN is formatted only if an error needs it (this runs per transaction).
        self.session.txn_context = {"lsn": commit_lsn, "xid": xid, "finish_lsn": commit_lsn}

    def on_begin(self, lsn: Lsn, m: Begin) -> None:
        self.move(TXN)
        skip = m.final_lsn < self.progress
        if skip:
            log.info(
                "skipping a transaction applied before",
                extra={"ctx": {"xid": m.xid, "commit_lsn": m.final_lsn, "progress": self.progress}},
            )
        self.start_txn(m.xid, m.final_lsn, skip, None, m.commit_ts)

    def on_commit(self, lsn: Lsn, m: Commit) -> None:
        assert self.txn is not None
        self.move(IDLE)
        self.end_txn(m.end_lsn, m.commit_ts, groupable=True)

    def end_txn(self, end_lsn: Lsn, commit_ts: int, groupable: bool = False) -> None:
        txn = self.txn
        assert txn is not None
        self.txn = None
        if txn.filtered and self.group_txns and end_lsn > self.no_group_until:
            # Two-way on a 15 source: the other side's transactions come between ours;
            # the open group goes on, and its commit moves the origin past this one.
            self.skipped_txns += 1
            self.group_end = (end_lsn, commit_ts)
            return
        if txn.skip or end_lsn <= self.progress:
            # Open here only before a transaction filtered by its origin (the others
            # come before any group by LSN order); never roll one back.
            self.commit_group()
            self.session.rollback()
            self.tally.discard()
            self.skipped_txns += 1
            self.flush.store(end_lsn, FLUSHED)
            return
        if txn.rule is not None:
            self.skipped_txns += 1
        self.resolver.finish_records(txn, end_lsn)
        if self.session.in_txn:
            # An empty transaction inside an open group joins it (its position must
            # not be confirmed before the group's commit).
            if groupable and not txn.barrier and self._joins(end_lsn, commit_ts):
                self.group_txns += 1
                self.group_end = (end_lsn, commit_ts)
                return
            self._commit(end_lsn, commit_ts, self.group_txns + 1)
        else:
            self.flush.store(end_lsn, FLUSHED)  # empty for us: nothing to wait for
            self.tally.commit(self.tally.take(self.relmaps), 0)  # what it skipped

    def _joins(self, end_lsn: Lsn, commit_ts: int) -> bool:
        """Whether the transaction ending now joins the open group (else it commits)."""
        if self.hold_commits:
            return True
        if self.group_txns + 1 >= self.group_limit or end_lsn <= self.no_group_until:
            return False
        now = monotonic()
        if not self.group_txns:
            self.group_opened = now
        return now - self.group_opened < max_age(self.sent_at, commit_ts)

    def commit_group(self, turn: bool = False) -> None:
        """Commit the open group (if any), stamped with its last transaction's position.

        Only between transactions: a batch may end inside one, whose rows are already
        in the open target transaction; the group then commits at its Commit. With
        :attr:`hold_commits`, only when ``turn`` (a parallel member's turn came).
        """
        if self.group_txns and self.txn is None and (turn or not self.hold_commits):
            end_lsn, ts = self.group_end
            self._commit(end_lsn, ts, self.group_txns)

    def _commit(self, end_lsn: Lsn, ts: int, txns: int) -> None:
        """Send the commit; the bookkeeping of success runs when its result comes."""
        self.send_held()
        self.resolver.flush_conflicts()
        entry = self.flush.store_pending(end_lsn)
        counts = self.tally.take(self.relmaps)

        def done(local: Lsn) -> None:
            # Rows not found that the commit did not wait for (conflictlog.py, "Records"):
            # their results came before this commit's, so these are exactly the ones
            # of the transactions it committed.
            late = self.resolver.take_conflicts()
            self.tally.conflicts_met(late, into=counts[2])
            self.flush.resolve(entry, local)
            self.tally.commit(counts, txns)
            self.applied_txns += txns
            self.last_commit_lsn = end_lsn
            self.last_commit_ts = ts
            for c in late:
                self.resolver.record_alone(c)
            if self.on_committed is not None:
                self.on_committed(end_lsn, ts, local)

        # One by one after a failed group: wait, so an error names its transaction.
        wait = self.commit_waits or end_lsn <= self.no_group_until
        self.session.commit(end_lsn, ts, done, wait=wait)
        # Only now: a failure raised by commit() regroups the transactions held here.
        self.group_txns = 0
        self.progress = Lsn(max(self.progress, end_lsn))

    def committed(self, end_lsn: Lsn, ts: int, local: Lsn, txns: int = 1) -> None:
        self.group_txns = 0
        self.progress = Lsn(max(self.progress, end_lsn))
        self.flush.store(end_lsn, local)
        self.tally.commit(self.tally.take(self.relmaps), txns)
        self.applied_txns += txns
        self.last_commit_lsn = end_lsn
        self.last_commit_ts = ts

    def on_origin(self, lsn: Lsn, m: Origin) -> None:
        """The transaction was applied on the source by a replication (after Begin, Begin
        Prepare, or a first Stream Start): not applied with ``origin = "none"``."""
        if self.state is STREAM:
            sp = self.streamed.spool
            assert sp is not None
            sp.filtered = self.origins.drop(lsn, m, sp.xid)
            return
        txn = self.txn
        assert txn is not None
        if self.origins.drop(lsn, m, txn.xid, prepared=txn.gid is not None):
            txn.skip = txn.filtered = True  # before any change: nothing was sent for it
            refresh_paths(self, txn)

    # -- schema (see applier.apply.handlers.relations) ------------------------------------------

    def on_relation(self, lsn: Lsn, m: Relation) -> None:
        # A changed message supersedes the mapping: _forget sends its held rows first.
        self.rels.on_relation(m)

    def on_type(self, lsn: Lsn, m: Type) -> None:
        self.rels.on_type(m)

    def relmap(self, oid: int, lsn: Lsn) -> RelMap:
        return self.rels.get(oid, lsn, self._xid())

    def _forget(self, rm: RelMap) -> None:
        """A mapping was superseded or evicted: its prepared statements go too."""
        if self.merger.holds(rm.relation.oid):
            self.changes.send_held(rm.relation.oid)
        self.merger.forget(rm.version)
        self.paths.pop(rm.version, None)
        names = self.planner.forget(rm.version)
        self.cplanner.forget(names)
        if names:
            self.session.forget_statements(names)

    def _xid(self) -> int | None:
        return self.txn.xid if self.txn is not None else None

    # -- shutdown ----------------------------------------------------------------------

    def abandon(self) -> None:
        """Roll back what is in hand (stop or error); the stream resends it next time."""
        if self.live is not None:
            self.live.spool.live = False
            self.live = None
        self.txn = None
        self.move(IDLE)
        self.group_txns = 0
        self.resolver.discard()
        self.tally.discard()
        self.merger.discard()
        self.session.rollback()
        self.session.settle()
