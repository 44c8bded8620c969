"""The leader: each message to the pool or to the leader's own session, in source order.

With ``[apply] workers`` > 1 the worker's loop hands every batch to
:meth:`Leader.dispatch` instead of the Applier. The leader owns the *home*
Applier (the engine of ``workers = 1``, on the worker's thread, holding the plain
origin) and the :class:`~.pool.Pool` of members (their origins ``<origin>.<n>``).

Two lanes for ordinary transactions
===================================

:class:`~.lanes.LaneChoice` says, at each Begin, whether an ordinary transaction
goes to the pool (below) or *inline*: to the home session as it arrives, which
then applies as ``workers = 1`` does (group commit, commits not waited for), so
that where applier's CPU is the limit the pool's second pass over every change
costs nothing. Moving between the lanes keeps commit order: to go inline the
pool is drained first; to go to the pool the home session's group is committed
and its results taken first (:meth:`Leader._home_alone`). Inline, the home
session's queue of statements awaiting results is kept short
(:data:`LEANING_INFLIGHT`) until a window shows applier is busy, so that a slow
target shows at once and a move to the pool waits for little. The members open
in the background when the pool is first wanted.

Where each message goes
=======================

* An ordinary transaction (Begin .. Commit) in the pool lane is *held* while it arrives, its
  write set collected change by change (:class:`~.writeset.Collector`; no round
  trip), and at its Commit either added to the pool (keyed) or, if it is a
  *barrier*, applied by the home session once every transaction before it has
  committed (:meth:`~.pool.Pool.drain`), its commit waited for, so nothing after
  it starts before it committed.
* Stream blocks (Stream Start .. Stop, Stream Abort) go to the home session at
  once: they only fill its spool (nothing is applied live with a pool). What
  commits or prepares (Stream Commit, Stream Prepare, Begin Prepare .. Prepare,
  Commit/Rollback Prepared) and anything else outside a transaction goes to
  the home session after a drain.
* A transaction held past :data:`HELD_LIMIT` messages stops being held: after a
  drain, what was held and the rest of it go to the home session as they come
  (memory stays bounded, as with one session).

What is a barrier: one decision
===============================

:meth:`Leader._barrier_of_txn` (at Begin) and :meth:`Leader._keys` (per table)
are the only places that say so, from the inputs the engine's path decision
(:mod:`applier.apply.batching.paths`) weighs, plus what keys cannot express:

* the transaction: applied before (the home session skips it), a careful or
  one-by-one replay after an error, skip rules loaded, a table sync between
  its hand-over and ready;
* its tables: a Relation or Type message new to this session or changed (the
  home session maps it, following a schema change on the target first), a
  table without a mapping in the home session (evicted), a table being synced,
  a target that fires triggers not trusted (``[apply] trusted_triggers``) and
  what :class:`~.writeset.Collector` itself marks (TRUNCATE, captured DDL, a
  foreign key it cannot key).
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.relations import same_relation
from applier.apply.handlers.until import Until
from applier.apply.parallel.lanes import LaneChoice
from applier.apply.parallel.member import Item, run_handlers
from applier.apply.parallel.pool import Pool, PoolStats
from applier.apply.parallel.tablekeys import load as load_keys
from applier.apply.parallel.writeset import Collector, KeySpace, TableKeys
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.sql.mapping import RelMap
from applier.config import Config
from applier.lag import PendingCommits
from applier.lsn import Lsn
from applier.protocol import (
    Begin,
    Commit,
    Delete,
    Insert,
    InsertRun,
    Message,
    Origin,
    Prepare,
    Relation,
    StreamAbort,
    StreamedChange,
    StreamedRun,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from applier.protocol.decoder import decode_insert
from applier.speedups import Flag

log = logging.getLogger("applier.apply")

#: Messages (rows of a run of Inserts each) of one transaction held at most; a
#: longer one goes to the home session as it arrives.
HELD_LIMIT = 10_000

#: Statements the leader's session has awaiting results at most in the inline lane
#: (one session's engine: 20,000, but that much of a slow target is what a move to
#: the pool would wait for); a bulk UPDATE's merged statements need about this many.
INLINE_INFLIGHT = 4_000

#: ... and while the lanes lean to the pool (the target is the limit): a move to
#: the pool waits for what the queue holds.
LEANING_INFLIGHT = 256

#: Messages the inline lane hands the home session at once: the lane is asked
#: again after them (a window is 0.2 s; a slow target takes ~1 ms a row).
INLINE_CHUNK = 256

#: Only the home session's spool sees these: nothing on the target, no drain.
_SPOOL_ONLY = frozenset({StreamStart, StreamedChange, StreamedRun, StreamStop, StreamAbort})


class LeaderStream(Protocol):
    """What the leader reads of the logical stream."""

    @property
    def last_send_time(self) -> int: ...

    def read(self, timeout: float) -> list[tuple[Lsn, Any]]: ...


class Leader:
    """Routes messages between the home session and the pool (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        home: Applier,
        pool: Pool,
        catalog: psycopg.Connection[Any],
        pending: PendingCommits,
        syncs: TableSyncs,
        stopping: Callable[[], bool],
    ) -> None:
        self.home = home
        self.pool = pool
        self._catalog = catalog
        self._pending = pending
        self._syncs = syncs
        self._stopping = stopping
        self._trusted = tuple(cfg.apply.trusted_triggers)
        self._origin_none = cfg.source.origin == "none"
        self._flag = Flag()
        home.streamed.live_apply = False
        #: Ordinary transactions to the pool or inline (:mod:`.lanes`).
        self.lanes = LaneChoice(cfg.apply.adaptive, time.monotonic(), time.process_time())
        #: Seconds spent waiting for the stream (a measure of the lanes').
        self._waited = 0.0
        self._begun = 0
        self._group_limit = home.group_limit
        # Barriers only, until the inline lane takes the first transaction.
        home.group_limit, home.commit_waits = 1, True
        if cfg.apply.adaptive:
            # A target that cannot keep up must make the leader's session wait soon
            # (the lanes see an idle process), and a move to the pool wait for little.
            home.session.max_inflight = LEANING_INFLIGHT
        self._home_groups = False
        #: The Relation and Type messages in force, as the members must see them.
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self._space = KeySpace()
        self._keys: dict[int, tuple[RelMap, Relation, TableKeys]] = {}
        #: The transaction being held (None: none), its write set, the tables it changes.
        self._held: list[tuple[Lsn, Any]] | None = None
        self._begin: Begin | None = None
        self._collector = c = Collector()
        #: What keys each kind of row change (the collector is reused: take() empties it).
        self._keyed: dict[type, Callable[[TableKeys, Any], None]] = {
            Insert: c.insert,
            Update: c.update,
            Delete: c.delete,
        }
        # Read per change: the home session's mappings and the sync cuts (both
        # objects live as long as the session; their contents change).
        self._relmaps = home.relmaps
        self._cut = syncs.cut
        self._touched: set[int] = set()
        self._changes = 0
        #: The rest of the transaction in hand goes to the home session.
        self._direct = False

    @property
    def quiet(self) -> bool:
        """Nothing held, nothing in flight: every message received is applied."""
        return self._held is None and not self._direct and not self.pool.in_flight

    @property
    def between_txns(self) -> bool:
        """No transaction is being received (a hand-over may pause here)."""
        return self._held is None and not self._direct

    def may_finish(self, until: Until) -> bool:
        """``run --until``: nothing in flight, and nothing held unless the position
        was reached (a transaction cut at its Commit is dropped)."""
        return not self.pool.in_flight and (until.reached or self.quiet)

    # -- routing ---------------------------------------------------------------------

    def read(
        self, stream: LeaderStream, until: Until | None, timeout: float | None = None
    ) -> list[tuple[Lsn, Any]]:
        """Read one batch (waiting up to ``timeout`` s) and route it; while the pool
        has work the read hardly waits, so that the members' results are taken at once."""
        pool = self.pool
        began = time.monotonic()
        batch = stream.read((0.01 if pool.in_flight else 0.5) if timeout is None else timeout)
        now = time.monotonic()
        self._waited += now - began
        self.home.sent_at = stream.last_send_time
        if until is None:
            self.dispatch(batch)
        else:  # lazily, message by message: admit may commit the inline lane's group
            for item in until.admit(batch, self.home):
                self._route([item])
            pool.start_ready()
        if not batch and pool.in_flight:
            pool.collect(0.02)
        self._lane_tick()
        return batch

    def stats(self) -> PoolStats:
        """The pool's figures and the lane ordinary transactions take now."""
        s = self.pool.stats()
        s.inline = 0 if self.lanes.pool else 1
        s.lane_switches += self.lanes.switches
        return s

    def _lane_tick(self) -> None:
        """At each read and each Begin: the lane choice's window, if it ended."""
        now = time.monotonic()
        lanes = self.lanes
        switches = lanes.switches
        if lanes.wanted and not lanes.pool_ready and self.pool.opened:
            self.pool.open_wait()  # starts them, or raises why they could not open
            lanes.ready(now)
        if now >= lanes.next_at:
            lanes.tick(now, time.process_time(), self._waited, self._begun)
            self.home.session.max_inflight = LEANING_INFLIGHT if lanes.leaning else INLINE_INFLIGHT
            if lanes.wanted and not lanes.pool_ready:
                self.pool.open_soon()
        if lanes.switches != switches:
            log.info(
                "parallel apply: ordinary transactions now go to %s",
                "the pool" if lanes.pool else "the leader's own session",
                extra={"ctx": lanes.last_reason},
            )

    def dispatch(self, batch: list[tuple[Lsn, Any]]) -> None:
        self._route(batch)
        self.pool.start_ready()

    def _route(self, batch: list[tuple[Lsn, Any]]) -> None:
        keyed = self._keyed
        n, end = 0, len(batch)
        while n < end:
            if not n & 63 and self._stopping():  # a stop is seen within 64 messages
                return
            if self._direct:
                n = self._direct_part(batch, n)
                continue
            lsn, msg = batch[n]
            n += 1
            held = self._held
            if held is not None:
                # The common case first: a row change of a transaction being held.
                keyer = keyed.get(type(msg))
                if keyer is not None:
                    held.append((lsn, msg))
                    tk = self._keys_of(msg.relation_oid)
                    if tk is not None:
                        keyer(tk, msg)
                    self._changes += 1
                    if self._changes > HELD_LIMIT:
                        self._go_direct()
                else:
                    self._hold(lsn, msg)
            elif type(msg) is Begin:
                self._begun += 1  # the lanes' rate: flow-controlled in both
                self._lane_tick()
                if self.lanes.pool:
                    self._home_alone()
                    self._start(lsn, msg)
                else:  # inline: the home session takes it from its Begin, as it comes
                    self._home_grouping()
                    n = self._inline_part(batch, n - 1)
            elif type(msg) in _SPOOL_ONLY:
                self.home.dispatch(lsn, msg)
            else:
                self.drain()
                self._note_schema(msg)
                self.home.dispatch(lsn, msg)
                # Begin Prepare .. Prepare: the home session takes all of it.
                self._direct = self.home.txn is not None

    def _direct_part(self, batch: list[tuple[Lsn, Any]], start: int) -> int:
        """The home session takes the transaction in hand from ``batch[start]`` to its
        Commit (or Prepare), or to the batch's end, in one pass of its handlers' fast
        loop (a bulk transaction's rows do not go through the leader one by one);
        where the next part begins."""
        stop = len(batch)
        for i in range(start, stop):
            t = type(batch[i][1])
            if t is Relation or t is Type:
                self._note_schema(batch[i][1])
            elif t is Commit or t is Prepare:
                stop = i + 1
                self._direct = False
                break
        run_handlers(self.home, batch[start:stop], self._flag)
        return stop

    def _inline_part(self, batch: list[tuple[Lsn, Any]], start: int) -> int:
        """The inline lane: the home session takes up to :data:`INLINE_CHUNK` messages
        from ``batch[start]`` (a Begin) in one pass of its handlers' fast loop, as one
        session takes a batch (no routing per transaction); the rest of a transaction
        cut there goes direct, and the lane is asked again at the next Begin."""
        stop = min(len(batch), start + INLINE_CHUNK)
        part = batch[start:stop]
        begun = 0
        for _, m in part:
            t = type(m)
            if t is Begin:
                begun += 1
            elif t is Relation or t is Type:
                self._note_schema(m)
        self._begun += begun - 1  # the first was counted at its Begin
        run_handlers(self.home, part, self._flag)
        self._direct = self.home.txn is not None
        return stop

    def drain(self) -> None:
        """Wait until everything handed to the pool has committed."""
        self.pool.drain(self._stopping)

    def _home_grouping(self) -> None:
        """The inline lane: the home session applies as ``workers = 1`` (group commit,
        commits not waited for), once everything handed to the pool has committed."""
        if not self._home_groups:
            self.drain()
            home = self.home
            home.group_limit, home.commit_waits = self._group_limit, False
            self._home_groups = True

    def _home_alone(self) -> None:
        """The pool lane: the home session's group is committed and its commits'
        results in before a member may commit; from now on the home session takes
        barriers only, one at a time, each commit waited for (nothing after a barrier
        starts before it committed)."""
        if self._home_groups:
            home = self.home
            home.commit_group()
            home.session.settle()
            home.group_limit, home.commit_waits = 1, True
            self._home_groups = False
        self.pool.open_wait()

    def _start(self, lsn: Lsn, m: Begin) -> None:
        self._pending.received(m.final_lsn, m.commit_ts)
        self._held = [(lsn, m)]
        self._changes = 0
        self._begin = m
        self._collector.take()  # a mark made outside a transaction is not this one's
        self._touched = set()
        why = self._barrier_of_txn(m)
        if why is not None:
            self._collector.mark(why)

    def _hold(self, lsn: Lsn, msg: Any) -> None:
        """Any other message of a transaction being held (row changes: :meth:`_route`)."""
        held = self._held
        assert held is not None
        held.append((lsn, msg))
        t = type(msg)
        c = self._collector
        if t is InsertRun:
            self._hold_run(msg)
        elif t is Commit:
            self._end(msg)
            return
        elif t is Relation or t is Type:
            self._note_schema(msg)
        elif t is Truncate:
            c.truncate()
        elif t is Message:
            c.message(msg)
        elif t is Origin:
            if self._origin_none:  # the home session decides whether it is applied
                c.mark("a transaction from another origin, [source] origin = none")
        else:
            c.mark(f"a {msg.kind} message inside a transaction")
        self._changes += 1 if t is not InsertRun else 1 + len(msg.datas)
        if self._changes > HELD_LIMIT:
            self._go_direct()

    def _hold_run(self, run: InsertRun) -> None:
        tk = self._keys_of(run.first.relation_oid)
        if tk is None:
            return
        c = self._collector
        c.insert(tk, run.first)
        for data in run.datas:
            c.insert(tk, decode_insert(data))

    def _end(self, commit: Commit) -> None:
        held, begin = self._held, self._begin
        assert held is not None and begin is not None
        self._held = self._begin = None
        ws = self._collector.take()
        if ws.barrier is not None:
            self._barrier(held)
            return
        item = Item(
            0,
            held,
            commit.end_lsn,
            commit.commit_ts,
            begin.xid,
            {oid: self.relations[oid] for oid in self._touched},
            dict(self.types),
            self._changes,
        )
        self.pool.make_room(self._stopping)
        self.pool.add(item, ws)

    def _barrier(self, held: list[tuple[Lsn, Any]]) -> None:
        """Apply ``held`` on the home session after everything before it, and wait."""
        self.drain()
        if self._stopping():
            return
        self.pool.barriers += 1
        home = self.home
        run_handlers(home, held, self._flag)

    def _go_direct(self) -> None:
        """The transaction in hand is too long to hold: the home session takes it."""
        held = self._held
        assert held is not None
        self._held = self._begin = None
        self._collector.take()
        self._direct = True
        self._barrier(held)

    # -- the one barrier decision ------------------------------------------------------

    def _barrier_of_txn(self, m: Begin) -> str | None:
        home = self.home
        if m.final_lsn < home.progress:
            return "applied before"
        if m.final_lsn < home.careful_until or m.final_lsn < home.no_group_until:
            return "replayed one by one after an error"
        rules = home.rules
        if rules.has_txn or rules.has_object or rules.dump_all:
            return "skip rules are loaded"
        if self._syncs.commit_dependent():
            return "a table sync is handing over"
        return None

    def _keys_of(self, oid: int) -> TableKeys | None:
        """The keys of relation ``oid``'s changes, or None (the transaction is marked a
        barrier): the home session's mapping must be the one of the Relation in force."""
        got = self._keys.get(oid)
        if (
            got is not None
            and got[0] is self._relmaps.get(oid)
            and got[1] is self.relations.get(oid)
            and oid not in self._cut
        ):
            self._touched.add(oid)
            return got[2]  # per change: a few lookups and identity checks
        return self._keys_slow(oid)

    def _keys_slow(self, oid: int) -> TableKeys | None:
        self._touched.add(oid)
        c = self._collector
        if oid in self._cut:
            c.mark(f"relation {oid} is being synced")
            return None
        rm = self._relmaps.get(oid)
        rel = self.relations.get(oid)
        if rm is None or rel is None or not same_relation(rm.relation, rel):
            c.mark(f"relation {oid} is not mapped by the leader's session yet")
            return None
        tk = self._build(rm)
        self._keys[oid] = (rm, rel, tk)
        return tk

    def _build(self, rm: RelMap) -> TableKeys:
        target = rm.target
        if not rm.included or target is None:
            return TableKeys()
        trusted = any(fnmatch.fnmatchcase(rm.qualname, p) for p in self._trusted)
        return TableKeys.build(rm, load_keys(self._catalog, target.oid), self._space, trusted)

    def _note_schema(self, msg: Any) -> None:
        """Keep the Relation and Type messages in force; a new or changed one makes
        its transaction a barrier (the home session maps it first)."""
        t = type(msg)
        if t is Relation:
            if not same_relation(self.relations.get(msg.oid), msg):
                self.relations[msg.oid] = msg
                self._keys.pop(msg.oid, None)
                self._collector.mark(f"table {msg.namespace}.{msg.name}: a new Relation message")
        elif t is Type and self.types.get(msg.oid) != msg:
            self.types[msg.oid] = msg
            self._collector.mark(f"type {msg.namespace}.{msg.name}: a new Type message")
