"""Which transaction may start, and which may commit: write sets in commit order.

The rules
=========

Transactions are added in source commit order and numbered 1, 2, ... (``seq``).

* **Start**: a transaction may start when every earlier transaction it
  conflicts with (:meth:`~.writeset.WriteSet.conflicts`: a key one writes and
  the other writes or reads) has *committed*, not merely applied: its statements
  must see those rows. A barrier may start when every earlier transaction has
  committed, and no later one starts before it has.
* **Sessions** take ready transactions lowest seq first
  (:meth:`Schedule.next_ready`), so the next one to commit is never left
  without a session behind others waiting for their turn.
* **Commit**: a transaction commits only after its predecessor committed, so
  the committed transactions are always a prefix of the source's order
  (:mod:`.origins` builds exactly-once on that).

Because commits are ordered, "every transaction a depends on has committed" is
"the *latest* of them has": each transaction keeps one number, ``after``, the
largest seq it must wait for (0: none), and may start once ``committed >=
after``. The key table keeps, per key, only the latest uncommitted writer and
the latest uncommitted reader: a new writer of the key waits for both, a new
reader for the writer. Waiting transactions are filed under their ``after``
and released when exactly that seq commits.

Memory
======

The key table holds the keys of uncommitted transactions only: a commit
removes each of its keys unless a later transaction took it over (which then
removes it at its own commit). So over a months-long run it holds at most the
keys of what is in flight, and the leader bounds that (it stops reading when
:attr:`Schedule.in_flight` reaches its window). Numbers are Python integers:
no wrap-around.

Two-phase and streamed transactions are the leader's to fit in: a prepared
transaction's locks live until COMMIT PREPARED, so the leader adds the
COMMIT/ROLLBACK PREPARED as an item of its own with the prepared transaction's
write set (a later transaction on those rows waits for it); a spooled
streamed transaction is added at its Stream Commit, like any other.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from applier.apply.parallel.writeset import WriteSet


@dataclass(slots=True)
class Counts:
    """How often the schedule serialised a transaction, and why (metrics)."""

    added: int = 0
    #: It had to wait for an earlier transaction that shares a key.
    by_key: int = 0
    #: It was a barrier, or came after one, with earlier work unfinished.
    by_barrier: int = 0


class Schedule:
    """The dependencies and the commit order of the transactions in flight."""

    def __init__(self) -> None:
        #: The seq of the last transaction added, and of the last committed: every
        #: transaction up to :attr:`committed` has committed.
        self.added = 0
        self.committed = 0
        self.counts = Counts()
        #: key -> the latest uncommitted transaction that writes it / reads it.
        self._writer: dict[int, int] = {}
        self._reader: dict[int, int] = {}
        #: The seq of the last barrier added (it holds back whatever comes later).
        self._barrier = 0
        #: Uncommitted transactions' write sets (their keys go at commit).
        self._sets: dict[int, WriteSet] = {}
        #: after -> transactions that may start once that seq has committed, and
        #: the reverse (a waiting transaction may join the run it waits for).
        self._waiting: dict[int, list[int]] = {}
        self._after: dict[int, int] = {}
        #: Transactions that may start, not started yet: lowest seq first.
        self._ready: list[int] = []
        self._started: set[int] = set()

    @property
    def in_flight(self) -> int:
        """Transactions added and not yet committed."""
        return self.added - self.committed

    def keys_held(self) -> int:
        """Entries in the key table (bounded by the keys of what is in flight)."""
        return len(self._writer) + len(self._reader)

    def add(self, ws: WriteSet) -> int:
        """Add the next transaction in commit order; its seq."""
        seq = self.added = self.added + 1
        self._sets[seq] = ws
        self.counts.added += 1
        after = self._barrier if self._barrier > self.committed else 0
        if ws.barrier is not None:
            by_key, after = 0, seq - 1
            self._barrier = seq
        else:
            by_key = self._depend(seq, ws)
        if after <= self.committed and by_key <= self.committed:
            heapq.heappush(self._ready, seq)
            return seq
        if by_key > after:
            self.counts.by_key += 1
        else:
            self.counts.by_barrier += 1
        wait_for = max(after, by_key)
        self._waiting.setdefault(wait_for, []).append(seq)
        self._after[seq] = wait_for
        return seq

    def _depend(self, seq: int, ws: WriteSet) -> int:
        """Register ``ws``'s keys as ``seq``'s; the latest earlier transaction it must wait for."""
        writer, reader = self._writer, self._reader
        after = 0
        for k in ws.writes:
            w = writer.get(k, 0)
            r = reader.get(k, 0)
            after = max(after, w, r)
            writer[k] = seq
        for k in ws.reads:
            after = max(after, writer.get(k, 0))
            reader[k] = seq
        return after

    def ready(self) -> list[int]:
        """The transactions that may start now, lowest seq (next to commit) first."""
        return sorted(self._ready)

    def next_ready(self) -> int | None:
        """Take the lowest seq that may start (started from now on), or None.

        Only lowest first: a session holds its transaction until it commits, so
        sessions given later transactions while the next one to commit waits for
        a session would wait for a turn that never comes (the generated histories
        found it: one session, T4 started while T3 was ready). Lowest first, the
        next to commit is always ready and takes the next free session.
        """
        if not self._ready:
            return None
        seq = heapq.heappop(self._ready)
        self._started.add(seq)
        return seq

    def next_run(self, limit: int, chain: int | None = None, head_limit: int = 0) -> list[int]:
        """Take the lowest ready seq and the ones right after it, consecutive, that a
        session may apply in the same target transaction (its commit stands for all,
        so they must follow each other in commit order):

        * ready ones, up to ``limit`` in all (``head_limit``, if larger, for a run
          that starts at the next transaction to commit);
        * when the run starts at the next transaction to commit (everything before
          it has committed), also ones waiting only for a transaction in the run,
          up to ``chain`` in all: the session applies them after it, so a chain of
          transactions on one hot row goes as one group, as one session would.
        """
        first = self.next_ready()
        if first is None:
            return []
        run = [first]
        head = first == self.committed + 1
        if head:
            limit = max(limit, head_limit)
        chain = limit if chain is None else max(limit, chain)
        ready, after = self._ready, self._after
        while True:
            nxt = run[-1] + 1
            if len(run) < limit and ready and ready[0] == nxt:
                heapq.heappop(ready)
            elif head and len(run) < chain and after.get(nxt, 0) >= first:
                waits = self._waiting[after.pop(nxt)]
                waits.remove(nxt)
            else:
                return run
            self._started.add(nxt)
            run.append(nxt)

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def may_commit(self, seq: int) -> bool:
        """Whether ``seq`` (started) may commit now: its predecessor has committed."""
        return seq == self.committed + 1 and seq in self._started

    def commit(self, seq: int) -> list[int]:
        """``seq`` committed; the transactions this released (they may start now)."""
        if not self.may_commit(seq):
            raise ValueError(
                f"transaction {seq} may not commit: committed up to {self.committed}, "
                f"{'started' if seq in self._started else 'not started'}"
            )
        self._started.discard(seq)
        ws = self._sets.pop(seq)
        writer, reader = self._writer, self._reader
        for k in ws.writes:
            if writer.get(k) == seq:
                del writer[k]
        for k in ws.reads:
            if reader.get(k) == seq:
                del reader[k]
        self.committed = seq
        released = self._waiting.pop(seq, [])
        for s in released:
            del self._after[s]
            heapq.heappush(self._ready, s)
        return released

    def abandon(self) -> None:
        """Forget every uncommitted transaction (a session failed: the stream resends
        them from the restart point, and they are added again)."""
        self.added = self.committed
        self._writer.clear()
        self._reader.clear()
        self._sets.clear()
        self._waiting.clear()
        self._after.clear()
        self._ready.clear()
        self._started.clear()
        self._barrier = 0
