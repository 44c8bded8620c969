"""The copy lane: a streamed INSERT straight from its bytes into the COPY in hand.

A big streamed transaction is mostly long runs of INSERTs into one table, and
each row's way through the handlers (decode into an Insert, the checks of
:meth:`~applier.apply.handlers.changes.RowChanges._target`, the planner, the session's run)
costs several microseconds of Python. Once the ordinary path has put a row of
a table into a COPY in text format (:mod:`applier.apply.sql.copyrun`), every
following INSERT of that table can go the same way from its pgoutput bytes:
the tuple's text values, escaped for COPY, are the row's line
(``tuple_text_line`` of :mod:`applier.speedups`).

The lane is opened only after a row took the ordinary path to the same place,
so it never decides anything the handlers did not: the same table and
mapping, where :mod:`applier.apply.batching.paths` lets its INSERTs past the handlers
(``copy_lane``), no held merged rows, all values text, and one value per
column. It is closed by anything else: any message that takes the ordinary
path, a row that does not fit (a binary or missing value, another table or
subtransaction), and the decision asked again per row (skip rules and sync
cuts may change between batches). What the row counts (the
transaction's change number, the tally) and what an error in the COPY names
(the row's LSN and xid) are the same as on the ordinary path.

The stream hands a run of such INSERTs over as one
:class:`~applier.protocol.StreamedRun` (same tag, xid, relation and tuple
kind): :meth:`CopyLane.offer_run` checks the run once and makes its lines in
one C call (``tuple_text_lines``), so a row costs no Python at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.apply.batching.paths import paths_of
from applier.apply.sql.copyrun import CHUNK, TEXT, Run
from applier.lsn import Lsn
from applier.speedups import tuple_text_line, tuple_text_lines

if TYPE_CHECKING:
    from applier.apply.batching.host import LaneHost
    from applier.apply.core.states import Txn
    from applier.apply.sql.mapping import RelMap
    from applier.protocol import InsertRun, StreamedRun


class CopyLane:
    """The table whose INSERTs may skip the handlers, and the COPY they join."""

    __slots__ = ("head", "key", "oid", "rm", "run", "txn", "width")

    def __init__(self, rm: RelMap, head: bytes, run: Run, txn: Txn) -> None:
        self.rm = rm
        self.oid = oid = rm.relation.oid
        #: ``'I' xid relid 'N'``: what every row of the lane starts with (a change of a
        #: subtransaction, with another xid, takes the ordinary path).
        self.head = head
        self.run = run
        self.txn = txn
        self.width = len(rm.columns)
        self.key = (oid, "insert")

    def _fits(self, applier: LaneHost, data: bytes) -> bool:
        """``data`` is a row of the lane, and its INSERTs may pass the handlers."""
        rm = self.rm
        return (
            data.startswith(self.head)
            and applier.session.copy_in_hand() is self.run
            and not applier.merger.tables
            and (applier.paths.get(rm.version) or paths_of(applier, rm, self.txn)).copy_lane
        )

    def offer(self, applier: LaneHost, lsn: Lsn, data: bytes) -> bool:
        """Apply the streamed change ``data`` through the lane; False: take the ordinary path.

        ``data`` is a StreamedChange's bytes: ``'I' xid relid 'N' TupleData``.
        """
        if not self._fits(applier, data):
            return False
        session = applier.session
        line, width = tuple_text_line(data, 10)
        if line is None or width != self.width:
            return False  # the ordinary path decodes it (and names what is wrong)
        txn = self.txn
        txn.n += 1
        counts = applier.tally.changes
        counts[self.key] = counts.get(self.key, 0) + 1
        session.copy_line(self.run, line, lsn, txn.xid)
        applier.lane_rows += 1
        return True

    def offer_run(self, applier: LaneHost, run: StreamedRun, i: int) -> int:
        """Apply ``run``'s changes from ``i`` on through the lane, as :meth:`offer` each;
        return how many (0: ``run.datas[i]`` takes the ordinary path).

        A run's changes start with the same bytes, so one head check holds for all,
        and nothing runs between them that could change what :meth:`offer` checks.
        The lines of at most CHUNK bytes are made at a time.
        """
        if not self._fits(applier, run.datas[i]):
            return 0
        return copy_rows(applier, self.run, self.txn, self.key, run, i, 10, self.width)


def copy_rows(
    applier: LaneHost,
    run: Run,
    txn: Txn,
    key: tuple[int, str],
    rows: StreamedRun | InsertRun,
    i: int,
    pos: int,
    width: int,
) -> int:
    """The COPY lines of ``rows.datas[i]``, ... (TupleData at ``pos``, ``width`` values)
    into ``run``, up to the first that makes no line; return how many (counted as
    the handlers count them). ``rows``: a StreamedRun or an InsertRun."""
    lines, n = tuple_text_lines(rows.datas, i, pos, width, CHUNK)
    if n:
        txn.n += n
        applier.tally.sent(key, n)
        applier.session.copy_lines(run, lines, rows.lsns[i : i + n], txn.xid)
        applier.lane_rows += n
    return n


def open_lane(applier: LaneHost, oid: int, data: bytes, txn: Txn) -> CopyLane | None:
    """After the ordinary path applied ``data``, an INSERT of ``oid``: the lane, if it fits."""
    session = applier.session
    run = session.copy_in_hand()
    if run is None or not run.stmt.all_new or run.fmt != TEXT:
        return None
    rm = applier.relmaps.get(oid)
    if rm is None or not paths_of(applier, rm, txn).copy_lane:
        return None
    return CopyLane(rm, data[:10], run, txn)
