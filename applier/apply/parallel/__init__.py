"""Parallel apply, the groundwork (issue 36): write sets, the schedule, the origin group.

Wired so far: ``run`` reads its restart point from the origin group at every
start (:func:`~.origins.restart_point`), ``status`` and ``drop`` read the group,
and ``[apply] workers`` refuses more than 1 (exit 2). The rest are the parts the
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

What the wiring will need
=========================

Not done here (the engine is being changed by issue 33 at the same time):

* ``handlers/changes.py``: each change the leader handles is added to a
  :class:`~.writeset.Collector` (``insert``/``update``/``delete``/``truncate``),
  ``handlers/dispatch.py``'s ``on_message`` passes messages to
  :meth:`~.writeset.Collector.message`, and a Relation message that replans a
  table mid-transaction, a table sync cut, careful and one-by-one replay mark
  the transaction a barrier (:meth:`~.writeset.Collector.mark`).
* The lanes past the handlers (``batching/copylane``, ``insertlane``,
  ``mergelane`` and their C twins in ``speedups/``) take rows from their bytes
  without a Collector: with more than one session they either key what they
  take (a C twin of :meth:`~.writeset.KeyCols.key`) or stay off.
* ``handlers/relations.py``: a :class:`~.writeset.TableKeys` built with each
  mapping (:func:`~.tablekeys.load` on the catalog connection, once per table),
  kept beside the RelMap and forgotten with it; a config setting naming the
  tables whose triggers the operator trusts to touch only their own row.
* ``handlers/dispatch.py``: ``end_txn`` hands the transaction (its statements
  and write set) to the pool and the :class:`~.schedule.Schedule` instead of
  committing; group commit happens per session; two-phase adds its COMMIT
  PREPARED as an item with the prepared transaction's write set.
* A session waits for its commit turn before it sends COMMIT
  (:func:`~.turn.commit_in_turn`, built; the stamp stays inside COMMIT), sets up
  its member of the group (:func:`~.origins.setup_session`), and rewinds only
  its own origin (``TargetSession`` given the member's name does).
* ``target/origin.py``'s :class:`FlushTracker` gets commits in order from the
  pool (ordered commits keep its pairs in order as today).
* ``worker.py`` reads :func:`~.origins.restart_point` at every start, with one
  session too (done: after a run with N sessions the plain origin lags the
  group, and reading it alone would apply the group's transactions again).
  ``status`` and ``drop`` read the group (done); the second-worker check must
  too once a pool holds members (a member is never another worker's origin:
  ``<origin>.<n>``, :mod:`.origins`); a pool watches
  ``pg_blocking_pids()`` for a deadlock the keys missed (issue 36, item 4).
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
