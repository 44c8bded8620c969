"""Group commit: several source transactions in one target transaction.

The rule :class:`~applier.apply.handlers.dispatch.Applier` follows at each Commit
(``Applier.end_txn``), its timing here (:func:`max_age`).

Group commit
============

Several consecutive source transactions may share one target transaction
(``[apply] group_commit``: at most that many, 1000 by default; 1 turns it off).
At a Commit the target transaction stays open
while (a) the group is below its count and younger than :data:`GROUP_MAX_AGE`
(2 ms; :data:`GROUP_MAX_AGE_BEHIND`, 50 ms, for a transaction the source sent
at least :data:`BEHIND_AFTER`, 100 ms, after it committed: one from a backlog),
(b) more messages are already in hand:
the worker commits the open group once the stream has no more received
messages to give (a read that does not wait), so a group never waits for the
network and latency stays that of what was in hand (a batch
that ends inside a transaction leaves the group open until that transaction's
Commit: its rows are in the target transaction already, and committing them
stamped with the previous transaction's position would apply them twice after a
restart), and (c)
the transaction ends beyond ``no_group_until`` (below). The group commits with
the origin stamped with its LAST transaction's (end_lsn, commit_ts): all of its
source transactions become visible, and the origin moves past all of them, in
one atomic commit, so exactly-once holds as for a single transaction (after a
crash the origin is either before the group or past all of it). The flush
tracker gets one pair per group; an empty transaction inside an open group
joins it (its position is not confirmed before the group commits).

Not grouped (the group is committed first, and they commit alone): streamed
transactions (Stream Commit/Prepare: large by definition), two-phase
(Begin Prepare .. Prepare, Commit/Rollback Prepared: PREPARE TRANSACTION names
one source transaction, and their prepared-GID checks are queries outside a
transaction). TRUNCATE is grouped: it is transactional on PostgreSQL; it only
holds its ACCESS EXCLUSIVE lock until the group commits, bounded as above.
Skipped (already applied) transactions come before any group by LSN order.

When anything fails while a group holds earlier transactions (a row, the
COMMIT, a schema mismatch), the error's context may name the wrong
transaction: the target transaction is rolled back and the origin's session
values reset (as for any failure), the session starts over from the origin
(which is before the group), and every transaction up to the last position
received is applied one by one; the failing one then fails alone, with its own
LSN/xid/table/key, after committing those before it; a failed merged or
multi-row statement is replayed the same way (without merging), even when it
held a single transaction. Rows that UPDATE/DELETE did not find may be counted
twice in that case. ``group_commit = 1`` behaves
exactly as before.

Within the target transaction, an UPDATE that keeps its key is held and
merged with later UPDATEs of the same row; only the final values go out, a
table's rows in a few multi-row statements (:mod:`applier.apply.batching.merge`, which
says for which tables this cannot be told apart from one by one).

Commits are pipelined (:mod:`applier.apply.target.session`, "Pipelined commits"): a
group's commit is sent and the worker goes on; its bookkeeping (applied count,
last commit, the flush tracker's local LSN) runs when the result arrives, and
the flush tracker holds back every position behind a commit still unanswered.
A failure found in such a commit may carry a later transaction's context: it is
treated like a failed group (start over from the origin, one by one, waiting
for each commit).
"""

from __future__ import annotations

#: Seconds a group stays open at most (see the module doc): under a steady load
#: the stream always has more in hand, and a group of 100 would hold the first
#: transaction's rows back for 100 source transactions (pgbench at 1500 tps: a
#: median lag of 25 ms against the built-in's 7 ms).
GROUP_MAX_AGE = 0.002
#: ... and while the source sends from a backlog (BEHIND_AFTER): the lag is then the
#: backlog's, not the group's, and a longer group lets a run of INSERTs go on across
#: its transactions as one COPY (200 transactions of 1000 rows, PK + 3 indexes:
#: applier CPU 0.80 -> 0.43 s, its target backend 1.34 -> 1.25 s; 20, 50 and 200 ms
#: measured alike). It also lets a backlog's groups reach the default group_commit
#: of 1000: a 20,000-transaction pgbench backlog then merges more of its branch and
#: teller UPDATEs, target backend CPU 0.36-0.51 -> 0.26-0.28 s against 100 (10000:
#: no better).
GROUP_MAX_AGE_BEHIND = 0.05
#: Microseconds between a transaction's commit and the walsender sending its end
#: from which the worker counts as behind. Both are the source's clock (the commit
#: timestamp, the XLogData's send_time), so no clock skew between hosts enters.
BEHIND_AFTER = 100_000


def max_age(sent_at: int, commit_ts: int) -> float:
    """How long the open group may stay open, in seconds, when a transaction the
    source committed at ``commit_ts`` and sent at ``sent_at`` (both the source's
    clock, microseconds) joins it: longer when it came from a backlog."""
    return GROUP_MAX_AGE_BEHIND if sent_at - commit_ts >= BEHIND_AFTER else GROUP_MAX_AGE


__all__ = ["BEHIND_AFTER", "GROUP_MAX_AGE", "GROUP_MAX_AGE_BEHIND", "max_age"]
