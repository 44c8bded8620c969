"""Which path a change may take: one decision per table mapping and transaction.

Why
===

A row change reaches the target by one of several paths: row by row through
the handlers (:mod:`applier.apply.handlers.changes`), held in a run of INSERTs sent as
one multi-row INSERT or a COPY (:mod:`applier.apply.target.insertruns`), held per key
and sent as one merged UPDATE or DELETE (:mod:`applier.apply.batching.merge`), held as a
FULL identity batch (:mod:`applier.apply.batching.fullident`), or straight from its
pgoutput bytes past the handlers by a lane (:mod:`applier.apply.batching.copylane`,
:mod:`applier.apply.batching.insertlane`, :mod:`applier.apply.batching.mergelane`). Each lane
used to re-list when a row may leave the handlers; a new rule needed an edit
in every one, and a lane that missed it applied rows past the rule. So the
rules live here, in :func:`decide`, and every path asks its answer: a
:class:`Paths` value, read as one attribute.

Inputs
======

* the mapping (:class:`~applier.apply.sql.mapping.RelMap`): whether the table is
  included, its conflict policy, whether its UPDATEs merge per key and its
  FULL identity changes batch (both already weigh the target's triggers and
  rules, :func:`~applier.apply.sql.mapping.full_batchable`);
* the transaction: a careful replay (a savepoint per change,
  :mod:`applier.apply.rules.resolve`), one-by-one replay (no merging, no multi-row
  statements), a transaction skip, a transaction skip rule, every change
  kept for a rule's dump;
* object skip rules loaded (:mod:`applier.apply.rules.skiprules`): any makes every
  change pass the handlers, which look the table's rules up;
* the table being synced (:mod:`applier.apply.rules.tablesync`): a cut makes every
  change of the table pass the handlers, which compare it with the commit;
* :data:`ROW_BY_ROW`: further rules that send a table's changes row by row,
  and past none of the fast paths (empty in the applier; tests add one).

``--until-lsn`` (:mod:`applier.apply.handlers.until`) is no input: it admits or stops
whole transactions at their Begin and Commit, never one change of them.

What is not decided here is what is in hand, which changes from one row to
the next: whether the session's run or the merger's held rows take the row
(the same statement, the same kind, an old key, an unchanged TOAST value, the
width), held rows of another table that must go first, the target transaction
being open. The lanes check those as mechanics of joining, not as rules.

When it is recomputed
=====================

The applier keeps one :class:`Paths` per mapping version in ``applier.paths``
(:func:`paths_of` fills it on a miss). The whole dict is emptied exactly when
an input other than the mapping changes (:func:`refresh`): a transaction
starts whose careful, one-by-one, skip, rule or dump inputs differ from the
last one's, an Origin message makes it skipped, the skip rules or the sync
cuts were reloaded (their ``generation``). A mapping's entry goes with the
mapping (a Relation message replanning the table, an eviction). So the
decision runs once per mapping and generation, and, with nothing changing,
not once per transaction.

The C side (``applier/speedups``: mergelane.c, dispatch.c, takeloop.c) reads
none of these inputs: it is handed the dispatch state (a callable), the stop
flag and the decoder's handlers, and holds the rows it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from applier.apply.batching.host import PathsHost
    from applier.apply.core.states import Txn
    from applier.apply.sql.mapping import RelMap


@dataclass(frozen=True, slots=True)
class Paths:
    """The paths a change of one mapping may take in the transaction in hand."""

    #: INSERTs may be held in a run, sent as a multi-row INSERT or a COPY (else one
    #: statement each).
    runs: bool
    #: INSERTs may join the COPY in hand from their bytes (the copy lane).
    copy_lane: bool
    #: ... and the run in hand, held or copying (the insert lane).
    insert_lane: bool
    #: UPDATEs and DELETEs that keep the key may be held per key and merged.
    merged: bool
    #: REPLICA IDENTITY FULL changes may be held and sent as one batch.
    full: bool
    #: UPDATEs and DELETEs may join the merged rows from their bytes or decoded
    #: message past the handlers (the merge lane, ``hold_update``).
    merge_lane: bool


#: Every path but row by row.
ROW_BY_ROW_ONLY = Paths(False, False, False, False, False, False)

#: Rules beyond the applier's own that send a mapping's changes row by row in a
#: transaction, past none of the fast paths: ``rule(applier, rm, txn)``. A rule reads
#: only the mapping and the inputs :func:`refresh` watches (its answer is kept until
#: one of them changes).
ROW_BY_ROW: list[Callable[[PathsHost, RelMap, Txn], bool]] = []


def decide(applier: PathsHost, rm: RelMap, txn: Txn) -> Paths:
    """The paths of ``rm``'s changes in ``txn``, from every input (the module's doc)."""
    if applier.careful or any(rule(applier, rm, txn) for rule in ROW_BY_ROW):
        return ROW_BY_ROW_ONLY
    merged = applier.merging and rm.merge
    full = applier.merging and rm.full_batch
    # The lanes skip the handlers' _target: only where it would decide nothing.
    handlers = (
        not rm.included
        or txn.skip
        or txn.rule is not None
        or txn.seen is not None
        or applier.rules.has_object
        or rm.relation.oid in applier.syncs.cut
    )
    copy_lane = not handlers and not (rm.policy is not None and rm.policy.checked_insert)
    return Paths(
        runs=True,
        copy_lane=copy_lane,
        insert_lane=copy_lane and applier.session.multi_row,
        merged=merged,
        full=full,
        merge_lane=merged and not handlers and rm.policy is None,
    )


def paths_of(applier: PathsHost, rm: RelMap, txn: Txn) -> Paths:
    """``rm``'s paths in ``txn`` (the transaction in hand): cached per mapping version."""
    p: Paths | None = applier.paths.get(rm.version)
    if p is None:
        p = applier.paths[rm.version] = decide(applier, rm, txn)
    return p


def refresh(applier: PathsHost, txn: Txn | None = None) -> None:
    """Forget every mapping's paths if an input changed since they were decided:
    ``txn``, the transaction that starts (or was just marked skipped), or None
    (between batches: only the skip rules and sync cuts may have been reloaded)."""
    old = applier.paths_stamp
    of_txn = (
        old[0]
        if txn is None
        else (
            applier.careful,
            applier.merging,
            applier.session.multi_row,
            txn.skip,
            txn.rule is not None,
            txn.seen is not None,
        )
    )
    now = (of_txn, applier.rules.generation, applier.syncs.generation)
    if now != old:
        applier.paths_stamp = now
        applier.paths.clear()
