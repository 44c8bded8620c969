"""Two-phase transactions: the ``apply_handle_*prepare*`` handlers of worker.c.

Two-phase
=========

With ``two_phase`` (protocol 3), Begin Prepare .. Prepare is applied and
ended with ``PREPARE TRANSACTION 'applier_<origin>_<xid>'`` (deterministic,
like PostgreSQL's ``pg_gid_<subid>_<xid>``), the origin stamped with the
prepare's end LSN. Commit/Rollback Prepared stamp the origin and run
``COMMIT/ROLLBACK PREPARED``.

As in worker.c, a prepare is never skipped by its LSN: a transaction prepared
before the slot's ``two_phase_at`` (two-phase switched on for an existing
slot, or prepared between the slot's snapshot and its consistent point) is
sent whole at its COMMIT PREPARED, Begin Prepare and Prepare carrying their
prepare-time LSNs, below our progress; it is prepared (the origin stamp does
not move the origin back) and committed. A Begin Prepare whose GID is already
prepared on the target is skipped (its rows are in the prepared transaction:
a restart between prepare and commit). A Commit Prepared whose GID is not
prepared is skipped when its end LSN is <= the progress (committed here
before); otherwise its changes never reached the target, and that is an
:class:`~applier.errors.ApplyError` (exit 3), never a log line. A Rollback
Prepared of a GID not prepared here is skipped (nothing to undo).

A prepared transaction filtered by its origin (``[source] origin = "none"``,
see :mod:`applier.apply.rules.originfilter`) is not prepared here; its COMMIT
PREPARED is skipped (counted in ``skipped_txns``).

:class:`TwoPhaseTxns` is a part the :class:`~applier.apply.handlers.dispatch.Applier`
owns: it moves the Applier's transaction through :class:`TwoPhaseHost`, writes the
records through :class:`~applier.apply.handlers.ports.Records`, sends held rows through
:class:`~applier.apply.handlers.ports.Held` and replays a spooled transaction through
:class:`~applier.apply.handlers.ports.Replay`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from applier.apply.core.states import IDLE, PREPARE
from applier.apply.handlers.ports import Held, Records, Replay, TxnFlow
from applier.apply.rules.originfilter import OriginFilter
from applier.apply.target.origin import FLUSHED
from applier.errors import ApplyError
from applier.lsn import Lsn
from applier.protocol import (
    BeginPrepare,
    CommitPrepared,
    Prepare,
    RollbackPrepared,
    StreamPrepare,
)

log = logging.getLogger("applier.apply")


class TwoPhaseHost(TxnFlow, Protocol):
    """What the two-phase handlers read and move of the Applier."""

    applied_txns: int


class TwoPhaseTxns:
    """Begin Prepare .. Prepare, Stream Prepare, Commit/Rollback Prepared."""

    def __init__(
        self,
        host: TwoPhaseHost,
        records: Records,
        replay: Replay,
        held: Held,
        origins: OriginFilter,
        gid_prefix: str,
        forget_mappings: Callable[[], None] = lambda: None,
    ) -> None:
        self.host = host
        #: After ROLLBACK PREPARED: a schema change the prepared transaction made is
        #: undone on the target, so no mapping built inside it may stay.
        self.forget_mappings = forget_mappings
        self.records = records
        self.replayer = replay
        self.held = held
        self.origins = origins
        self.gid_prefix = gid_prefix

    def on_stream_prepare(self, lsn: Lsn, m: StreamPrepare) -> None:
        self.host.commit_group()
        gid = self.gid(m.xid)
        sp = self.host.spools.get(m.xid)
        if sp is not None and sp.filtered:
            self.origins.prepared.add(m.xid)  # for its COMMIT/ROLLBACK PREPARED
        if (sp is not None and sp.filtered) or self.is_prepared(gid):  # not by LSN: "Two-phase"
            self.host.spools.discard(m.xid)
            self.host.flush.store(m.end_lsn, FLUSHED)
            return
        try:
            self.replayer.replay(m.xid, m.prepare_lsn, gid, m.prepare_ts)
            self._finish_prepare(m.end_lsn, m.prepare_ts)
        finally:
            self.host.move(IDLE)
            self.host.spools.discard(m.xid)

    def gid(self, xid: int) -> str:
        return f"{self.gid_prefix}{xid}"

    def is_prepared(self, gid: str) -> bool:
        return bool(
            self.host.session.query_one(
                "SELECT count(*) FROM pg_catalog.pg_prepared_xacts "
                "WHERE gid = %s AND database = pg_catalog.current_database()",
                (gid,),
            )
        )

    def on_begin_prepare(self, lsn: Lsn, m: BeginPrepare) -> None:
        self.host.commit_group()
        gid = self.gid(m.xid)
        # Not by LSN (worker.c neither): a transaction prepared before the slot's
        # two_phase_at comes at its COMMIT PREPARED with its prepare-time LSNs, below
        # our progress. The walsender sends no prepare twice from one start point, so
        # the only duplicate is one already prepared here (its rows are in it).
        skip = self.is_prepared(gid)
        if skip:
            log.info("skipping a transaction prepared before", extra={"ctx": {"gid": gid}})
        self.host.move(PREPARE)
        self.host.start_txn(m.xid, m.prepare_lsn, skip, gid, m.prepare_ts)

    def on_prepare(self, lsn: Lsn, m: Prepare) -> None:
        self._finish_prepare(m.end_lsn, m.prepare_ts)

    def _finish_prepare(self, end_lsn: Lsn, prepare_ts: int) -> None:
        host = self.host
        txn = host.txn
        assert txn is not None and txn.gid is not None
        host.move(IDLE)
        host.txn = None
        if txn.skip:
            self.host.session.rollback()
            self.host.flush.store(end_lsn, FLUSHED)
            return
        # Its kept changes and a txn rule's mark: prepared with it (a skipped
        # transaction is prepared empty but for them, and COMMIT PREPARED finds it).
        self.records.finish_records(txn, end_lsn)
        if not self.host.session.in_txn:
            self.host.session.begin()  # an empty prepared transaction, so COMMIT PREPARED finds it
        self.held.send_held()
        self.records.flush_conflicts()
        committed = self.host.session.committed
        local = self.host.session.prepare(txn.gid, end_lsn, prepare_ts)
        # A prepare replayed at its COMMIT PREPARED ends below the progress: the origin
        # does not move back, nor may the position the session rewinds it to.
        self.host.session.committed = Lsn(max(committed, end_lsn))
        self.host.committed(end_lsn, prepare_ts, local)

    def on_commit_prepared(self, lsn: Lsn, m: CommitPrepared) -> None:
        self.host.commit_group()
        gid = self.gid(m.xid)
        if not self.is_prepared(gid):
            # Committed here before (the origin is past its COMMIT PREPARED), or its
            # PREPARE was filtered by its origin.
            if m.end_lsn <= self.host.progress or self.origins.finish_prepared(
                m.xid, gid, m.end_lsn
            ):
                self.host.skipped_txns += 1
                self.host.flush.store(m.end_lsn, FLUSHED)
                return
            raise ApplyError(
                f"COMMIT PREPARED of transaction {gid}, which is neither prepared on the "
                "target nor applied before",
                gid=gid,
                xid=m.xid,
                lsn=str(Lsn(m.end_lsn)),
                progress=str(Lsn(self.host.progress)),
                hint="its changes never reached the target (someone ran ROLLBACK PREPARED "
                "there, or the target was restored); re-bootstrap the target",
            )
        local = self.host.session.finish_prepared(gid, True, m.end_lsn, m.commit_ts)
        self.host.committed(m.end_lsn, m.commit_ts, local)

    def on_rollback_prepared(self, lsn: Lsn, m: RollbackPrepared) -> None:
        self.host.commit_group()
        gid = self.gid(m.xid)
        self.origins.prepared.discard(m.xid)
        if not self.is_prepared(gid):
            # Never prepared here (prepared before two_phase_at: PostgreSQL sends no
            # changes of it), or rolled back before: nothing to undo (worker.c too).
            self.host.flush.store(m.rollback_end_lsn, FLUSHED)
            return
        local = self.host.session.finish_prepared(gid, False, m.rollback_end_lsn, m.rollback_ts)
        self.host.committed(m.rollback_end_lsn, m.rollback_ts, local)
        self.host.applied_txns -= 1
        # Rare: every table is looked up again (and followed again) at its next change.
        self.forget_mappings()
