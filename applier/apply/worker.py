"""The apply worker: the process around the message handlers.

This is applier's counterpart of the process side of PostgreSQL's
``src/backend/replication/logical/worker.c`` (``ApplyWorkerMain``,
``LogicalRepApplyLoop``); what each message does is in
:mod:`applier.apply.handlers.dispatch`.

Overview
========

:func:`run_worker` runs :class:`Worker`, which loops over *sessions* with
retry (:mod:`.backoff`): a session (its connections opened by :mod:`.connect`)
opens the target (an apply session owning the replication
origin, plus an autocommit connection for the catalog, flush checks and the
status row), reads the origin's progress, opens the replication connection,
runs the checks of :mod:`applier.apply.target.preflight` (no unfinished bootstrap,
the recorded source, the slot: created only for an origin without progress,
at the current position and with no snapshot), and streams from the origin's
progress (or the slot's confirmed position when the origin has none). Every
message goes through :meth:`Applier.dispatch`: a table maps each message kind
to its handler and to the session states in which it may arrive; anything
else is a :class:`ProtocolError`. With ``run --until-lsn``/``--until-caught-up``
:mod:`applier.apply.handlers.until` admits the messages and says when to stop (exit 0).

Restart and idempotence
=======================

The origin's progress is written in the same target transaction as the data,
so after any crash (of us, of either server) it says exactly which source
transactions the target has. We stream from it, or from its parallel group's
(:func:`~.parallel.origins.restart_point`, read with one session too: the plain
origin lags a group's); the walsender skips every transaction whose commit
record starts before it. We check again: a
transaction whose commit ``end_lsn`` is <= the progress is not applied.
Begin carries ``final_lsn`` (the commit record's *start*), and since the
progress is always a record boundary (a commit's end, or the slot's
consistent point), ``final_lsn < progress`` holds exactly when
``end_lsn <= progress``; so a duplicate is recognised at Begin, before any of
its rows could collide with the target, and the Commit re-checks with
``end_lsn``. (The XLogData ``wal_start`` of the Begin message is *not*
used: it is the transaction's first record, far before its commit.)

Faults
======

Connection loss, a server restart, a terminated walsender or backend
(SQLSTATE class 08, 57P01-57P03), a slot or origin still held by the
previous process (55006): :class:`TransientError`, retried (tenacity) at most
1 s apart while the fault is younger than a minute, then less often, up to
30 s apart (:mod:`.backoff` says why, and how often a fault is logged); the
session starts over from the origin, rolling back (and
``pg_replication_origin_xact_reset()``) whatever was in hand. A session that
applied and confirmed progress (or streamed for ``HEALTHY_AFTER`` s) ends the
fault and resets the attempt count, so a fault after a healthy period
reconnects within 0.5 s plus the connection set-up, however many faults the
process has seen. The status row's connection is reopened as needed and
shows the fault (:mod:`applier.status.row`). The origin held by *another worker* (a
second ``applier run`` on the same origin) is permanent (exit 3), naming it;
only a backend abandoned by this process or this host's previous one is
waited for (:mod:`.target.holder`). A missing or wrong slot, another source, an
unfinished bootstrap (:mod:`.target.preflight`) are permanent (exit 3), never
retried. Anything else the target refuses is an :class:`ApplyError` naming the
source LSN, xid, table, key and SQLSTATE: the worker rolls back, records it in
``applier.worker_status.last_error`` and exits non-zero; the origin has not moved.

Tables added to the publication (:mod:`applier.apply.rules.tablesync`): a table the
target lacks and applier never copied is skipped with one warning until
``applier sync-tables`` copies it; the worker re-reads the tables' states
between batches every few seconds and, at a transaction boundary, pauses
briefly to hand a caught-up table over (:mod:`applier.synctables`).

SIGTERM/SIGINT roll back the transaction in hand, send a last status update
and exit 0. Under systemd (:mod:`applier.service`): ``READY=1`` once streaming
has started (after the checks), ``WATCHDOG=1`` from the apply loop and
``STATUS=`` from the reporter thread (:mod:`.beat` says when and why),
``STOPPING=1`` on SIGTERM/SIGINT. The lag (:mod:`applier.lag`) is
:meth:`Worker.lag`, for the reporter and the metrics alike.
SIGHUP re-reads the config (log settings at once, the skip rules at the next
iteration, anything else after a restart); it never stops the worker.

Rejected
========

* Applying through psycopg cursors with Python values: a round trip through
  Python types per value, and text->Python->text changes values (time zones,
  float digits, numeric scale). The bytes the source printed go straight in.
* Judging duplicates by what the slot says (confirmed_flush_lsn): the slot is
  on the source and advances separately; only the origin is atomic with the
  data.
* A receiver thread: the kernel socket buffer already overlaps receiving with
  applying, the pipeline overlaps applying with the target's work, and a
  thread would only add GIL contention (measured in bench/README-apply.md).
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from applier.apply.backoff import HEALTHY_AFTER, Retry
from applier.apply.batchdispatch import BatchDispatch
from applier.apply.batching.paths import refresh as refresh_paths
from applier.apply.beat import Beat, Reporter
from applier.apply.confirm import Confirmer
from applier.apply.connect import new_stream, open_status, our_origin, take_origin
from applier.apply.core.tally import Tally, count_fault
from applier.apply.gcsched import collect_garbage_on_schedule
from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.spool import SpoolSet, check_spool_dir, default_spool_dir
from applier.apply.handlers.streamed import LiveRestream
from applier.apply.handlers.until import Until
from applier.apply.lagview import done_lsn, lag_now
from applier.apply.parallel import Leader, PoolStats, open_leader, restart_point
from applier.apply.rules.skiprules import REFRESH_INTERVAL, SkipRules
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.sql.mapping import Catalog
from applier.apply.sql.replan import Replan
from applier.apply.target.origin import ensure_origin
from applier.apply.target.session import TargetSession, connect
from applier.config import Config
from applier.errors import ApplierError, ApplyError, SchemaMismatch, TransientError
from applier.lag import Lag, PendingCommits
from applier.lsn import Lsn
from applier.pgconn import close_quietly
from applier.service import Service
from applier.speedups import describe as describe_speedups
from applier.status.row import WorkerState

if TYPE_CHECKING:
    from applier.stream.client import LogicalStream

log = logging.getLogger("applier.apply")


class _Regroup(Exception):
    """A group failed: start over from the origin, applying its transactions one by one."""


class Worker:
    def __init__(self, cfg: Config, log_level: str | None = None) -> None:
        self.cfg = cfg
        self.service = Service(cfg, log_level)
        self.notify = self.service.notify
        #: One batch of messages to the handlers, and the stop request it reads.
        self.batches = BatchDispatch()
        self.confirmer = Confirmer()
        self._stop_event = threading.Event()
        #: Readable once a signal was handled (see run_worker): ends the stream's wait.
        self.wakeup: socket.socket | None = None
        self.applier: Applier | None = None
        #: With ``[apply] workers`` > 1: the leader over the pool (applier.apply.parallel).
        self.leader: Leader | None = None
        #: The pools' counters over the worker's sessions before this one.
        self.parallel_past = PoolStats.none(cfg.apply.workers)
        self.spool_dir = cfg.apply.spool_dir or default_spool_dir()
        self.status: WorkerState | None = None
        self.sessions = 0
        # Counters that survive reconnects.
        self.applied_txns = 0
        self.skipped_changes = 0
        #: Rows that skipped the handlers (the lanes), over every session: logged at the end.
        self._lane_rows = 0
        #: Bytes of the stream read ahead while the target was waited on, over every session.
        self._read_ahead = 0
        #: The retries of transient faults, spaced and logged (applier.apply.backoff).
        self.retry = Retry(self._sleep, self._retrying)
        self.group_limit = cfg.apply.group_commit
        #: How the next sessions apply what failed (applier.apply.sql.replan).
        self.replan = Replan()
        self.rules = SkipRules(cfg.origin)
        self._rules_read = 0.0
        #: Tables sync-tables copies (applier.apply.rules.tablesync).
        self.syncs = TableSyncs(cfg)
        # Read by applier.apply.metrics at scrape time (from its thread, never waited for).
        self.stream: LogicalStream | None = None
        self.tally = Tally()
        self.reconnects: dict[str, int] = {}
        self.apply_errors = 0
        #: Commits received and not applied yet, over every session (applier.lag).
        self.pending = PendingCommits()
        #: What the worker does, for STATUS= (applier.apply.beat.Reporter).
        self.phase = "starting"
        #: time.monotonic() when the apply loop last came round.
        self.loop_at = time.monotonic()

    @property
    def until(self) -> Until | None:
        """``run --until-lsn``/``--until-caught-up``: stop there (applier.apply.handlers.until);
        positions past it are never confirmed."""
        return self.confirmer.until

    @until.setter
    def until(self, value: Until | None) -> None:
        self.confirmer.until = value

    def _sleep(self, seconds: float) -> None:
        """The backoff: alive (watchdog fed, SIGHUP served) and stoppable."""
        deadline = time.monotonic() + seconds
        while not self._stop_event.is_set():
            self._serve_signals()
            self.notify.watchdog()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._stop_event.wait(min(left, 0.5))

    def stop(self, *_: Any) -> None:
        if not self.stopping:
            log.info("stop requested; finishing")
            self.notify.stopping()
        self.phase = "stopping"
        self.stopping = True
        self._stop_event.set()

    def _serve_signals(self) -> None:
        if self.service.serve_reload():
            self._rules_read = 0.0  # the loop reads the skip rules at its next iteration

    # -- the retry loop ----------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        log.info(
            "applier run starting",
            extra={
                "ctx": {
                    "source": cfg.source.redacted,
                    "target": cfg.target.redacted,
                    "slot": cfg.source.slot,
                    "origin": cfg.origin,
                    "speedups": describe_speedups(),
                }
            },
        )
        self.status = open_status(cfg)
        reporter = Reporter(self, self.status)
        reporter.start()
        try:
            for attempt in self.retry.attempts():
                # One Retrying spans the process; a healthy session resets its
                # attempt count (Retry.healthy), so a fault after one backs off from the start.
                self.retry.started(attempt.retry_state)
                with attempt:
                    while not self.stopping:
                        try:
                            self._session()
                            break
                        except _Regroup:
                            continue
        except ApplierError as e:
            # The CLI logs the error (applier.log.log_fatal): one line, not two.
            self.status.failed(e)
            raise
        except BaseException as e:
            self.status.failed(e)
            raise
        else:
            self.status.stopped()
        finally:
            reporter.stop()
            self.status.close()
        log.info(
            "applier run stopped",
            extra={
                "ctx": {
                    "applied_txns": self.applied_txns,
                    "skipped_changes": self.skipped_changes,
                    "lane_rows": self._lane_rows,
                    "read_ahead_bytes": self._read_ahead,
                }
            },
        )
        return 0

    def _retrying(self, exc: BaseException | None, attempt: int, wait: float) -> None:
        """Before the wait for a next attempt: the fault counted and shown."""
        if exc is not None:
            count_fault(self.reconnects, exc)
        if exc is not None and self.status is not None:
            self.status.retrying(exc)
        self.phase = f"reconnecting after: {exc}"
        self.notify.status(f"reconnecting (attempt {attempt}, next in {wait:.1f}s) after: {exc}")

    # -- one session -------------------------------------------------------------------

    def _session(self) -> None:
        cfg = self.cfg
        self.sessions += 1
        check_spool_dir(self.spool_dir)  # private and writable, before anything is opened
        target_ci = cfg.target.conninfo()
        catalog_conn = connect(target_ci, "applier catalog", cfg.apply.target_timeout)
        session: TargetSession | None = None
        stream: LogicalStream | None = None
        applier: Applier | None = None
        leader: Leader | None = None
        spools = SpoolSet(self.spool_dir, cfg.origin, cfg.apply.memory_limit, cfg.apply.spool_limit)
        try:
            ensure_origin(catalog_conn, cfg.origin)
            session = take_origin(cfg, catalog_conn)
            assert self.status is not None
            self.status.claim()
            # Only once the origin is ours: a refused second worker on this host must
            # not remove the running one's spool files.
            spools.clear_stale()
            progress = restart_point(session.conn, cfg.origin)  # with the group's, if any
            self.rules.load(catalog_conn)
            self._rules_read = time.monotonic()
            our_origin_id = our_origin(cfg, catalog_conn)
            self.syncs.start(catalog_conn)
            stream = new_stream(cfg, catalog_conn, progress)
            if self.wakeup is not None:
                stream.wake_on(self.wakeup)
            stream.start()
            self.stream = stream
            self.retry.reconnected()
            session.read_ahead = (stream.ahead, stream.socket, stream.read_ahead)
            log.info(
                "resumed from the origin's progress"
                if progress
                else "starting at the slot's position",
                extra={"ctx": {"lsn": progress, "origin": cfg.origin}},
            )
            self.notify.ready(f"streaming from {progress or 'the slot'}")
            self.phase = "streaming"
            applier = Applier(
                cfg,
                session,
                Catalog(catalog_conn),
                spools,
                progress,
                self.group_limit,
                self.replan.no_group_until,
                self.rules,
                self.replan.careful_until,
                our_origin_id,
                self.replan.no_live,
            )
            applier.applied_txns, applier.skipped_changes = self.applied_txns, self.skipped_changes
            applier.lane_rows = self._lane_rows
            applier.tally = self.tally
            applier.pending = self.pending
            applier.syncs = self.syncs
            self.applier = applier
            if cfg.apply.workers > 1:  # chosen once per session: the pool, or not
                leader = self.leader = open_leader(
                    cfg, applier, catalog_conn, spools, self.rules, our_origin_id,
                    self.pending, self.syncs, lambda: self.stopping, self.parallel_past,
                )  # fmt: skip
            try:
                self._loop(stream, applier, catalog_conn)
            except LiveRestream as e:
                self.replan.restream(e.xid, e.why)
                raise _Regroup() from e
            except (ApplyError, SchemaMismatch) as e:
                self.apply_errors += 1
                if self.replan.after_error(e, applier, session, stream.last_received):
                    raise _Regroup() from e
                raise
        except psycopg.OperationalError as e:
            raise TransientError(f"connection problem: {str(e).strip()}") from None
        finally:
            if leader is not None:
                leader.pool.stop()  # what the members hold rolls back
                self.parallel_past, self.leader = leader.stats(), None
            if session is not None:
                session.read_ahead = None  # the stream is done with, or broken
                try:
                    if applier is not None:
                        applier.abandon()  # also takes the results of commits in flight
                    else:
                        session.rollback()
                except (ApplierError, psycopg.Error) as e:
                    log.debug("rollback on the way out failed: %s", e)
            if applier is not None:
                self.applied_txns, self.skipped_changes = (
                    applier.applied_txns,
                    applier.skipped_changes,
                )
                self._lane_rows = applier.lane_rows
            if stream is not None:
                if applier is not None:
                    self.confirmer.confirm(stream, applier, catalog_conn, final=True)
                stream.stop()
                self._read_ahead += stream.ahead.taken
            if session is not None:
                session.close()
            spools.close()
            close_quietly(catalog_conn, "catalog")

    def _loop(
        self, stream: LogicalStream, applier: Applier, catalog_conn: psycopg.Connection[Any]
    ) -> None:
        with collect_garbage_on_schedule() as collect:
            self._loop_body(stream, applier, catalog_conn, collect)

    def _loop_body(
        self,
        stream: LogicalStream,
        applier: Applier,
        catalog_conn: psycopg.Connection[Any],
        collect: Callable[[float], None],
    ) -> None:
        started = time.monotonic()
        txns_at_start = applier.applied_txns
        start_lsn = stream.options.start_lsn
        healthy = False
        dispatch = applier.dispatch
        assert self.status is not None
        beat = Beat(
            self.notify, self.status, applier, self.cfg.apply.status_interval, self.parallel_stats
        )
        leader = self.leader
        while not self.stopping:
            self._serve_signals()
            batch = self._read(stream, dispatch, None)
            # What arrived meanwhile joins the group open between transactions (up to
            # group_commit); it ends with the messages in hand: nothing waits for more.
            while batch and applier.group_txns and applier.txn is None and not self.stopping:
                batch = self._read(stream, dispatch, 0)  # the leader's inline lane groups too
            if self.stopping:
                break
            self._after_batch(stream, applier, catalog_conn, bool(batch))
            if self._until_done(stream, applier):
                break
            now = self.loop_at = time.monotonic()
            self.pending.drop(self.done_lsn() or Lsn(0))
            collect(now)
            if now - self._rules_read >= REFRESH_INTERVAL:
                self._rules_read = now
                self.rules.load(catalog_conn)
            if leader is None or leader.between_txns:
                if leader is not None and self.syncs.wants_handover:
                    leader.drain()  # a hand-over pauses with everything before it applied
                self.syncs.tick(now, applier, stream)
            applier.ddl.fill.tick(applier.session.committed)
            refresh_paths(applier)  # either may have changed what a lane may take
            if not healthy and (
                (applier.applied_txns > txns_at_start and stream.confirmed > start_lsn)
                or now - started >= HEALTHY_AFTER
            ):
                healthy = True
                self.retry.healthy()
            beat.tick(now)

    # -- lag (applier.lag), read from the reporter and metrics threads ------------------

    def parallel_stats(self) -> PoolStats | None:
        """The pool's (applier.apply.parallel.pool), None with one session."""
        leader = self.leader
        if self.cfg.apply.workers == 1:
            return None
        return leader.stats() if leader is not None else self.parallel_past

    def done_lsn(self) -> Lsn | None:
        """The source position up to which everything is applied or had nothing for us
        (:func:`applier.apply.lagview.done_lsn`)."""
        return done_lsn(self.stream, self.applier)

    def pending_since(self) -> dt.datetime | None:
        """The commit time of the oldest transaction received and not applied."""
        done = self.done_lsn()
        return None if done is None else self.pending.oldest(done)

    def lag(self, source: Lsn | None = None) -> Lag:
        """The lag now (:func:`applier.apply.lagview.lag_now`)."""
        return lag_now(self.stream, self.done_lsn(), self.pending, source)

    def _after_batch(
        self,
        stream: LogicalStream,
        applier: Applier,
        catalog_conn: psycopg.Connection[Any],
        busy: bool,
    ) -> None:
        """Between batches: commit the open group, take the results, confirm."""
        applier.commit_group()
        if busy:
            applier.session.poll()
        else:
            applier.session.settle()  # idle: let the commits in flight be confirmed
        leader = self.leader
        if leader is not None:
            leader.pool.collect()
        quiet = leader is None or leader.quiet
        self.confirmer.confirm(stream, applier, catalog_conn, busy=busy, quiet=quiet)

    def _until_done(self, stream: LogicalStream, applier: Applier) -> bool:
        """``run --until``: everything up to the position applied and confirmed."""
        until, leader = self.until, self.leader
        if until is None or (leader is not None and not leader.may_finish(until)):
            return False
        return until.finished(stream, applier)

    def _read(
        self, stream: LogicalStream, dispatch: Callable[[Lsn, Any], None], wait: float | None
    ) -> list[tuple[Lsn, Any]]:
        """One batch, read (``wait``: s, None 0.5) and dispatched; by the leader with a pool."""
        if self.leader is not None:
            return self.leader.read(stream, self.until, wait)
        batch = stream.read(0.5 if wait is None else wait)
        if self.applier is not None:
            self.applier.sent_at = stream.last_send_time
        self.batches.dispatch(batch, self.applier, self.until, dispatch)
        return batch

    @property
    def stopping(self) -> bool:
        """A stop was asked for: the loops end after the message in hand."""
        return self.batches.stopping

    @stopping.setter
    def stopping(self, on: bool) -> None:
        self.batches.stopping = on
