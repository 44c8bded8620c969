"""The apply worker: the process around the message handlers.

This is applier's counterpart of the process side of PostgreSQL's
``src/backend/replication/logical/worker.c`` (``ApplyWorkerMain``,
``LogicalRepApplyLoop``); what each message does is in
:mod:`applier.apply.handlers.dispatch`.

Overview
========

:func:`run_worker` runs :class:`Worker`, which loops over *sessions* with
retry: a session opens the target (an apply session owning the replication
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
transactions the target has. We stream from it; the walsender skips every
transaction whose commit record starts before it. We check again: a
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
shows the fault (:mod:`.state`). The origin held by *another worker* (a
second ``applier run`` on the same origin) is permanent (exit 3), naming it;
only a backend abandoned by this process or this host's previous one is
waited for (:mod:`.holder`). A missing or wrong slot, another source, an
unfinished bootstrap (:mod:`.preflight`) are permanent (exit 3), never
retried. Anything
else the target refuses is an :class:`ApplyError` naming the source LSN, xid,
table, key and SQLSTATE: the worker rolls back, records it in
``applier.worker_status.last_error`` and exits non-zero; the origin has not
moved, so nothing after the failed transaction was applied.

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
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import psycopg
from tenacity import RetryCallState, Retrying, retry_if_exception

from applier.apply.backoff import Fault, backoff
from applier.apply.batching.paths import refresh as refresh_paths
from applier.apply.gcsched import collect_garbage_on_schedule
from applier.apply.handlers.dispatch import Applier
from applier.apply.handlers.spool import SpoolSet, check_spool_dir, default_spool_dir
from applier.apply.handlers.states import State
from applier.apply.handlers.streamed import LiveRestream
from applier.apply.handlers.until import Until
from applier.apply.rules.skiprules import REFRESH_INTERVAL, SkipRules
from applier.apply.rules.tablesync import TableSyncs
from applier.apply.sql.mapping import Catalog
from applier.apply.sql.replan import Replan
from applier.apply.state import WorkerState
from applier.apply.tally import Tally, count_fault
from applier.apply.target.beat import Beat, Reporter
from applier.apply.target.confirm import Confirmer
from applier.apply.target.connection import client_keepalives, close_quietly
from applier.apply.target.holder import OBJECT_IN_USE, origin_taken
from applier.apply.target.origin import ensure_origin, origin_progress
from applier.apply.target.preflight import check_before_streaming
from applier.apply.target.session import TargetSession, connect, is_transient_sqlstate
from applier.config import Config
from applier.errors import (
    ApplierError,
    ApplyError,
    ConfigError,
    ConnectionLost,
    SchemaMismatch,
    TransientError,
)
from applier.health import STALE_INTERVALS
from applier.lag import Lag, PendingCommits, measure
from applier.lsn import Lsn, now_pg_timestamp, pg_timestamp
from applier.privileges import Scope
from applier.privileges import check as check_privileges
from applier.redact import redact_dsn
from applier.schema import schema_at_head, upgrade_target
from applier.service import Service, signal_wakeup
from applier.speedups import Flag, dispatch_batch
from applier.speedups import describe as describe_speedups

log = logging.getLogger("applier.apply")


def source_conninfo(cfg: Config) -> str:
    """The source DSN with keepalives and tcp_user_timeout (unless the DSN sets them:
    see targetconn); the session settings that make text values portable come with
    every connection (applier.pgconn)."""
    return client_keepalives(cfg.source.conninfo(), cfg.apply.timeout)


#: A session that streamed this long without a fault counts as healthy (resets
#: the backoff) even if the source was idle and no position moved.
HEALTHY_AFTER = 60.0


class _Regroup(Exception):
    """A group failed: start over from the origin, applying its transactions one by one."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, TransientError):
        return True
    return isinstance(exc, ApplierError) and is_transient_sqlstate(exc.context.get("sqlstate"))


class Worker:
    def __init__(self, cfg: Config, log_level: str | None = None) -> None:
        self.cfg = cfg
        self.service = Service(cfg, log_level)
        self.notify = self.service.notify
        self._stop = Flag()
        self.confirmer = Confirmer()
        self._stop_event = threading.Event()
        #: Readable once a signal was handled (see run_worker): ends the stream's wait.
        self.wakeup: socket.socket | None = None
        self.applier: Applier | None = None
        self.spool_dir = cfg.apply.spool_dir or default_spool_dir()
        self.status: WorkerState | None = None
        self.sessions = 0
        # Counters that survive reconnects.
        self._applied = 0
        self._skipped = 0
        #: Rows that skipped the handlers (the lanes), over every session: logged at the end.
        self._lane_rows = 0
        #: Bytes of the stream read ahead while the target was waited on, over every session.
        self._read_ahead = 0
        self._retry_state: RetryCallState | None = None
        #: The fault being retried (applier.apply.backoff), None while healthy.
        self.fault: Fault | None = None
        self.group_limit = cfg.apply.group_commit
        #: How the next sessions apply what failed (applier.apply.sql.replan).
        self.replan = Replan()
        self.rules = SkipRules(cfg.origin)
        self._rules_read = 0.0
        #: Tables sync-tables copies (applier.apply.rules.tablesync).
        self.syncs = TableSyncs(cfg)
        # Read by applier.metrics at scrape time (from its thread, never waited for).
        self.stream: Any = None
        self.tally = Tally()
        self.reconnects: dict[str, int] = {}
        self.apply_errors = 0
        #: Commits received and not applied yet, over every session (applier.lag).
        self.pending = PendingCommits()
        #: What the worker does, for STATUS= (applier.apply.target.beat.Reporter).
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
        target_ci = cfg.target.conninfo()
        timeout = cfg.apply.target_timeout
        status_conn = connect(target_ci, "applier status", timeout)
        # Before the migrations or the slot: every grant the target role lacks, in one line.
        check_privileges("run", Scope(), target=status_conn)
        if not schema_at_head(status_conn):
            upgrade_target(target_ci)
        # Reopened on the next write after it broke (a target restart, a terminated
        # backend): the row must keep showing a fresh heartbeat and the last error.
        # The row is written once the first session owns the origin (state.py,
        # "Whose row"): a second worker must not take over the running one's row.
        self.status = WorkerState(
            status_conn,
            cfg.origin,
            cfg.source.slot,
            reopen=lambda: connect(target_ci, "applier status", timeout),
        )
        reporter = Reporter(self, self.status)
        reporter.start()
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=self._backoff,
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                # One Retrying spans the process; a healthy session resets its
                # attempt count (_healthy), so a fault after one backs off from the start.
                self._retry_state = attempt.retry_state
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
                    "applied_txns": self._applied,
                    "skipped_changes": self._skipped,
                    "lane_rows": self._lane_rows,
                    "read_ahead_bytes": self._read_ahead,
                }
            },
        )
        return 0

    def _backoff(self, rs: RetryCallState) -> float:
        """tenacity's wait: spaced by the fault's age (applier.apply.backoff)."""
        now = time.monotonic()
        if self.fault is None:
            self.fault = Fault(now)
        return backoff(rs.attempt_number, self.fault.age(now))

    def _before_sleep(self, rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        wait = rs.next_action.sleep if rs.next_action else 0
        fault = self.fault
        assert fault is not None  # _backoff ran first
        fault.attempts += 1
        now = time.monotonic()
        first = fault.attempts == 1
        (log.warning if fault.worth_logging(now) else log.debug)(
            "retrying after a transient error: %s" if first else "still retrying: %s",
            exc,
            extra={
                "ctx": {
                    "attempt": rs.attempt_number,
                    "fault_s": round(fault.age(now), 1),
                    "wait_s": round(wait, 1),
                }
            },
        )
        if exc is not None:
            count_fault(self.reconnects, exc)
        if exc is not None and self.status is not None:
            self.status.retrying(exc)
        self.phase = f"reconnecting after: {exc}"
        self.notify.status(
            f"reconnecting (attempt {rs.attempt_number}, next in {wait:.1f}s) after: {exc}"
        )

    def _healthy(self) -> None:
        """This session confirmed progress (or streamed for HEALTHY_AFTER s): reset the backoff.

        tenacity counts attempts in the RetryCallState of the running loop;
        setting it back to 1 makes the next fault wait what a first fault
        waits (up to 0.5 s) instead of growing with every fault of the
        process's life. Applied *and* confirmed, not just connected: a fault
        that recurs before anything is applied keeps backing off.
        """
        self.fault = None
        rs = self._retry_state
        if rs is not None and rs.attempt_number > 1:
            log.debug(
                "session healthy; retry backoff reset",
                extra={"ctx": {"faults": rs.attempt_number - 1}},
            )
            rs.attempt_number = 1

    # -- one session -------------------------------------------------------------------

    def _session(self) -> None:
        from applier.stream.client import LogicalStream, StreamOptions
        from applier.stream.replconn import ReplicationConnection

        cfg = self.cfg
        self.sessions += 1
        check_spool_dir(self.spool_dir)  # private and writable, before anything is opened
        target_ci = cfg.target.conninfo()
        catalog_conn = connect(target_ci, "applier catalog", cfg.apply.target_timeout)
        session: TargetSession | None = None
        stream: LogicalStream | None = None
        applier: Applier | None = None
        spools = SpoolSet(self.spool_dir, cfg.origin, cfg.apply.memory_limit, cfg.apply.spool_limit)
        try:
            ensure_origin(catalog_conn, cfg.origin)
            session = self._take_origin(catalog_conn)
            # Only once the origin is ours: a refused second worker on this host must
            # not remove the running one's spool files.
            spools.clear_stale()
            progress = origin_progress(session.conn, cfg.origin)
            our_origin_id = self._prepare_conflicts(catalog_conn)
            self.syncs.start(catalog_conn)
            repl = ReplicationConnection.open(source_conninfo(cfg), application_name="applier")
            try:
                check_before_streaming(catalog_conn, repl, cfg, progress)
            except BaseException:
                repl.close()
                raise
            stream = LogicalStream(
                repl,
                StreamOptions(
                    slot=cfg.source.slot,
                    publications=tuple(cfg.source.publications),
                    start_lsn=progress,
                    binary=cfg.apply.binary,
                    messages=True,
                    streaming=cfg.apply.streaming,
                    two_phase=cfg.apply.two_phase,
                    origin=cfg.source.origin,  # 16+: the walsender filters (originfilter)
                    status_interval=cfg.apply.status_interval,
                    timeout=cfg.apply.timeout,
                    defer_streamed=True,
                    group_streamed=True,  # Applier.on_streamed_run, on_insert_run
                ),
            )
            log.info(
                "connected",
                extra={
                    "ctx": {"source": redact_dsn(cfg.source.dsn), "target": cfg.target.redacted}
                },
            )
            if self.wakeup is not None:
                stream.wake_on(self.wakeup)
            stream.start()
            self.stream = stream
            self._reconnected()
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
            applier.applied_txns, applier.skipped_changes = self._applied, self._skipped
            applier.lane_rows = self._lane_rows
            applier.tally = self.tally
            applier.pending = self.pending
            applier.syncs = self.syncs
            self.applier = applier
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
                self._applied, self._skipped = applier.applied_txns, applier.skipped_changes
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

    def _take_origin(self, catalog_conn: psycopg.Connection[Any]) -> TargetSession:
        """The apply session, owning the origin; refused at once when another worker
        holds it, a wait when an abandoned backend does (applier.apply.target.holder)."""
        cfg = self.cfg
        try:
            session = TargetSession(
                cfg.target.conninfo(),
                cfg.origin,
                cfg.apply.synchronous_commit,
                cfg.apply.copy_threshold,
                cfg.apply.target_timeout,
            )
        except ConnectionLost as e:
            if e.context.get("sqlstate") != OBJECT_IN_USE:
                raise
            stale_after = STALE_INTERVALS * cfg.apply.status_interval
            raise origin_taken(catalog_conn, cfg.origin, e, stale_after) from None
        assert self.status is not None
        self.status.claim()
        return session

    def _reconnected(self) -> None:
        """Streaming again during a fault: said once per fault (applier.apply.backoff)."""
        fault = self.fault
        if fault is None or fault.reconnected:
            return
        fault.reconnected = True
        log.info(
            "reconnected after a transient error",
            extra={
                "ctx": {
                    "fault_s": round(fault.age(time.monotonic()), 1),
                    "attempts": fault.attempts,
                }
            },
        )

    def _prepare_conflicts(self, catalog_conn: psycopg.Connection[Any]) -> int | None:
        """Read the skip rules; check what the conflict policies need of the target;
        our origin's id (its rows' origin in commit timestamps)."""
        self.rules.load(catalog_conn)
        self._rules_read = time.monotonic()
        if self.cfg.conflicts.needs_commit_ts:
            row = catalog_conn.execute("SHOW track_commit_timestamp").fetchone()
            if not row or row[0] != "on":
                raise ConfigError(
                    "[conflicts] uses last_update_wins or an *_origin_differs policy, which "
                    "need the commit timestamps of the target's rows, and the target has "
                    "track_commit_timestamp = off",
                    hint="set track_commit_timestamp = on on the target (a restart of the "
                    "target is needed), or remove those policies, and start applier run again",
                )
        row = catalog_conn.execute(
            "SELECT roident FROM pg_catalog.pg_replication_origin WHERE roname = %s",
            (self.cfg.origin,),
        ).fetchone()
        return None if row is None else int(row[0])

    def _loop(self, stream: Any, applier: Applier, catalog_conn: psycopg.Connection[Any]) -> None:
        with collect_garbage_on_schedule() as collect:
            self._loop_body(stream, applier, catalog_conn, collect)

    def _loop_body(
        self,
        stream: Any,
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
        beat = Beat(self.notify, self.status, applier, self.cfg.apply.status_interval)
        while not self.stopping:
            self._serve_signals()
            batch = stream.read(0.5)
            self._dispatch(batch, dispatch)
            # What arrived meanwhile joins the group open between transactions (at
            # most group_commit of them); the group ends with the messages in hand:
            # nothing waits for more.
            while batch and applier.group_txns and applier.txn is None and not self.stopping:
                batch = stream.read(0)
                self._dispatch(batch, dispatch)
            if self.stopping:
                break
            self._after_batch(stream, applier, catalog_conn, bool(batch))
            if self.until is not None and self.until.finished(stream, applier):
                break
            now = self.loop_at = time.monotonic()
            self.pending.drop(self.done_lsn() or Lsn(0))
            collect(now)
            if now - self._rules_read >= REFRESH_INTERVAL:
                self._rules_read = now
                self.rules.load(catalog_conn)
            self.syncs.tick(now, applier, stream)
            refresh_paths(applier)  # either may have changed what a lane may take
            if not healthy and (
                (applier.applied_txns > txns_at_start and stream.confirmed > start_lsn)
                or now - started >= HEALTHY_AFTER
            ):
                healthy = True
                self._healthy()
            beat.tick(now)

    # -- lag (applier.lag), read from the reporter and metrics threads ------------------

    def done_lsn(self) -> Lsn | None:
        """The source position up to which everything is applied or had nothing for us:
        the session's start (the origin), the last commit whose result came, what the
        flush tracker released, what was confirmed (received, once nothing is in hand)."""
        stream, applier = self.stream, self.applier
        if stream is None:
            return None
        done = max(stream.options.start_lsn, stream.confirmed)
        if applier is not None:
            done = max(done, applier.last_commit_lsn or 0, applier.flush.flushed_remote)
        return Lsn(done)

    def pending_since(self) -> dt.datetime | None:
        """The commit time of the oldest transaction received and not applied."""
        done = self.done_lsn()
        return None if done is None else self.pending.oldest(done)

    def lag(self, source: Lsn | None = None) -> Lag:
        """The lag now: ``source`` the source's WAL position if known better than by the
        walsender's last message (the metrics' probe)."""
        stream, done = self.stream, self.done_lsn()
        if stream is None or done is None:
            return Lag(None, 0.0 if not self.pending else None)
        at = Lsn(max(stream.last_received, source or 0))
        return measure(at, done, self.pending.oldest(done), pg_timestamp(now_pg_timestamp()))

    def _after_batch(
        self, stream: Any, applier: Applier, catalog_conn: psycopg.Connection[Any], busy: bool
    ) -> None:
        """Between batches: commit the open group, take the results, confirm."""
        applier.commit_group()
        if busy:
            applier.session.poll()
        else:
            applier.session.settle()  # idle: let the commits in flight be confirmed
        self.confirmer.confirm(stream, applier, catalog_conn, busy=busy)

    def _dispatch(self, batch: list[tuple[Lsn, Any]], dispatch: Callable[[Lsn, Any], None]) -> None:
        applier = self.applier
        if applier is not None and self.stream is not None:
            applier.sent_at = self.stream.last_send_time
        if self.until is None and applier is not None:
            # Applier.dispatch's common path straight to the handlers, the rest
            # through it (applier/speedups/dispatch.c or .py): what it reads, it is
            # given to call.
            dispatch_batch(batch, applier.handlers, open_state_of(applier), dispatch, self._stop)
        else:
            self._dispatch_admitted(batch, dispatch)

    @property
    def stopping(self) -> bool:
        """A stop was asked for: the loops end after the message in hand."""
        return bool(self._stop)

    @stopping.setter
    def stopping(self, on: bool) -> None:
        # The flag dispatch_batch reads between messages, without a call.
        if on:
            self._stop.set()
        else:
            self._stop.clear()

    def _dispatch_admitted(
        self, batch: list[tuple[Lsn, Any]], dispatch: Callable[[Lsn, Any], None]
    ) -> None:
        """Each message of ``batch`` that ``until`` admits to ``dispatch``; stop after
        the one during which a stop was asked for."""
        until = self.until
        for lsn, msg in batch if until is None else until.admit(batch, self.applier):
            dispatch(lsn, msg)
            if self.stopping:
                break


def open_state_of(applier: Applier) -> Callable[[], State | None]:
    """What ``dispatch_batch`` calls per message: the applier's state while
    Applier.dispatch's common path is open (no live transaction to drop), else None."""

    def open_state() -> State | None:
        return applier.state if applier.live is None else None

    return open_state


def run_worker(cfg: Config, log_level: str | None = None, until: Lsn | None = None) -> int:
    """``applier run``: apply until SIGTERM/SIGINT (exit 0) or an apply error (raised);
    with ``until``, until every transaction ending at or before it is applied (exit 0)."""
    worker = Worker(cfg, log_level)
    worker.until = None if until is None else Until(until)
    if cfg.metrics.listen is not None:
        from applier.metrics import serve  # prometheus_client only when asked for

        serve(cfg, worker)  # before connecting: a port in use fails first
    if threading.current_thread() is threading.main_thread():

        def handler(signum: int, frame: FrameType | None) -> None:
            worker.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, worker.service.request_reload)
        with signal_wakeup() as worker.wakeup:
            return worker.run()
    return worker.run()
