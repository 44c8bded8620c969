"""The pool: N members, the schedule that feeds them, the turn they commit in.

Everything here runs on the leader's thread except the members' own threads
(:mod:`.member`); the :class:`~.schedule.Schedule` is the leader's alone, the
:class:`~.turn.CommitTurn` is shared. Members report on one queue, committed
items in source order (a member reports before it passes the turn on), so the
leader keeps the flush tracker, counters and progress as one session would.

Deadlocks the keys missed
=========================

An earlier transaction whose backend waits for a lock held by a later one that
waits for its commit turn will wait forever: PostgreSQL sees one backend
waiting and the other idle in a transaction. When the turn has not moved for
:data:`WATCH_AFTER` s, :meth:`Pool.collect` asks ``pg_blocking_pids()`` for the
members applying (not waiting for their turn); a member holding a *later*
transaction among the blockers, or among the blockers of a blocker that is a
member applying (:func:`_behind`), is told to back off: it rolls back and applies
again after its predecessor (:mod:`.member`). A deadlock PostgreSQL does see
(both sides applying) it breaks itself (40P01), and the member it chose does
the same. Both are counted (:attr:`Member.deadlocks`, :attr:`Member.retried`).

Failures
========

A member that fails breaks the turn: nothing later commits, every member rolls
back what it holds at its next step, and :meth:`Pool.collect` raises the
failure of the *earliest* transaction that failed for a reason of its own (not
:class:`~.turn.TurnBroken`), with its LSN, xid, table and key; the worker
stops the pool and starts over from the restart point.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from applier.apply.core.tally import Tally
from applier.apply.handlers.dispatch import Applier
from applier.apply.parallel.member import Item, Member, Report
from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.turn import CommitTurn, TurnBroken
from applier.apply.parallel.writeset import WriteSet
from applier.errors import TransientError
from applier.lsn import Lsn

log = logging.getLogger("applier.apply")

#: Seconds the turn may stand still before the deadlock watch asks the server.
WATCH_AFTER = 0.2
#: Transactions one member applies in one target transaction at most (group
#: commit within the pool: consecutive ones only, :meth:`Schedule.next_run`) ...
RUN_LIMIT = 8
#: ... and in flight per member at most: enough to keep every member busy while
#: the next to commit waits for one; the leader stops reading beyond it, or ...
WINDOW_PER_MEMBER = 4 * RUN_LIMIT
#: ... beyond this many row changes held in flight (memory stays bounded: one
#: transaction alone holds at most leader.HELD_LIMIT).
HELD_ROWS = 200_000

#: Opens the members (all or none), given the turn and where they report.
Opener = Callable[[CommitTurn, Callable[[Report], None]], list[Member]]

_BLOCKERS = (
    "SELECT pid, pg_catalog.pg_blocking_pids(pid) "
    "FROM pg_catalog.unnest(%s::pg_catalog.int4[]) AS pid"
)


@dataclass(slots=True)
class PoolStats:
    """What status and the metrics show of the pool."""

    sessions: int
    in_flight: int
    waiting: int
    serialised_by_key: int
    serialised_by_barrier: int
    deadlocks: int
    retried: int
    #: 1 while the leader's own session takes ordinary transactions (.lanes), else 0.
    inline: int = 0
    #: Moves between the pool and the leader's own session.
    lane_switches: int = 0

    @classmethod
    def none(cls, sessions: int) -> PoolStats:
        return cls(sessions, 0, 0, 0, 0, 0, 0)


class Pool:
    """The members and their schedule (see the module docstring)."""

    def __init__(
        self,
        members: Opener,
        watch_conn: psycopg.Connection[Any],
        tally: Tally,
        on_commit: Callable[[Item, Lsn, Lsn], None],
        past: PoolStats | None = None,
        run_limit: int = RUN_LIMIT,
        chain_limit: int = RUN_LIMIT,
        sessions: int = 0,
    ) -> None:
        self.run_limit = max(1, run_limit)
        #: A run at the head of the commit order may take this many transactions
        #: that wait only for it (a hot row's chain: as one session groups them).
        self.chain_limit = max(self.run_limit, chain_limit)
        self._held_rows = 0
        #: The counters of the worker's earlier sessions (they only grow).
        self._past = past
        self.turn = CommitTurn()
        self.schedule = Schedule()
        self._reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self.sessions = sessions
        #: The members, once opened (:meth:`open_wait`); none before.
        self.members: list[Member] = []
        self._free: list[Member] = []
        self._items: dict[int, Item] = {}
        self._watch_conn = watch_conn
        self._tally = tally
        self._on_commit = on_commit
        self._failure: BaseException | None = None
        self._turn_moved = time.monotonic()
        # Room for a head run's whole chain besides the members' runs.
        self.window = WINDOW_PER_MEMBER * sessions + self.chain_limit
        #: Barriers applied by the leader's own session (counted with the schedule's).
        self.barriers = 0
        #: Runs handed out (transactions / runs: how much group commit the pool kept).
        self.runs = 0
        # Opened when first wanted, in the background: the leader's session applies
        # meanwhile (.lanes); opening costs CPU a pool that is never used should not.
        self._opened: list[Member] | BaseException | None = None
        self._opener = threading.Thread(
            target=self._open, args=(members,), name="applier open pool", daemon=True
        )

    def _open(self, members: Opener) -> None:
        try:
            self._opened = members(self.turn, self._reports.put)
        except BaseException as e:  # raised on the leader's thread by open_wait
            self._opened = e

    def open_soon(self) -> None:
        """Start opening the members in the background (once)."""
        if self._opener.ident is None:
            self._opener.start()

    @property
    def opened(self) -> bool:
        """The members are open (or failed to open: :meth:`open_wait` raises)."""
        return bool(self.members) or (
            self._opener.ident is not None and not self._opener.is_alive()
        )

    def open_wait(self) -> None:
        """Wait until the members are open and started; raise why they could not be."""
        if self.members:
            return
        self.open_soon()
        self._opener.join()
        got = self._opened
        if isinstance(got, BaseException):
            raise got
        assert got is not None
        self.members = got
        self._free = list(reversed(got))
        for m in got:
            m.start()

    # -- feeding ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.schedule.in_flight

    @property
    def full(self) -> bool:
        return self.schedule.in_flight >= self.window or self._held_rows >= HELD_ROWS

    def add(self, item: Item, ws: WriteSet) -> None:
        """The next transaction in commit order (its write set keyed by the leader)."""
        item.seq = self.schedule.add(ws)
        self._items[item.seq] = item
        self._held_rows += item.rows

    def start_ready(self) -> None:
        """Hand ready transactions to free members: runs of consecutive ones, the
        ready shared evenly among the free (a run is applied by one session). After
        each batch the leader routed (and whenever results come), not per transaction,
        so that a run takes what the batch brought (longer runs, fewer commits)."""
        schedule, free = self.schedule, self._free
        while free:
            share = -(-schedule.ready_count // len(free))
            # The head run (next to commit) may take ready ones beyond its share:
            # waiting ones after them can then join it (a chain is not cut).
            share = min(self.run_limit, max(1, share))
            run = schedule.next_run(share, self.chain_limit, self.run_limit)
            if not run:
                return
            free.pop().give([self._items.pop(seq) for seq in run])
            self.runs += 1

    # -- results ---------------------------------------------------------------------

    def collect(self, wait: float = 0.0) -> None:
        """Take the members' reports (waiting up to ``wait`` s for the first one);
        raise the failure of a member, once every member has stopped committing."""
        self.start_ready()
        try:
            report = self._reports.get(timeout=wait) if wait > 0 else self._reports.get_nowait()
        except queue.Empty:
            self._watch()
            return
        while True:
            self._take(report)
            try:
                report = self._reports.get_nowait()
            except queue.Empty:
                break
        if self._failure is not None:
            raise self._failure
        self.start_ready()

    def _take(self, r: Report) -> None:
        m = r.member
        if r.last or r.error is not None:  # else it still applies the rest of its run
            m.items = None
            self._free.append(m)
        if r.error is not None:
            if self._failure is None or isinstance(self._failure, TurnBroken):
                self._failure = r.error
            return
        self._turn_moved = time.monotonic()
        with m.lock:
            self._tally.absorb(m.applier.tally)
        for item in r.items:
            self._held_rows -= item.rows
            self.schedule.commit(item.seq)
            self._on_commit(item, r.local, r.flushed)

    def drain(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Wait until every transaction handed over has committed."""
        while self.schedule.in_flight and not stopping():
            self.collect(0.05)

    def make_room(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Wait until the window has room for one more transaction."""
        while self.full and not stopping():
            self.collect(0.05)

    # -- deadlocks the keys missed ---------------------------------------------------

    def _watch(self) -> None:
        if not self.schedule.in_flight or time.monotonic() - self._turn_moved < WATCH_AFTER:
            return
        busy = {m.pid: m for m in self.members if m.items}
        applying = [pid for pid, m in busy.items() if not m.waiting_turn]
        if not applying:
            return
        try:
            rows = self._watch_conn.execute(_BLOCKERS, (applying,)).fetchall()
        except psycopg.OperationalError as e:
            raise TransientError(f"the deadlock watch lost the target: {e}") from None
        waits_for = {int(pid): [int(b) for b in blockers or ()] for pid, blockers in rows}
        for pid in waits_for:
            waits = busy[pid].items
            for holder in _behind(pid, waits_for, busy):
                holds = holder.items
                if not holds or not waits or holds[0].seq < waits[0].seq:
                    continue
                if not holder.backoff.is_set():
                    log.info(
                        "a later transaction holds a lock an earlier one waits for: "
                        "rolling it back",
                        extra={"ctx": {"waits": waits[0].xid, "holds": holds[0].xid}},
                    )
                    holder.backoff.set()
        self._turn_moved = time.monotonic()  # look again in WATCH_AFTER s

    # -- the end ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every member (what they hold rolls back) and close their sessions."""
        counts = self.schedule.counts
        log.info(
            "parallel apply stopping",
            extra={
                "ctx": {
                    "transactions": counts.added,
                    "runs": self.runs,
                    "serialised_by_key": counts.by_key,
                    "barriers": self.barriers,
                }
            },
        )
        self.turn.broken("the pool stops")
        if not self.members and self._opener.ident is not None:
            self._opener.join()  # members opened meanwhile are closed below, unstarted
            got = self._opened
            self.members = got if isinstance(got, list) else []
        for m in self.members:
            m.stop()
        for m in self.members:
            if m.thread.ident is None:  # opened, never started
                continue
            m.thread.join(timeout=30)
            if m.thread.is_alive():
                log.warning("apply session %s did not stop in 30 s", m.index)
        for m in self.members:
            try:
                m.session.close()
            except Exception as e:  # closing a broken session: nothing more to do
                log.debug("closing apply session %s: %s", m.index, e)
            try:
                m.catalog.close()
            except Exception as e:
                log.debug("closing apply session %s's catalog: %s", m.index, e)

    def stats(self) -> PoolStats:
        """Now: sessions, in flight, waiting (for a dependency, a session or the
        turn); since the worker started: how often each thing serialised."""
        waiting = sum(1 for m in self.members if m.waiting_turn)
        counts = self.schedule.counts
        past = self._past or PoolStats.none(0)
        return PoolStats(
            sessions=self.sessions,
            in_flight=self.schedule.in_flight,
            waiting=waiting + len(self._items),
            serialised_by_key=past.serialised_by_key + counts.by_key,
            serialised_by_barrier=past.serialised_by_barrier + counts.by_barrier + self.barriers,
            deadlocks=past.deadlocks + sum(m.deadlocks for m in self.members),
            retried=past.retried + sum(m.retried for m in self.members),
            lane_switches=past.lane_switches,
        )


def _behind(pid: int, waits_for: dict[int, list[int]], busy: dict[int, Member]) -> list[Member]:
    """The members ``pid`` waits for, directly or through members that wait themselves.

    Not only the direct blockers: a backend queued for a row lock is reported
    blocked by whoever holds the *tuple* lock, the first in the queue, which may be a
    later member applying and itself waiting for one idle in its commit turn (T1
    behind T3 behind T2, T2 waiting for T1): backing off T3 frees nothing, T2 must."""
    found: list[Member] = []
    seen = {pid}
    queue_ = list(waits_for.get(pid, ()))
    while queue_:
        b = queue_.pop(0)
        if b in seen or b not in busy:
            continue
        seen.add(b)
        found.append(busy[b])
        queue_.extend(waits_for.get(b, ()))
    return found


def member_applier(applier: Applier) -> Applier:
    """``applier`` made a member's: one source transaction per target transaction,
    nothing applied live, no schema following (the leader's session does both)."""
    applier.group_limit = 1
    applier.streamed.live_apply = False
    applier.rels.follow = None
    return applier
