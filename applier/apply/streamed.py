"""Streamed transactions: Stream Start .. Stream Stop, then Stream Commit or Abort.

See :mod:`applier.apply.spool`: spooled per top-level xid (memory up to
``memory_limit``, then disk), subtransaction aborts truncate, Stream Commit
replays in one target transaction, Stream Abort discards. The stream hands
changes inside stream blocks over undecoded (``StreamedChange``): they are
spooled as the bytes received and decoded once, at replay. Streams are
applied serially also with ``streaming = parallel`` (then the Stream Abort
carries its LSN, which we do not need).

The message handlers of :class:`~applier.apply.handlers.Applier` for them.
"""

from __future__ import annotations

import logging
from typing import Any

from applier.errors import ProtocolError
from applier.lsn import Lsn
from applier.protocol import (
    StreamAbort,
    StreamCommit,
    StreamedChange,
    StreamStart,
    StreamStop,
    decode_streamed,
)

from .origin import FLUSHED, FlushTracker
from .spool import Spool, SpoolSet
from .states import IDLE, STREAM, TXN, State

log = logging.getLogger("applier.apply")


class Streamed:
    """Mixin of :class:`Applier`: the streamed-transaction handlers."""

    spools: SpoolSet
    spool: Spool | None
    state: State
    progress: Lsn
    skipped_txns: int
    flush: FlushTracker

    def commit_group(self) -> None:
        raise NotImplementedError

    def dispatch(self, lsn: Lsn, msg: Any) -> None:
        raise NotImplementedError

    def _start_txn(
        self, xid: int, commit_lsn: Lsn, skip: bool, gid: str | None = None, ts: int = 0
    ) -> None:
        raise NotImplementedError

    def _end_txn(self, end_lsn: Lsn, commit_ts: int, groupable: bool = False) -> None:
        raise NotImplementedError

    def on_streamed_change(self, lsn: Lsn, m: StreamedChange) -> None:
        sp = self.spool
        assert sp is not None
        if not sp.filtered:  # its Origin message said not to apply it (originfilter)
            self.spools.add(sp, m.data, m.xid)

    def on_stream_start(self, lsn: Lsn, m: StreamStart) -> None:
        if not m.first_segment and self.spools.get(m.xid) is None:
            # Its first segments never reached us: a spool from here would replay
            # a partial transaction at its Stream Commit.
            raise ProtocolError(
                "a Stream Start continues a streamed transaction whose first segment was "
                "not received",
                lsn=str(Lsn(lsn)),
                xid=m.xid,
                hint="the stream is out of order; applier run restarts from the origin",
            )
        self.state = STREAM
        self.spool = self.spools.open(m.xid, m.first_segment)

    def on_stream_stop(self, lsn: Lsn, m: StreamStop) -> None:
        self.state = IDLE
        self.spool = None

    def _replay(self, xid: int, commit_lsn: Lsn, gid: str | None = None, ts: int = 0) -> None:
        """Apply a spooled transaction through the change handlers (state TXN)."""
        spool = self.spools.get(xid)
        self.state = TXN
        self._start_txn(xid, commit_lsn, False, gid, ts)
        if spool is not None:
            for data in spool:
                self.dispatch(commit_lsn, decode_streamed(data))

    def on_stream_commit(self, lsn: Lsn, m: StreamCommit) -> None:
        self.commit_group()
        sp = self.spools.get(m.xid)
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
        if m.end_lsn <= self.progress or (sp is not None and sp.filtered):
            self.spools.discard(m.xid)
            self.skipped_txns += 1
            self.flush.store(m.end_lsn, FLUSHED)
            return
        try:
            self._replay(m.xid, m.commit_lsn, None, m.commit_ts)
            self.state = IDLE
            self._end_txn(m.end_lsn, m.commit_ts)
        finally:
            self.state = IDLE
            self.spools.discard(m.xid)

    def on_stream_abort(self, lsn: Lsn, m: StreamAbort) -> None:
        self.spools.abort(m.xid, m.subxid)
