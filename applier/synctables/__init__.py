"""``applier sync-tables``: copy tables added to a running replication, then hand them over.

The built-in subscriber's table sync (``tablesync.c``: INIT, DATASYNC,
FINISHEDCOPY, SYNCWAIT, CATCHUP, SYNCDONE, READY) done by a command next to a
running ``applier run``. A table's state is a row of ``applier.table_sync``
(migration 0008), keyed by origin and source table; the worker's half is
:mod:`applier.apply.rules.tablesync`.

Positions
---------
A transaction is named by its commit record, which starts at ``c`` and ends at
``e``; no other record lies between. Every position used as a boundary ``X``
below is a record boundary (a Commit's end, a keepalive's sent position, an
XLogData's position), so ``e <= X`` <=> ``c < X``; the worker compares the
``commit_lsn`` its Begin carries. "``X`` covers a transaction" means ``e <= X``.

States and who writes them
--------------------------
``skipped`` (worker) -> ``init`` -> ``copying`` (lsn L) -> ``catchup`` ->
``syncwait`` (sync-tables) -> ``handover`` (lsn W, worker) -> ``syncdone``
(lsn X, sync-tables, by compare-and-set on ``handover W``) -> ``ready`` (worker
or sync-tables, once the worker's origin is at or past X). A worker that cannot
finish a handover in time moves ``handover W`` back to ``catchup`` (also by
compare-and-set). The worker applies none of the table's changes in the states
before ``syncdone``; in ``syncdone X`` it skips those of transactions ``X``
covers and applies the others; in ``ready`` all.

The steps, and why nothing is lost or doubled
---------------------------------------------
1. **Copy** (``init``/``copying``, :mod:`.copy`). A permanent slot of the
   table's own (named ``tag``, a hash of origin and table: a crash of
   sync-tables after the copy resumes the catch-up from it instead of copying
   again; dropped at the end) is created with an exported snapshot at its
   consistent point ``L``;
   the table is created on the target from the source's definitions (the
   bootstrap's :mod:`applier.bootstrap.schema`) and copied under that snapshot
   by the bootstrap's Spark job (slices, a done-record per slice). The
   snapshot holds exactly the transactions ``L`` covers; the slot streams
   exactly those it does not. Indexes and constraints (post-data), the origin
   ``tag`` and the state ``catchup`` commit in one target transaction, and the
   origin is then advanced to ``L`` (a rerun never moves it: a crash before
   the advance leaves it without progress, and the stream then starts at the
   slot's confirmed point, still ``L``). A crash before that transaction
   commits leaves ``copying``: the rerun drops the slot and the origin, empties
   the table (the row proves it is ours) and copies again under a new snapshot
   (the old snapshot died with its connection, and slices of two snapshots
   cannot be mixed). The worker applies none of the table's changes meanwhile
   (it never blocks on it either: the table's changes are skipped one by one,
   everything else is applied).
2. **Catch-up** (``catchup``, :mod:`.catchup`). sync-tables streams the
   table's slot with the worker's own machinery (``Applier``, the same
   handlers, group commit, conflicts) under a config whose ``[tables]`` is
   only this table and whose origin is ``tag``: each applied transaction
   moves ``tag`` in its own commit, so a crash and a rerun continue exactly
   once from ``tag``'s progress (the slot is confirmed only up to what is
   durably applied, so it never runs ahead of the origin's progress).
3. **Handshake**. When its stream has reached the worker's slot's confirmed
   position (so the worker's pause will be short), sync-tables writes
   ``syncwait``. The worker, at a transaction boundary (nothing of a
   transaction in hand), writes ``handover W`` with W = the furthest position
   its stream received; it has processed everything W covers and nothing
   else, so every change of the table it ever skipped is covered by W (a
   previous session's skips were confirmed at most up to the slot's confirmed
   point, which this session's keepalives report: the worker waits for one
   before answering). It then pauses, reading nothing from its stream, for
   at most ``HANDOVER_WAIT`` seconds. sync-tables, once every commit of its own
   is answered and its stream has received X >= W at a transaction boundary
   (it asks the walsender for a keepalive to learn it), changes ``handover W``
   into ``syncdone X``: it applied exactly the table's transactions X covers.
   The worker reads it and resumes: it skips the table's changes in
   transactions X covers (applied by sync-tables: none is doubled) and applies
   the others (none of them was applied by sync-tables, none skipped by the
   worker before: they lie past W). Its own writes come after sync-tables'
   commits (it waited for them), so an UPDATE never precedes the INSERT it
   needs.
4. **Timeouts and crashes at the handover**. If the worker's wait ends first,
   it moves ``handover W`` back to ``catchup`` by compare-and-set and goes on
   skipping; sync-tables' compare-and-set on ``handover W`` then fails, and it
   asks again later (the worker answers that table again only after three
   pauses' worth of time, so a slow sync-tables does not stall it). Exactly
   one of the two succeeds, so W is either honoured (the worker paused at it)
   or withdrawn. A worker that stops while paused
   leaves ``handover W``; the next session settles it *before streaming*
   (waits for ``syncdone``, or withdraws W): it restarts at or before W (it
   never confirmed past it), so W still covers everything skipped. A
   sync-tables that dies in ``syncwait`` or ``handover`` resumes from ``tag``;
   the worker withdraws its W after the wait, and the rerun asks again.
5. **Cleanup**. After ``syncdone`` the table's slot, origin, done-records and
   status rows are dropped (again at every start of sync-tables, for a run that
   died in between). ``syncdone`` becomes ``ready`` once the worker's origin is
   past X (before, a restart could still meet transactions X covers).

Which tables
------------
sync-tables copies the published and included tables (``--tables`` narrows
them) that the target lacks and applier has no record of, and those whose row
is not ``syncdone``/``ready`` (an unfinished run, or ``skipped``). A table the
target has and applier knows is left alone. A row of a table no longer
published or included is reported, its slot and origin dropped, and deleted.
Plain tables, and new partitions of a partitioned table the target has
(published with ``publish_via_partition_root = false``: the stream names the
partition; pg_dump's pre-data creates and attaches it). A partition whose root
the target lacks is refused with a hint to bootstrap.

The worker decides for a table the target lacks (:mod:`applier.apply.rules.tablesync`):
applier knows it (a ``ready`` row; a table of the bootstrap's records;
the tables the target had on the worker's first start after migration 0008,
recorded then as ``ready``) -> it stops as before (a table dropped by
mistake is not skipped: that would lose its changes); it does not -> its
changes are skipped with one warning, and a ``skipped`` row tells sync-tables.

Known limits
------------
* ``[apply] two_phase = true`` is refused: a transaction prepared before the
  handover and committed after it would be prepared by one side (with or
  without the table's changes) and committed by the other.
* Tables are synced one after the other (each with its own Spark job).
* The worker does not feed systemd's watchdog during its pause (at most 10 s).
* Not for new partitioned trees (refused), nor for a new partition of a
  table published with ``publish_via_partition_root = true`` (the stream names
  the root: the worker stops when the target lacks the partition, as before).
* The worker's pause at the handover is bounded (10 s, a quarter of
  ``[apply] timeout``); on a loaded source where sync-tables needs longer to
  cover W, it keeps asking, and sync-tables ends with exit 1 after
  ``--timeout`` (a rerun continues from the catch-up).
"""
