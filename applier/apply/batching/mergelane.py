"""The merge lane: a streamed UPDATE or DELETE straight from its bytes into the merger.

A big streamed UPDATE or DELETE is a long run of row messages of one table,
and each row's way through the handlers (decode into an Update or Delete,
:meth:`~applier.apply.handlers.changes.RowChanges._target`, ``on_update``, the merger's
``add``) costs more Python than the rest of its trip. Once the ordinary path
has held a row of a table in :class:`~applier.apply.batching.merge.UpdateMerger`, the
following changes of the same kind and table can be held the same way from
their pgoutput bytes: the TupleData is read once (:func:`read_tuple`, C when
built) and held by the merger's own ``hold_row``, which ``add``/``add_delete``
call too.

As with the copy lane (:mod:`applier.apply.batching.copylane`), the lane decides
nothing the handlers did not: it opens only where the ordinary path just held
a change and :mod:`applier.apply.batching.paths` lets the table's changes past the
handlers (``merge_lane``), and sends back to the ordinary path, which then
decides or names the problem, every row that differs: another table, kind
or (sub)transaction xid, an UPDATE that carries an old key, an unchanged TOAST key, a width that is
not the mapping's, a key already held for DELETE, a malformed tuple, and
anything the checks repeated per row see (the mapping replaced, the decision
asked again: skip rules and sync cuts may change between batches). The row's context
(:class:`LaneCtx`) decodes the message only if something asks for it (a
missing row's record, an error). A run of them read as one
:class:`~applier.protocol.StreamedRun` is checked once and held row by row in
one loop (:meth:`MergeLane.offer_run`).

Outside stream blocks, where a table's changes rarely come in runs (pgbench
updates each of three tables once a transaction), :func:`hold_update` takes a
decoded UPDATE into the merger in one step, on the same terms, once the
ordinary path has held one of its table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.apply.batching.merge import _U, HeldDeletes, HeldUpdates
from applier.apply.batching.paths import paths_of
from applier.apply.core.states import LaneCtx
from applier.apply.sql.planner import MAX_HELD_BYTES
from applier.apply.sql.stmt import MAX_HELD
from applier.lsn import Lsn
from applier.protocol import Delete, Update, read_tuple
from applier.speedups import hold_rows

if TYPE_CHECKING:
    from applier.apply.batching.fullident import FullHold
    from applier.apply.batching.host import LaneHost
    from applier.apply.core.states import Txn
    from applier.apply.sql.mapping import RelMap
    from applier.protocol import StreamedRun


class MergeLane:
    """The table whose UPDATEs (or DELETEs) may skip the handlers into the merger."""

    __slots__ = ("head", "key", "kind", "oid", "rm", "txn")

    def __init__(self, rm: RelMap, head: bytes, txn: Txn, delete: bool) -> None:
        self.rm = rm
        self.txn = txn
        self.oid = rm.relation.oid
        #: ``'U' xid relid 'N'`` or ``'D' xid relid 'K'|'O'``: what every row of the lane
        #: starts with (a change of a subtransaction, with another xid, an UPDATE with
        #: an old key, take the ordinary path).
        self.head = head
        self.kind: type[HeldUpdates | HeldDeletes] = HeldDeletes if delete else HeldUpdates
        self.key = (self.oid, "delete" if delete else "update")

    def _fits(self, applier: LaneHost, data: bytes) -> bool:
        """``data`` is a row of the lane, and its changes may pass the handlers."""
        rm = self.rm
        return (
            data.startswith(self.head)
            and applier.relmaps.get(self.oid) is rm
            and (applier.paths.get(rm.version) or paths_of(applier, rm, self.txn)).merge_lane
            and applier.session.in_txn
        )

    def offer(self, applier: LaneHost, lsn: Lsn, data: bytes) -> bool:
        """Hold the streamed change ``data``; False: it takes the ordinary path.

        ``data`` is a StreamedChange's bytes: :attr:`head`, then a TupleData.
        """
        if not self._fits(applier, data):
            return False
        oid, rm = self.oid, self.rm
        got = read_tuple(data, 10)
        if got is None:
            return False
        kinds, values, end = got
        if end != len(data) or len(kinds) != len(rm.columns):
            return False
        txn = self.txn
        txn.n += 1
        held = applier.merger.hold_row(
            rm, self.kind, values, kinds, LaneCtx(lsn, txn, rm, data), len(data)
        )
        if held <= 0:
            # Not held (an unchanged TOAST key, another kind held, a DELETE of a key
            # held already): the ordinary path decides, and sends first if need be.
            txn.n -= 1
            return False
        counts = applier.tally.changes
        counts[self.key] = counts.get(self.key, 0) + 1
        applier.lane_rows += 1
        if held >= MAX_HELD:
            applier.send_held(oid)
        return True

    def offer_run(self, applier: LaneHost, run: StreamedRun, i: int) -> int:
        """Hold ``run``'s changes from ``i`` on, as :meth:`offer` each; return how many
        (0: ``run.datas[i]`` takes the ordinary path).

        One head check and one pass of :meth:`offer`'s other checks hold for the
        run's changes up to the next send of held rows, after which this returns
        (the caller offers the rest again). The plain rows are held by
        :func:`hold_rows` (C when built) with a :data:`~applier.apply.core.states.LaneRef`
        for a context; the first it leaves (an unchanged TOAST value, a DELETE of a
        key held already, a row that does not fit) goes through :meth:`offer`, which
        holds it as the handlers would or hands it to them.
        """
        datas, lsns = run.datas, run.lsns
        if not self._fits(applier, datas[i]):
            return 0
        oid, rm, txn, kind = self.oid, self.rm, self.txn, self.kind
        tables = applier.merger.tables
        width, n = len(rm.columns), len(datas)
        took = fast = 0
        full = False
        while i + took < n:
            entry = tables.get(oid)
            if entry is None:
                entry = tables[oid] = kind(rm)
            elif type(entry) is not kind or entry.rm is not rm:
                break  # another kind held: the ordinary path sends it first
            j = i + took
            if isinstance(entry, HeldUpdates):
                got, entry.size = hold_rows(
                    datas, lsns, j, width, rm.key, entry.rows, None, txn, txn.n + 1,
                    entry.size, MAX_HELD, MAX_HELD_BYTES,
                )  # fmt: skip
                full = entry.size >= MAX_HELD_BYTES
            else:
                assert isinstance(entry, HeldDeletes)
                got, _ = hold_rows(
                    datas, lsns, j, width, rm.key, entry.rows, entry.keys, txn, txn.n + 1,
                    0, MAX_HELD, MAX_HELD_BYTES,
                )  # fmt: skip
            txn.n += got
            took += got
            fast += got
            if full or len(entry.rows) >= MAX_HELD:
                full = True
                break
            j += got
            if j == n:
                break
            # The row hold_rows left: as a single change (held, maybe sending, or not).
            if not self.offer(applier, Lsn(lsns[j]), datas[j]):
                break
            took += 1
            if oid not in tables:  # offer sent the held rows: the caller offers again
                break
        if fast:
            applier.tally.sent(self.key, fast)
            applier.lane_rows += fast
        if full:
            applier.send_held(oid)
        return took


#: What :func:`hold_update` returns: not held (the ordinary path takes the change),
#: held, or held and the table's rows are to be sent now.
NOT_HELD, HELD, SEND = 0, 1, 2


def hold_update(applier: LaneHost, lsn: Lsn, m: Update) -> int:
    """Hold the UPDATE ``m`` in the merger as ``on_update`` would, when its table
    already holds merged UPDATEs of the same mapping: :data:`HELD` (or :data:`SEND`
    when the table reached MAX_HELD keys or MAX_HELD_BYTES), else :data:`NOT_HELD`
    with nothing changed.

    The decoded-message twin of :meth:`MergeLane.offer` for changes outside stream
    blocks (pgbench's UPDATEs, one per table and transaction): it makes the checks
    of ``_target`` and ``on_update`` that can decide against holding, and leaves
    every change they would treat otherwise to them (an old key, an unchanged
    TOAST value, a width that is not the mapping's, and every change
    :mod:`applier.apply.batching.paths` keeps from the lanes). The row's
    context is a :data:`~applier.apply.core.states.LaneRef` holding the message.

    1.85 -> 1.2 us an UPDATE. A C twin was measured at 0.95 us and not kept: 3.11's
    specialised attribute loads are about as fast as the C API's generic ones.
    """
    txn = applier.txn
    if txn is None or m.old is not None:
        return NOT_HELD
    oid = m.relation_oid
    rm = applier.relmaps.get(oid)
    entry = applier.merger.tables.get(oid)
    if not _joins_held(applier, txn, rm, entry, HeldUpdates) or not applier.session.in_txn:
        return NOT_HELD
    if TYPE_CHECKING:  # what _joins_held checked (no isinstance on this path at run time)
        assert isinstance(entry, HeldUpdates) and rm is not None
    kinds, values = m.new.kinds, m.new.values
    if len(kinds) != len(rm.columns) or _U in kinds:
        return NOT_HELD
    key = rm.key
    k = values[key[0]] if len(key) == 1 else tuple([values[c] for c in key])
    txn.n = no = txn.n + 1
    rows = entry.rows
    rows[k] = (values, kinds, (lsn, m, no, txn))
    entry.size += sum(map(len, filter(None, values)))
    counts, ck = applier.tally.changes, (oid, "update")
    counts[ck] = counts.get(ck, 0) + 1
    return SEND if len(rows) >= MAX_HELD or entry.size >= MAX_HELD_BYTES else HELD


def open_merge_lane(
    applier: LaneHost, msg: Update | Delete, data: bytes, txn: Txn
) -> MergeLane | None:
    """After the ordinary path took ``msg`` (``data``): the lane, if it held it in the merger."""
    if type(msg) is Update and msg.old is not None:
        return None
    oid = msg.relation_oid
    rm = applier.relmaps.get(oid)
    delete = type(msg) is Delete
    entry = applier.merger.tables.get(oid)
    if not _joins_held(applier, txn, rm, entry, HeldDeletes if delete else HeldUpdates):
        return None
    assert rm is not None
    return MergeLane(rm, data[:10], txn, delete)


def _joins_held(
    applier: LaneHost,
    txn: Txn,
    rm: RelMap | None,
    entry: HeldUpdates | HeldDeletes | FullHold | None,
    kind: type,
) -> bool:
    """A change of ``rm`` in ``txn`` may join the changes of ``kind`` that its table
    holds (``entry``) as the handlers would hold it: the terms :func:`hold_update` and
    a merge lane take changes on (the same mapping and kind held, and the lanes'
    decision, :attr:`~applier.apply.batching.paths.Paths.merge_lane`)."""
    return (
        rm is not None
        and entry is not None
        and entry.rm is rm
        and type(entry) is kind
        and (applier.paths.get(rm.version) or paths_of(applier, rm, txn)).merge_lane
    )
