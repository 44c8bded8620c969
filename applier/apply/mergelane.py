"""The merge lane: a streamed UPDATE or DELETE straight from its bytes into the merger.

A big streamed UPDATE or DELETE is a long run of row messages of one table,
and each row's way through the handlers (decode into an Update or Delete,
:meth:`~applier.apply.changes.Changes._target`, ``on_update``, the merger's
``add``) costs more Python than the rest of its trip. Once the ordinary path
has held a row of a table in :class:`~applier.apply.merge.UpdateMerger`, the
following changes of the same kind and table can be held the same way from
their pgoutput bytes: the TupleData is read once (:func:`read_tuple`, C when
built) and held by the merger's own ``hold_row``, which ``add``/``add_delete``
call too.

As with the copy lane (:mod:`applier.apply.copylane`), the lane decides
nothing the handlers did not: it opens only where the ordinary path just held
a change (a merged table without a conflict policy, no skip rule, no kept
changes, no careful replay), and sends back to the ordinary path, which then
decides or names the problem, every row that differs: another table, kind
or (sub)transaction xid, an UPDATE that carries an old key, an unchanged TOAST key, a width that is
not the mapping's, a key already held for DELETE, a malformed tuple, and
anything the checks repeated per row see (the mapping replaced, an object
skip rule, a table being synced, merging switched off). The row's context
(:class:`LaneCtx`) decodes the message only if something asks for it (a
missing row's record, an error). A run of them read as one
:class:`~applier.protocol.StreamedRun` is checked once and held row by row in
one loop (:meth:`MergeLane.offer_run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.lsn import Lsn
from applier.protocol import Delete, Update, decode_streamed, read_tuple

from .merge import MAX_HELD, HeldDeletes, HeldUpdates
from .states import ChangeCtx

if TYPE_CHECKING:
    from applier.protocol import StreamedRun

    from .mapping import RelMap
    from .states import Txn

#: The slot of ChangeCtx.change, which LaneCtx fills on first use.
_CHANGE: Any = ChangeCtx.__dict__["change"]


class LaneCtx(ChangeCtx):
    """A :class:`ChangeCtx` whose change is decoded from its bytes when first asked for."""

    __slots__ = ("data",)
    #: How its bytes decode (a streamed change's; applier.apply.insertlane: an Insert's).
    decode: Any = staticmethod(decode_streamed)

    def __init__(self, lsn: Lsn, txn: Txn, rm: RelMap, data: Any) -> None:
        # ChangeCtx.__init__'s assignments but the change's: one call less per row.
        self.lsn = lsn
        self.txn = txn
        self.xid = txn.xid
        self.no = txn.n
        self.rm = rm
        self.data = data
        self.check = None
        self.key = None

    @property
    def change(self) -> Any:
        try:
            return _CHANGE.__get__(self, ChangeCtx)
        except AttributeError:
            change = self.decode(self.data)
            _CHANGE.__set__(self, change)
            return change

    @change.setter
    def change(self, value: Any) -> None:
        _CHANGE.__set__(self, value)


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

    def _fits(self, applier: Any, data: bytes) -> bool:
        """``data`` is a row of the lane, and the checks the handlers would make pass."""
        return (
            data.startswith(self.head)
            and applier.merging
            and applier.relmaps.get(self.oid) is self.rm
            and not applier.rules.has_object
            and self.oid not in applier.syncs.cut
            and applier.session.in_txn
        )

    def offer(self, applier: Any, lsn: Lsn, data: bytes) -> bool:
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
            applier._send_held(oid)
        return True

    def offer_run(self, applier: Any, run: StreamedRun, i: int) -> int:
        """Hold ``run``'s changes from ``i`` on, as :meth:`offer` each; return how many
        (0: ``run.datas[i]`` takes the ordinary path).

        One head check and one pass of :meth:`offer`'s other checks hold for the
        run's changes up to the next send of held rows, after which this returns
        (the caller offers the rest again).
        """
        datas = run.datas
        if not self._fits(applier, datas[i]):
            return 0
        oid, rm = self.oid, self.rm
        txn, kind, lsns = self.txn, self.kind, run.lsns
        hold, width = applier.merger.hold_row, len(rm.columns)
        took = 0
        held = 0
        for j in range(i, len(datas)):
            data = datas[j]
            got = read_tuple(data, 10)
            if got is None:
                break
            kinds, values, end = got
            if end != len(data) or len(kinds) != width:
                break
            txn.n += 1
            held = hold(rm, kind, values, kinds, LaneCtx(Lsn(lsns[j]), txn, rm, data), len(data))
            if held <= 0:
                txn.n -= 1  # the ordinary path decides (see offer)
                break
            took += 1
            if held >= MAX_HELD:
                break
        if took:
            applier.tally.sent(self.key, took)
            applier.lane_rows += took
            if held >= MAX_HELD:
                applier._send_held(oid)
        return took


def open_merge_lane(applier: Any, msg: Update | Delete, data: bytes, txn: Txn) -> MergeLane | None:
    """After the ordinary path took ``msg`` (``data``): the lane, if it held it in the merger."""
    if type(msg) is Update and msg.old is not None:
        return None
    oid = msg.relation_oid
    rm = applier.relmaps.get(oid)
    delete = type(msg) is Delete
    entry = applier.merger.tables.get(oid)
    if (
        rm is None
        or entry is None
        or entry.rm is not rm
        or type(entry) is not (HeldDeletes if delete else HeldUpdates)
        or not rm.merge
        or not rm.included
        or rm.policy is not None
        or applier.careful
        or not applier.merging
        or txn.skip
        or txn.rule is not None
        or txn.seen is not None
    ):
        return None
    return MergeLane(rm, data[:10], txn, delete)
