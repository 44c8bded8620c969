"""Parallel apply: N target sessions apply independent transactions at once, in commit order.

``[apply] workers = N`` (N > 1). The worker chooses once per session
(:func:`~.start.open_leader`): with one session it runs the Applier as before;
with more, the :class:`~.leader.Leader` takes every batch. Its own *home*
Applier (holding the plain origin, on the worker's thread) applies what cannot
run beside others; the :class:`~.pool.Pool`'s members (:mod:`.member`, one
thread and target session each, origin ``<origin>.<n>``) apply the rest. Each
member runs the same Applier over whole transactions: the handlers, the one path
decision, the lanes and the conflict rules are the engine's, not copies.

The idea
========

One leader receives, decodes and plans in source commit order, as today. Each
transaction is handed to one of N target sessions; transactions that touch
disjoint rows are applied at the same time, and **each commits only after the
one before it in source order has committed**. Three questions follow, one
module each:

* :mod:`.writeset` - which rows a transaction touches, as hashed keys the
  leader computes from the decoded tuples (no round trip; 0.2-0.8 µs of CPU a
  change where the identity is the table's only key, ~2 µs with a unique index
  and a foreign key besides: ``bench/writeset_bench.py``), with what cannot be
  keyed made a *barrier*.
  :mod:`.tablekeys` reads, once per target table, the unique indexes and
  foreign keys the keys are made of.
* :mod:`.schedule` - given the write sets in commit order, which transaction
  may start now and which may commit; memory bounded by what is in flight.
* :mod:`.origins` - how progress stays exactly-once with N sessions: one origin
  per session before PostgreSQL 19 (the restart point is the largest progress
  among them), one shared origin on 19+.
* :mod:`.lanes` - whether the pool pays at all: its members are threads of one
  process (one interpreter lock), so while applier's CPU is the limit the
  leader's own session applies ordinary transactions inline, as one session
  would, and the pool only while the target is the limit (``[apply] adaptive``).
* :mod:`.turn` - each session waits for its commit turn (the predecessor's
  COMMIT returned) and sends COMMIT with the stamp inside; a failed one stops
  every later one.

Why a key set is enough, and what it must hold
==============================================

Two transactions E (earlier) and L (later) run at once on two sessions. Under
READ COMMITTED each statement of L sees what was committed when it started.
If L ran before E committed, it goes wrong in exactly these ways:

1. L does not see a row E inserted or changed (L's UPDATE or DELETE finds no
   row, or the old one): the same row identity in both, keyed by the replica
   identity (old and new key of an UPDATE).
2. L's INSERT or UPDATE collides in a unique index with a value E removes
   (a key moved from one row to another: E updates ``u`` from 'a' to 'b', L
   inserts 'a'): L fails with a unique violation instead of waiting, since the
   row holding 'a' is committed. Hence every unique index of the *target* is a
   key too, with the old values of what E changed.
3. A foreign key check in L that does not see E's parent row. The apply
   session runs with ``session_replication_role = replica``, so the target's
   RI triggers fire only if someone made them ENABLE ALWAYS; a child's INSERT or
   UPDATE still *reads* its parent's key, so that when they do fire, L waits
   for E's parent. A read does not conflict with a read (children of one parent
   stay parallel), only with a write of that key.

Otherwise L only ever waits for a lock E holds, which ends when E commits.
The reverse, E waiting for a lock L holds while L waits for its commit turn,
is a deadlock PostgreSQL cannot see; L holds locks only on rows and index
entries it touches, so with disjoint keys it needs one of what the keys do not
see: values equal under ``=`` but spelt differently (``numeric`` scales,
``citext``, a nondeterministic collation) in a unique index, or what a trusted
trigger does. The pool will watch ``pg_blocking_pids()`` for those (issue 36,
item 4): roll L back, apply it after E.

Barriers
========

A transaction the leader cannot key waits for every earlier one to commit and
holds every later one back: TRUNCATE; a schema change (a Relation message that
replans a table mid-stream, a captured DDL message, :data:`applier.ddl.message.PREFIX`); a
change of a table whose target fires something on it (an ENABLE ALWAYS or
REPLICA trigger or rule: it may write anywhere) unless the operator says its
triggers touch only their own row; a table being synced (its hand-over) and
a careful or one-by-one replay (:mod:`applier.apply.batching.paths` inputs: the
leader marks those). A table whose rows cannot be keyed (REPLICA IDENTITY FULL
without a unique index, an exclusion constraint, a partial or expression unique
index, a unique column the source does not send) is not a barrier for the
whole stream: its changes *write the table's key*, which every change of that
table reads, so they are ordered against that table only.

How it is wired
===============

* :mod:`.leader` - holds each ordinary transaction while it arrives, keying
  its changes (:class:`~.writeset.Collector`, per change, no round trip), and
  at its Commit adds it to the pool or, if it is a *barrier*, drains the pool and
  applies it on the home session, its commit waited for. One method says what is
  a barrier from the transaction (applied before, careful or one-by-one replay,
  skip rules loaded, a table sync handing over, another origin filtered) and
  one from its tables (a new or changed Relation or Type message, no mapping
  yet, a table being synced, a trigger not trusted, what the collector marks).
  Stream blocks only fill the home session's spool; Stream Commit, two-phase
  and anything outside a transaction go to the home session after a drain; a
  transaction too long to hold goes there as it arrives.
* :mod:`.pool` - the :class:`~.schedule.Schedule` (dependencies, commit order),
  runs of consecutive ready transactions handed to free members (one target
  transaction per run: group commit inside the pool), the members' results
  taken in order (flush tracker, counters, progress, as one session keeps
  them), the deadlock watch over ``pg_blocking_pids()``.
* :mod:`.member` - applies a run, checks its results before its turn (a
  refusal beside earlier transactions, or a deadlock PostgreSQL broke, is
  applied again alone after them), waits for the turn (backing off when the
  watch says a predecessor waits for its locks), commits, reports, passes the
  turn on.
* :mod:`.start` - the members' origins, sessions and Appliers.
* Everything that asks how far the target is reads the group's largest
  progress (:mod:`applier.origingroup`): the worker's restart point, ``status``,
  ``drop``, ``cutover``, ``skip add``, table syncs.

Not done: PostgreSQL 19's shared origin (:func:`~.origins.setup_session`) is
written but not used (no 19 here to test it on); every target uses the group.
Streamed transactions are not applied live with a pool (they are spooled and
applied at their Stream Commit as barriers).
"""

from applier.apply.parallel.leader import Leader
from applier.apply.parallel.origins import restart_point
from applier.apply.parallel.pool import PoolStats
from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.start import open_leader
from applier.apply.parallel.writeset import Collector, KeySpace, TableKeys, WriteSet

__all__ = [
    "Collector", "KeySpace", "Leader", "PoolStats", "Schedule", "TableKeys", "WriteSet",
    "open_leader", "restart_point",
]  # fmt: skip
