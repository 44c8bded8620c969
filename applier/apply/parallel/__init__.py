"""Parallel apply, the groundwork (issue 36): write sets, the schedule, the origin group.

Nothing here is wired into the running engine yet: these are the parts the
leader and its N apply sessions will meet through, each tested on its own.
ARCHITECTURE.md ("How several apply sessions would plug in") is the plan; this
docstring is the design of what is built.

The idea
========

One leader receives, decodes and plans in source commit order, as today. Each
transaction is handed to one of N target sessions; transactions that touch
disjoint rows are applied at the same time, and **each commits only after the
one before it in source order has committed**. Three questions follow, one
module each:

* :mod:`.writeset` - which rows a transaction touches, as hashed keys the
  leader computes from the decoded tuples (no round trip, ~1 µs a change:
  ``bench/parallel_bench.py``), with what cannot be keyed made a *barrier*.
  :mod:`.tablekeys` reads, once per target table, the unique indexes and
  foreign keys the keys are made of.
* :mod:`.schedule` - given the write sets in commit order, which transaction
  may start now and which may commit; memory bounded by what is in flight.
* :mod:`.origins` - how progress stays exactly-once with N sessions: one origin
  per session before PostgreSQL 19 (the restart point is the largest progress
  among them), one shared origin on 19+.

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

Whatever else happens when L runs early is a lock wait of L on E, which ends
when E commits, and E never waits for L's commit turn. The reverse (E waits for
a lock L holds while L waits for its turn) is the deadlock PostgreSQL cannot
see; the write sets make it impossible for the cases above, and the pool will
watch ``pg_blocking_pids()`` for the rest (issue 36, item 4).

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

What the wiring will need
=========================

Not done here (the engine is being changed by issue 33 at the same time):
the leader's change handlers (``handlers/changes.py``) add each change to a
:class:`~.writeset.Collector`, and the lanes past them (``batching/copylane``,
``insertlane``, ``mergelane``, C twins included) either key their rows too or
are off with more than one session; ``handlers/relations.py`` builds a
:class:`~.writeset.TableKeys` with each mapping (one catalog query per table,
:func:`~.tablekeys.load`); ``handlers/dispatch.py`` ends a transaction into the
:class:`~.schedule.Schedule` instead of committing it; ``target/session.py``
waits for its commit turn before COMMIT (the stamp stays inside COMMIT) and
sets up its own origin of the group (:mod:`.origins`); ``worker.py`` reads the
restart point from the group, and ``status``, ``drop`` and the second-worker
check read the group, not one origin.
"""

from applier.apply.parallel.schedule import Schedule
from applier.apply.parallel.writeset import Collector, KeySpace, TableKeys, WriteSet

__all__ = ["Collector", "KeySpace", "Schedule", "TableKeys", "WriteSet"]
