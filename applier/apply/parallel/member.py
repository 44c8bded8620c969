"""One apply session of the pool: a thread, a target session holding its origin, an Applier.

A member is the engine of ``workers = 1`` (:class:`~applier.apply.handlers.dispatch.Applier`
with everything it owns: the target session and its pipeline, the lanes, the
conflict resolver) run on a thread of its own over whole transactions the
leader hands it (:class:`Item`): the same handlers, the same one path decision,
the same lanes, nothing re-implemented. What differs is only around COMMIT.

The life of a transaction in a member
=====================================

1. The Relation and Type messages the member has not seen yet (the leader
   knows which) and the transaction's messages up to its Commit go through the
   handlers, pipelined as with one session.
2. *Check*: what is held is sent and every result read (one round trip,
   :meth:`~applier.apply.target.session.TargetSession.check_in_txn`). A change
   refused here while an earlier transaction was still open (a key the write
   set did not see: a unique index whose equal values are spelt differently,
   a trigger trusted wrongly) or a deadlock PostgreSQL broke (40P01) is not an
   error yet: the member rolls back, waits until every earlier transaction has
   committed, and applies it again alone; only a second failure is the
   transaction's own, raised as with one session. A run of several
   transactions that fails is applied again one by one the same way, so that an
   error names its own transaction.
3. *Turn*: wait until the transaction before it in source order has committed
   (:class:`~.turn.CommitTurn`). While it waits the leader may ask it to *back
   off* (:attr:`Member.backoff`): an earlier transaction's backend is blocked on a
   lock this one holds, a deadlock PostgreSQL cannot see, since this side waits
   in applier. It rolls back (its locks go), waits for its turn, applies again.
4. *Commit*: the Commit message goes through the handlers with the member's
   Applier set to wait for the result (the stamp of the member's origin is
   inside COMMIT); its result is reported to the leader *before* the turn passes
   on, so the leader receives results in source order.

A failure anywhere else breaks the turn (no later transaction commits) and is
reported; the leader stops every member and the worker starts over from the
restart point (:mod:`.origins`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from applier.apply.core.states import open_state_of
from applier.apply.handlers.dispatch import Applier
from applier.apply.parallel.turn import CommitTurn, TurnBroken
from applier.apply.target.origin import FLUSHED
from applier.errors import ApplierError, TransientError
from applier.lsn import Lsn
from applier.protocol import InsertRun, Relation, Type
from applier.speedups import Flag, StopFlag, dispatch_batch

log = logging.getLogger("applier.apply")

#: SQLSTATEs after which a transaction is applied again alone even when it was
#: next in turn: PostgreSQL broke a deadlock (or a serialization failure) by
#: choosing it, and the other side will have committed or backed off.
_AGAIN = ("40P01", "40001")

#: Seconds between two looks at the back-off request while waiting for the turn.
_TURN_POLL = 0.05


def run_handlers(applier: Applier, msgs: list[tuple[Lsn, Any]], flag: StopFlag) -> None:
    """``msgs`` through ``applier``'s handlers on their common path, as the worker's
    batches go (``dispatch_batch``, C or its Python twin)."""
    dispatch_batch(msgs, applier.handlers, open_state_of(applier), applier.dispatch, flag)


def _whole(msgs: list[tuple[Lsn, Any]]) -> list[tuple[Lsn, Any]]:
    """``msgs`` to apply, the held ones left whole for another application: the
    handlers take an InsertRun's rows out of its ``datas`` as they apply them
    (:meth:`~applier.apply.handlers.changes.RowChanges.on_insert_run`), so a run applied
    again (a refusal beside earlier transactions, a back-off) would find them gone."""
    if not any(type(m) is InsertRun for _, m in msgs):
        return msgs
    return [
        (lsn, InsertRun(m.first, list(m.datas), list(m.lsns)) if type(m) is InsertRun else m)
        for lsn, m in msgs
    ]


@dataclass(slots=True)
class Item:
    """One source transaction for a member: its messages, Begin to Commit."""

    seq: int
    msgs: list[tuple[Lsn, Any]]
    end_lsn: Lsn
    commit_ts: int
    xid: int
    #: The Relation messages current when it was received, of the tables it changes.
    relations: dict[int, Relation] = field(default_factory=dict)
    #: The Type messages current when it was received.
    types: dict[int, Type] = field(default_factory=dict)
    #: Its row changes (what it holds in memory).
    rows: int = 0


@dataclass(slots=True)
class Report:
    """What a member tells the leader about a run of items: committed, or failed."""

    member: Member
    items: list[Item]
    #: The target WAL position to see flushed before confirming (FLUSHED: none).
    local: Lsn = FLUSHED
    #: The target's flush position its commit's result carried (releases earlier ones).
    flushed: Lsn = FLUSHED
    error: BaseException | None = None
    #: The member is free after this report: False for all but the last of a run
    #: applied again one transaction at a time (each is reported as it commits).
    last: bool = True


class Member:
    """One apply session of the pool (see the module docstring)."""

    def __init__(
        self,
        index: int,
        applier: Applier,
        turn: CommitTurn,
        report: Callable[[Report], None],
        catalog: psycopg.Connection[Any],
    ) -> None:
        self.index = index
        self.applier = applier
        self.session = applier.session
        #: The member's own catalog connection (its Applier's look-ups), closed with it.
        self.catalog = catalog
        self.turn = turn
        self._report = report
        #: Held while a commit's counts are added up, so the leader can take them.
        self.lock = threading.Lock()
        applier.commit_waits = True
        applier.hold_commits = True
        applier.on_committed = self._committed
        self._local: Lsn | None = None
        self._flag = Flag()
        self.inbox: queue.SimpleQueue[list[Item] | None] = queue.SimpleQueue()
        #: The leader asks this member to roll back and wait (a deadlock it cannot see).
        self.backoff = threading.Event()
        #: The backend's pid, for the leader's deadlock watch.
        self.pid = self.session.conn.info.backend_pid
        #: Leader's side: the run in hand (None: free), what the member has seen.
        self.items: list[Item] | None = None
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        #: What the member is doing, read by the leader's watch and status.
        self.waiting_turn = False
        #: Counted on the member's thread, read by the metrics.
        self.deadlocks = 0
        self.retried = 0
        self.thread = threading.Thread(target=self._run, name=f"applier apply {index}", daemon=True)

    # -- the leader's side ------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def give(self, items: list[Item]) -> None:
        """Hand a run of consecutive items over (one target transaction), with the
        Relation and Type messages the member lacks before each."""
        self.items = items
        for item in items:
            prelude: list[tuple[Lsn, Any]] = []
            for oid, t in item.types.items():
                if self.types.get(oid) is not t:
                    self.types[oid] = t
                    prelude.append((Lsn(0), t))
            for oid, r in item.relations.items():
                if self.relations.get(oid) is not r:
                    self.relations[oid] = r
                    prelude.append((Lsn(0), r))
            if prelude:
                item.msgs = prelude + item.msgs
        self.inbox.put(items)

    def stop(self) -> None:
        """Ask the thread to end after what it holds (the turn is broken first)."""
        self.inbox.put(None)

    # -- the member's thread ----------------------------------------------------------

    def _run(self) -> None:
        while True:
            items = self.inbox.get()
            if items is None:
                return
            try:
                self._apply(items)
            except TurnBroken as e:
                self._abandon()
                self._report(Report(self, items, error=e))
            except BaseException as e:  # reported: the leader raises it in the worker
                self.turn.broken(f"session {self.index}: {e}")
                self._abandon()
                self._report(Report(self, items, error=e))

    def _apply(self, items: list[Item]) -> None:
        beside = self.turn.committed < items[0].seq - 1
        try:
            self._statements(items)
        except ApplierError as e:
            broken = e.context.get("sqlstate") in _AGAIN
            # A lost connection is no refusal: the worker reconnects (not counted).
            if not broken and (isinstance(e, TransientError) or not (beside or len(items) > 1)):
                raise
            self._again(items, f"refused beside earlier transactions: {e}")
            return
        if self._wait_turn(items):
            return
        try:
            self._commit(items)
        except ApplierError as e:
            # A refusal found at COMMIT (not checked when next in turn) in a run of
            # several: the turn is still this run's; apply them one by one, so that
            # the error names its own transaction. Lost, it cannot be told: raise.
            if isinstance(e, TransientError) or len(items) == 1:
                raise
            self._again(items, f"a run refused at its commit: {e}")

    def _statements(self, items: list[Item]) -> None:
        """Every message of the run, its Commits held (the Applier's ``hold_commits``),
        then what is held sent and checked."""
        applier = self.applier
        for item in items:
            run_handlers(applier, _whole(item.msgs), self._flag)
        applier.send_held()
        # Next in turn (nothing earlier is open): a refusal is its own, found at
        # COMMIT as with one session; the check's round trip is spared.
        if self.session.in_txn and self.turn.committed < items[0].seq - 1:
            self.session.check_in_txn()

    def _wait_turn(self, items: list[Item]) -> bool:
        """Wait for the turn; True if the leader asked to back off (then the run was
        applied again, and committed, after its predecessor)."""
        self.waiting_turn = True
        try:
            while not self.turn.wait(items[0].seq, _TURN_POLL):
                if self.backoff.is_set():
                    self.deadlocks += 1
                    self.waiting_turn = False
                    self._again(items, "an earlier transaction waits for a lock it holds")
                    return True
        finally:
            self.waiting_turn = False
        return False

    def _again(self, items: list[Item], why: str) -> None:
        """Roll back, wait until every earlier transaction committed, then apply and
        commit each alone (so that an error names its own transaction)."""
        log.info(
            "applying transactions again after the ones before them",
            extra={"ctx": {"session": self.index, "xids": [i.xid for i in items], "why": why}},
        )
        self.retried += len(items)
        self.backoff.clear()
        self._abandon(recover=True)
        self.waiting_turn = True
        try:
            self.turn.wait(items[0].seq)
        finally:
            self.waiting_turn = False
        for n, item in enumerate(items, 1):
            self._statements([item])
            self._commit([item], last=n == len(items))

    def _commit(self, items: list[Item], last: bool = True) -> None:
        """The turn came: commit the run, report it, pass the turn on."""
        self._local = None
        with self.lock:
            self.applier.commit_group(turn=True)
        local = FLUSHED if self._local is None else self._local
        self._report(Report(self, items, local, self.session.flushed_seen, last=last))
        for item in items:
            self.turn.done(item.seq)

    def _committed(self, end_lsn: Lsn, ts: int, local: Lsn) -> None:
        self._local = local

    def _abandon(self, recover: bool = False) -> None:
        """Roll back what is in hand (the origin untouched); ``recover``: to apply
        the transaction again, so the session must be usable (a failure there raises)."""
        try:
            self.applier.abandon()
            if recover:
                self.session.forget_failure()
        except ApplierError as e:
            if recover:
                raise
            log.debug("session %s: rollback failed: %s", self.index, e)
