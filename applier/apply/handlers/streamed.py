"""Streamed transactions: Stream Start .. Stream Stop, then Stream Commit or Abort.

Spooled
=======

See :mod:`applier.apply.handlers.spool`: spooled per top-level xid (memory up to
``memory_limit``, then disk), subtransaction aborts truncate, Stream Commit
replays in one target transaction, Stream Abort discards. The stream hands
changes inside stream blocks over undecoded (``StreamedChange``): they are
spooled as the bytes received and decoded once, at replay.

Live apply (``streaming = "parallel"``, the default)
====================================================

Spooling first and applying at the commit serialises the work: the walsender
decodes and sends while the target idles, then the target applies while the
walsender idles. PostgreSQL 16+ hands a streamed transaction to a parallel
apply worker that applies it as it arrives. applier does the same on its one
apply session: the first segment of a streamed transaction, when nothing else
holds the session, opens a target transaction and every change of that
transaction is applied as it arrives (through the same handlers as any
change); its Stream Commit commits it with the origin stamped, exactly as a
replay would. One streamed transaction is live at a time; others interleaved
with it are spooled.

The session can hold one transaction only, and transactions must commit in
source commit order. So anything that needs the session before the live
transaction's commit *drops* it: a Begin (a plain transaction commits first),
another transaction's Stream Commit or Stream Prepare, Begin Prepare, Commit or
Rollback Prepared, its own Stream Prepare (two-phase goes the spooled way), a
subtransaction abort, a Relation message inside it that differs from the one
in hand (the transactions committing before it must not see its schema), its
Origin message with ``origin = "none"``, a captured DDL statement
(:mod:`applier.apply.handlers.ddl`), and a transaction skip rule read while it
is live. Dropping rolls the target
transaction back (and resets the origin's session values, as after any
rollback); the transaction is then replayed from its spool at its commit, as
with ``streaming = "on"``.

So a live transaction is also spooled, in memory, as insurance, and never to
disk: past ``memory_limit`` its spool is forgotten. Dropping a transaction
whose spool was forgotten restarts the session from the origin with that xid
barred from live apply (:class:`LiveRestream`): the walsender sends it again and
it is spooled the ordinary way. A huge transaction with nothing committing
while it streams is thus applied with bounded memory and no spool file.

Exactly-once is unchanged: nothing of a live transaction is committed before
its Stream Commit, whose commit carries the origin stamp of its end_lsn; a
crash, a stop or a dropped live transaction leaves nothing behind. Live apply
is not tried when the position in hand may be judged by a commit LSN it does
not know yet: one-by-one or careful replay after a failure, a transaction skip
rule, a table between sync-tables' handover and ready. An error while live
restarts the session with the xid barred (the error is then raised by the
spooled replay, with the transaction's own commit LSN). Changes applied live
carry the LSN of the message that brought them, not the commit LSN.

The stream hands consecutive streamed changes of one tag, xid, relation and
tuple kind over as one :class:`~applier.protocol.StreamedRun`: it is spooled in
one step and, live, offered to the lane in hand as a whole
(:mod:`applier.apply.batching.copylane`, :mod:`applier.apply.batching.mergelane`); what the lane
does not take goes through the handlers change by change, as ever.

:class:`StreamedTxns` is a part the :class:`~applier.apply.handlers.dispatch.Applier`
owns: it moves the Applier's transaction and its live one through
:class:`StreamedHost`, and drops a rolled-back transaction's conflicts through
:class:`~applier.apply.handlers.ports.Records`; it is the Replay service two-phase
uses.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from applier.apply.batching.copylane import CopyLane, open_lane
from applier.apply.batching.host import LaneHost
from applier.apply.batching.merge import UpdateMerger
from applier.apply.batching.mergelane import MergeLane, open_merge_lane
from applier.apply.core.states import IDLE, STREAM, TXN, Txn
from applier.apply.core.tally import Tally
from applier.apply.handlers.ports import Records, TxnFlow
from applier.apply.handlers.relations import same_relation
from applier.apply.handlers.spool import Spool
from applier.apply.rules.skiprules import SkipRules
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.target.origin import FLUSHED
from applier.ddl.message import PREFIX as DDL_PREFIX
from applier.ddl.message import decode as decode_ddl
from applier.errors import ApplyError, ProtocolError, SchemaMismatch
from applier.lsn import Lsn
from applier.protocol import (
    Delete,
    Insert,
    Message,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamedChange,
    StreamedRun,
    StreamStart,
    StreamStop,
    Update,
    decode_streamed,
)

log = logging.getLogger("applier.apply")


class LiveRestream(Exception):
    """A live transaction was dropped and its spool forgotten: restream it, spooled."""

    def __init__(self, xid: int, why: str) -> None:
        super().__init__(f"streamed transaction {xid}: {why}")
        self.xid = xid
        self.why = why


class Live:
    """The streamed transaction being applied as it arrives."""

    __slots__ = ("spool", "start", "txn", "xid")

    def __init__(self, xid: int, txn: Txn, spool: Spool, start: Lsn) -> None:
        self.xid = xid
        self.txn = txn
        self.spool = spool
        self.start = start


class StreamedHost(TxnFlow, LaneHost, Protocol):
    """What the streamed-transaction handlers read and move of the Applier."""

    #: The streamed transaction being applied as it arrives (the C dispatch loop reads it).
    live: Live | None

    @property
    def tally(self) -> Tally: ...
    @property
    def merger(self) -> UpdateMerger: ...
    @property
    def rules(self) -> SkipRules: ...
    @property
    def syncs(self) -> TableSyncs: ...
    @property
    def relations(self) -> dict[int, Any]: ...
    @property
    def no_group_until(self) -> Lsn: ...
    @property
    def careful_until(self) -> Lsn: ...


class StreamedTxns:
    """Stream Start .. Stream Stop, Stream Commit and Abort: spooled or applied live."""

    def __init__(
        self, host: StreamedHost, records: Records, live_apply: bool, no_live: set[int]
    ) -> None:
        self.host = host
        self.records = records
        #: The streamed transaction whose stream block is open (Stream Start .. Stop).
        self.spool: Spool | None = None
        #: ``streaming = "parallel"``: apply a streamed transaction as it arrives.
        self.live_apply = live_apply
        #: Xids never applied live (an error or a forgotten spool while live).
        self.no_live = no_live
        #: Where the next streamed change may skip the handlers
        #: (applier.apply.batching.copylane, applier.apply.batching.mergelane).
        self.lane: CopyLane | MergeLane | None = None
        #: An error came while a transaction was live (the worker restreams it spooled).
        self.live_failed: int | None = None
        self.live_txns = 0
        self.live_dropped = 0

    def on_streamed_change(self, lsn: Lsn, m: StreamedChange) -> None:
        sp = self.spool
        assert sp is not None
        if not sp.filtered:  # its Origin message said not to apply it (originfilter)
            self.host.spools.add(sp, m.data, subxact_of(m))
            live = self.host.live
            if live is not None and live.spool is sp:
                self._apply_live(lsn, live, m.data)

    def on_streamed_run(self, lsn: Lsn, m: StreamedRun) -> None:
        """As many StreamedChanges, the lane in hand taking what it can in one step."""
        sp = self.spool
        assert sp is not None
        if sp.filtered:
            return
        self.host.spools.add_many(sp, m.datas, m.xid)
        live = self.host.live
        if live is None or live.spool is not sp:
            return
        datas, lsns = m.datas, m.lsns
        i, n = 0, len(datas)
        while i < n and self.host.live is live:  # a change may drop the transaction
            lane = self.lane
            if lane is not None and lane.txn is live.txn:
                took = lane.offer_run(self.host, m, i)
                if took:
                    i += took
                    continue
            self._apply_live(Lsn(lsns[i]), live, datas[i])
            i += 1

    def _apply_live(self, lsn: Lsn, live: Live, data: bytes) -> None:
        lane = self.lane
        if lane is not None and lane.txn is live.txn and lane.offer(self.host, lsn, data):
            return
        self.lane = None
        if self.host.rules.has_txn:  # a transaction rule came in (SIGHUP): judged at commit
            self.drop_live("a transaction skip rule was added")
            return
        msg = decode_streamed(data)
        if type(msg) is Message and msg.prefix == DDL_PREFIX:
            self.drop_live("a captured DDL statement runs at the transaction's commit")
            return
        if type(msg) is Relation:
            known = self.host.relations.get(msg.oid)
            if known is not None and not same_relation(known, msg):
                self.drop_live("its Relation message differs from the one in hand")
                return
        self.host.txn = live.txn
        self.host.move(TXN)
        try:
            self.host.dispatch(lsn, msg)
            self.lane = _lane_after(self.host, msg, data, live.txn)
        except (ApplyError, SchemaMismatch):
            self.live_failed = live.xid
            raise
        finally:
            self.host.txn = None
            self.host.move(STREAM)

    def _may_go_live(self, lsn: Lsn, xid: int) -> bool:
        return (
            self.live_apply
            and self.host.live is None
            and xid not in self.no_live
            and lsn > self.host.no_group_until
            and lsn > self.host.careful_until
            and not self.host.rules.has_txn
            and not self.host.syncs.commit_dependent()
        )

    def _go_live(self, lsn: Lsn, xid: int, sp: Spool) -> None:
        self.host.commit_group()
        if self.host.session.in_txn:
            return
        self.host.start_txn(xid, lsn, False)
        assert self.host.txn is not None
        self.host.live = Live(xid, self.host.txn, sp, lsn)
        self.host.txn = None
        sp.live = True
        self.live_txns += 1
        log.debug("applying a streamed transaction as it arrives", extra={"ctx": {"xid": xid}})

    def _roll_back_live(self, live: Live) -> None:
        """End the live transaction and roll back everything of it in hand."""
        self.host.live = None
        live.spool.live = False
        self.records.discard()
        self.host.tally.discard()
        self.host.merger.discard()
        self.host.session.rollback()

    def drop_live(self, why: str) -> None:
        """Roll the live transaction back; it is replayed from its spool at its commit."""
        live = self.host.live
        if live is None:
            return
        self._roll_back_live(live)
        self.live_dropped += 1
        sp = live.spool
        log.info(
            "stopped applying a streamed transaction as it arrives: %s; it is applied "
            "at its commit",
            why,
            extra={"ctx": {"xid": live.xid, "spooled": not sp.incomplete}},
        )
        if sp.incomplete:
            raise LiveRestream(live.xid, why)

    def on_stream_start(self, lsn: Lsn, m: StreamStart) -> None:
        if not m.first_segment and self.host.spools.get(m.xid) is None:
            # Its first segments never reached us: a spool from here would replay
            # a partial transaction at its Stream Commit.
            raise ProtocolError(
                "a Stream Start continues a streamed transaction whose first segment was "
                "not received",
                lsn=str(Lsn(lsn)),
                xid=m.xid,
                hint="the stream is out of order; applier run restarts from the origin",
            )
        self.host.move(STREAM)
        sp = self.spool = self.host.spools.open(m.xid, m.first_segment)
        if m.first_segment and self._may_go_live(lsn, m.xid):
            self._go_live(lsn, m.xid, sp)

    def on_stream_stop(self, lsn: Lsn, m: StreamStop) -> None:
        sp, live = self.spool, self.host.live
        self.host.move(IDLE)
        self.spool = None
        if live is not None and live.spool is sp and sp is not None and sp.filtered:
            self.drop_live("its origin is not to be applied")

    def replay(self, xid: int, commit_lsn: Lsn, gid: str | None = None, ts: int = 0) -> None:
        """Apply a spooled transaction through the change handlers (state TXN)."""
        spool = self.host.spools.get(xid)
        self.host.move(TXN)
        self.host.start_txn(xid, commit_lsn, False, gid, ts)
        if spool is None:
            return
        txn = self.host.txn
        assert txn is not None
        lane = None
        for data in spool:
            if lane is not None and lane.offer(self.host, commit_lsn, data):
                continue
            msg = decode_streamed(data)
            self.host.dispatch(commit_lsn, msg)
            lane = _lane_after(self.host, msg, data, txn)

    def on_stream_commit(self, lsn: Lsn, m: StreamCommit) -> None:
        live = self.host.live
        if live is not None:
            if live.xid == m.xid:
                self._commit_live(live, m)
                return
            self.drop_live("another streamed transaction commits first")
        self.host.commit_group()
        sp = self.host.spools.get(m.xid)
        log.debug(
            "streamed transaction commits",
            extra={
                "ctx": {
                    "xid": m.xid,
                    "messages": sp.count if sp else 0,
                    "on_disk": bool(sp and sp.on_disk),
                    "end_lsn": m.end_lsn,
                }
            },
        )
        if m.end_lsn <= self.host.progress or (sp is not None and sp.filtered):
            self.host.spools.discard(m.xid)
            self.host.skipped_txns += 1
            self.host.flush.store(m.end_lsn, FLUSHED)
            return
        try:
            self.replay(m.xid, m.commit_lsn, None, m.commit_ts)
            self.host.move(IDLE)
            self.host.end_txn(m.end_lsn, m.commit_ts)
            log.debug(
                "streamed transaction replayed", extra={"ctx": {"lane_rows": self.host.lane_rows}}
            )
        finally:
            self.host.move(IDLE)
            self.host.spools.discard(m.xid)

    def _commit_live(self, live: Live, m: StreamCommit) -> None:
        self.host.live = None
        live.spool.live = False
        log.debug(
            "streamed transaction commits",
            extra={
                "ctx": {
                    "xid": m.xid,
                    "live": True,
                    "end_lsn": m.end_lsn,
                }
            },
        )
        try:
            if m.end_lsn <= self.host.progress or live.spool.filtered:
                self._roll_back_live(live)
                self.host.skipped_txns += 1
                self.host.flush.store(m.end_lsn, FLUSHED)
                return
            txn = live.txn
            txn.commit_lsn, txn.commit_ts = m.commit_lsn, m.commit_ts
            self.host.session.txn_context = {
                "lsn": m.commit_lsn,
                "xid": m.xid,
                "finish_lsn": m.commit_lsn,
            }
            self.host.txn = txn
            try:
                self.host.end_txn(m.end_lsn, m.commit_ts)
            except (ApplyError, SchemaMismatch):
                self.live_failed = live.xid
                raise
            log.debug(
                "streamed transaction applied", extra={"ctx": {"lane_rows": self.host.lane_rows}}
            )
        finally:
            self.host.move(IDLE)
            self.host.spools.discard(m.xid)

    def on_stream_abort(self, lsn: Lsn, m: StreamAbort) -> None:
        live = self.host.live
        if live is not None and live.xid == m.xid:
            if m.subxid == m.xid:
                self._roll_back_live(live)
            else:
                self.drop_live("a subtransaction of it aborted")
        self.host.spools.abort(m.xid, m.subxid)


def subxact_of(m: StreamedChange) -> int:
    """The (sub)transaction a streamed change belongs to, for its spool: the xid it
    came with, but a captured DDL statement's is in its content (pgoutput sends a
    message with the top-level xid; applier.ddl.capture, "Its subtransaction")."""
    if m.data[:1] != b"M":
        return m.xid
    msg = decode_streamed(m.data)
    if type(msg) is not Message or msg.prefix != DDL_PREFIX or not msg.transactional:
        return m.xid
    try:
        sub = decode_ddl(msg.content).subxact
    except ProtocolError:
        return m.xid  # unreadable: the replay stops on it, with its skip command
    return sub if sub is not None else m.xid


def _lane_after(applier: LaneHost, msg: Any, data: bytes, txn: Txn) -> CopyLane | MergeLane | None:
    """The lane the next change may take after the ordinary path applied ``msg`` (``data``)."""
    kind = type(msg)
    if kind is Insert:
        return open_lane(applier, msg.relation_oid, data, txn)
    if kind is Update or kind is Delete:
        return open_merge_lane(applier, msg, data, txn)
    return None
