"""The insert lane: a run of plain INSERTs straight from their bytes into the run in hand.

A transaction that is not streamed reaches the worker message by message, and a
bulk INSERT's rows each took the handlers' whole way: decoded into an Insert,
:meth:`~applier.apply.handlers.changes.Changes._target`, ``on_insert``, the planner and
the session's run (about 6 µs of Python per row). The stream hands consecutive
Inserts into one relation over as one :class:`~applier.protocol.InsertRun`
(``group_streamed``). Its first row takes the ordinary path; the following rows
may then join the run the session holds (:mod:`applier.apply.target.insertruns`) from
their bytes: each TupleData read once (C when built), its values the
statement's parameters while the run holds rows back for its COPY-or-INSERTs
decision (``copy_threshold``, ``MAX_HELD_BYTES``, checked as the session does),
or its COPY text lines, made in one call, once the run copies. A held row's
bytes are dropped once read (its context keeps the values it decodes from), so
memory holds each row once, as on the ordinary path.

As with the streamed lanes (:mod:`applier.apply.batching.copylane`), the lane decides
nothing the handlers did not: a row joins only the run the ordinary path would
have put it in (the statement of all the mapping's columns, text format), only
where :mod:`applier.apply.batching.paths` lets the table's INSERTs past the handlers
(``insert_lane``: the caller asks once per run) and no merged rows are held,
and only with one text or NULL value per column. The first row
that does not fit takes the ordinary path, which decides or names the problem;
the lane is tried again after it. What a row counts (the transaction's change
number, the tally) and what an error names (its LSN and xid; its change,
decoded when asked for) are the ordinary path's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.apply.batching.copylane import copy_rows
from applier.apply.core.states import LaneCtx
from applier.apply.sql.copyrun import TEXT, Run
from applier.apply.sql.planner import MAX_HELD_BYTES
from applier.lsn import Lsn
from applier.protocol import Insert, TupleData, read_tuple

if TYPE_CHECKING:
    from applier.apply.core.states import Txn
    from applier.apply.sql.mapping import RelMap
    from applier.protocol import InsertRun

#: Where an Insert's TupleData starts: after ``'I'``, the relation and ``'N'``.
TUPLE_AT = 6


def _insert_of(row: tuple[int, bytes, tuple[bytes | None, ...]]) -> Insert:
    oid, kinds, values = row
    return Insert(None, oid, TupleData(kinds, values))


class InsertCtx(LaneCtx):
    """The context of a row the lane held: its Insert made when asked for, from the
    values it holds (``data`` is ``(relation oid, kinds, values)``)."""

    __slots__ = ()
    decode: Any = staticmethod(_insert_of)


def offer_insert_run(applier: Any, m: InsertRun, i: int) -> int:
    """Put ``m``'s rows from ``i`` on into the session's run; return how many
    (0: ``m.datas[i]`` takes the ordinary path). The caller asked once for the
    run whether its INSERTs may take the lane (``Paths.insert_lane``):
    nothing between its rows changes that."""
    session = applier.session
    run = session.run_in_hand()
    oid = m.first.relation_oid
    rm = applier.relmaps.get(oid)
    txn = applier.txn
    if (
        run is None
        or rm is None
        or txn is None
        or run.fmt != TEXT
        or run.stmt is not applier.planner.all_columns_insert(rm)
        or not run.stmt.all_new
        or not session.in_txn
        or applier.merger.tables
    ):
        return 0
    key = (oid, "insert")
    if run.copying:
        return copy_rows(applier, run, txn, key, m, i, TUPLE_AT, len(rm.columns))
    n = _hold(session, run, rm, txn, m, i)
    if n:
        applier.tally.sent(key, n)
        applier.lane_rows += n
    return n


def _hold(session: Any, run: Run, rm: RelMap, txn: Txn, m: InsertRun, i: int) -> int:
    """Hold rows back in ``run`` as the session's ``insert`` does, up to its threshold."""
    pending = run.pending
    threshold = session.copy_threshold
    datas, lsns = m.datas, m.lsns
    width, oid = len(rm.columns), rm.relation.oid
    run.weigh()  # the rows before these; these are weighed by their message's length
    took = size = 0
    for j in range(i, min(len(datas), i + max(threshold - len(pending), 0))):
        data = datas[j]
        got = read_tuple(data, TUPLE_AT)
        if got is None:
            break
        kinds, values, end = got
        if end != len(data) or len(kinds) != width or b"b" in kinds or b"u" in kinds:
            break
        txn.n += 1
        ctx = InsertCtx(Lsn(lsns[j]), txn, rm, (oid, kinds, values))
        pending.append((list(values), None, ctx))
        datas[j] = b""  # read: the values are held once
        took += 1
        size += end
    run.held += size
    run.weighed = len(pending)
    # As InsertRuns.insert after each row: past the threshold or the bytes, the run
    # becomes a COPY (checked once per run of rows: at most one read of the stream,
    # client.MAX_BATCH_BYTES, past the bound).
    if took and (len(pending) >= threshold or run.held >= MAX_HELD_BYTES):
        session.runs.copy_begin(run)
    return took
