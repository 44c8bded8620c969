"""The target session: settings, origin ownership, and the pipelined executor.

Target session
==============

One connection applies every change. Like every connection applier opens it
starts pinned (:mod:`applier.pgconn`: ``search_path = pg_catalog``, so nothing
on the target can hijack an operator or function; ``TimeZone = UTC``,
``DateStyle = ISO``, ``IntervalStyle = postgres``, ``client_encoding = UTF8``,
as the replication connection's text; no timeouts, read committed). It is
then set up once: ``session_replication_role = replica`` (target triggers and
FK checks behave as for the built-in subscriber; needs a privilege, so not
in the startup packet, where a refusal is FATAL), ``synchronous_commit`` from
the config, and ``pg_replication_origin_session_setup(origin)``: this session
owns the origin, so each commit records the source position atomically.

Executor
========

Each change is one ``send_query_prepared`` on the pipeline of
:mod:`applier.apply.target.pipeline` (its statement prepared once per session with
``send_prepare``, parameter types = target column type OIDs), which also reads
the results and attributes errors to their change. Nothing waits for the
server until the commit's Sync.

Runs of INSERTs into one table leave the pipeline for ``COPY ... FROM STDIN``
(:mod:`applier.apply.target.insertruns`, rows encoded by :mod:`applier.apply.sql.copyrun`);
every other call ends the run in hand first, so statements reach the target in
source order.

Pipelined commits
=================

A commit (origin stamp, COMMIT, Sync) is sent without waiting for its result:
the session stays in pipeline mode and the next transaction follows at once,
so the target executes one group while the worker decodes the next. The
result comes later; only then does the commit's callback record its position
for the flush tracker (so nothing is confirmed to the slot before its commit
is known). No transaction may commit after one that failed: an error inside a
transaction leaves the explicit transaction block aborted, so everything up to
the next ROLLBACK fails; and for a failure inside COMMIT itself (which leaves
no block open) the first statement of every transaction is a *guard* that
divides by zero unless the session setting ``applier.txn`` holds the id the
previous transaction set (a setting made in a transaction that aborts is
undone). ``commit(wait=True)`` waits, for the one-by-one replay after a
failure, where the error must name its own transaction.

Origin stamp
============

Made from inside COMMIT and PREPARE TRANSACTION through the tables of the
applier schema (:mod:`applier.apply.target.stamp`); a role that cannot write them is
refused when the session opens.

After ANY failure the transaction is rolled back and
``pg_replication_origin_xact_reset()`` is called: the session's origin
LSN/timestamp survive a ROLLBACK and would otherwise stamp the next commit.

Connection
==========

:func:`applier.apply.target.connection.connect`: TCP keepalives, settings no role or
database default may change, psycopg's own statement preparation off (it
would ``DEALLOCATE ALL`` on a ROLLBACK, dropping the session's statements), and
a bound on how long the socket may stay silent while results are owed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from applier.apply.sql.planner import Formats, Params, Stmt
from applier.apply.target.connection import DEFAULT_TIMEOUT, connect, pin, session_settings
from applier.apply.target.insertruns import InsertRuns
from applier.apply.target.origin import rewind, session_progress
from applier.apply.target.pipeline import (
    _CHECK,
    _CHECKS,
    _CTL,
    _LSN,
    _MANY,
    _MANY_LAZY,
    _MOD,
    _MOD_LAZY,
    _ROW,
    _SYNC,
    MAX_INFLIGHT,
    MAX_INFLIGHT_BYTES,
    PUMP_EVERY,
    Pipeline,
    is_transient_sqlstate,
    lost,
)
from applier.apply.target.stamp import PREPARE_STAMP, STAMP, check_stamp, literal, stamp_params
from applier.lsn import Lsn, pg_timestamp
from applier.pgconn import close_quietly

__all__ = ["TargetSession", "connect", "is_transient_sqlstate"]

log = logging.getLogger("applier.apply")

#: First statement of every target transaction (see "Pipelined commits"): fails
#: unless the previous transaction of this session committed, and records this one.
#: A session-level setting made in a transaction is undone if it aborts.
_GUARD = (
    b"SELECT 1 / (pg_catalog.current_setting('applier.txn', true) "
    b"IS NOT DISTINCT FROM $1)::pg_catalog.int4, "
    b"pg_catalog.set_config('applier.txn', $2, false)"
)
#: After each commit (``synchronous_commit = off``): the target position to wait for,
#: and the target's flush position, which releases earlier commits (confirm.py).
LOCAL_LSNS = (
    b"SELECT pg_catalog.pg_current_wal_insert_lsn()::text, "
    b"pg_catalog.pg_current_wal_flush_lsn()::text"
)


class TargetSession(Pipeline):
    """The apply connection; one open target transaction at most.

    Its runs of INSERTs are a part it owns (:attr:`runs`,
    :class:`~applier.apply.target.insertruns.InsertRuns`), whose entry points it
    offers as its own (bound once: they run per row)."""

    def __init__(
        self,
        conninfo: str,
        origin: str,
        synchronous_commit: str,
        copy_threshold: int = 64,
        timeout: float = DEFAULT_TIMEOUT,
        application_name: str = "applier apply",
    ) -> None:
        self.origin = origin
        #: Runs of INSERTs (COPY, multi-row, checked): a part of this session.
        self.runs = runs = InsertRuns(self, copy_threshold)
        self.insert = runs.insert
        self.insert_checked = runs.insert_checked
        self.copy_line = runs.copy_line
        self.copy_lines = runs.copy_lines
        self.run_in_hand = runs.run_in_hand
        self.copy_in_hand = runs.copy_in_hand
        conn = connect(conninfo, application_name, timeout)
        assert conn.watchdog is not None
        super().__init__(conn, conn.watchdog)
        self.flush_wait = synchronous_commit == "off"
        try:
            pin(self.conn, session_settings(synchronous_commit))  # one round trip
            check_stamp(self.conn)
            self.conn.execute(
                "SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (origin,)
            )
            #: The origin's progress as of the last commit known to have succeeded.
            self.committed = self._origin_position()
        except psycopg.Error as e:
            self.close()
            raise self._error(e, "setting up the target session") from None
        except BaseException:
            self.close()
            raise
        self.in_txn = False
        #: The guard's chain: the id the last transaction set (see "Pipelined commits").
        self._txn_seq = 0
        self._guard_expect: bytes | None = None

    @property
    def copy_threshold(self) -> int:
        """Runs of at least this many INSERTs go out as COPY (0: never)."""
        return self.runs.copy_threshold

    @property
    def multi_row(self) -> bool:
        """Runs shorter than that go as multi-row INSERTs (else one by one)."""
        return self.runs.multi_row

    @multi_row.setter
    def multi_row(self, on: bool) -> None:
        self.runs.multi_row = on

    # -- pipeline ----------------------------------------------------------------------

    def begin(self) -> None:
        """Open a target transaction (pipeline mode, BEGIN and the guard queued)."""
        assert not self.in_txn
        if self.failure is not None:
            self.raise_failure()
        try:
            if not self._pipeline:
                self._enter_pipeline()
            self.in_txn = True
            self._send_ctl(b"BEGIN", "BEGIN")
            self._txn_seq += 1
            mine = str(self._txn_seq).encode()
            self._send_ctl(_GUARD, "guard", [self._guard_expect, mine])
            self._guard_expect = mine
        except psycopg.OperationalError as e:
            raise lost(e) from None

    def execute(
        self,
        stmt: Stmt,
        params: Params,
        formats: Formats,
        ctx: Any,
        merged: bool = False,
        checked: bool = False,
    ) -> None:
        """Queue one prepared statement; ``ctx`` identifies the change in errors.

        ``merged``: a merged UPDATE (:mod:`applier.apply.batching.merge`) whose RETURNING
        says which of the rows in ``ctx.ctxs`` it found. ``checked``: a statement of
        :mod:`applier.apply.rules.conflicts`, whose result ``ctx.check(ctx, result)`` reads.
        """
        if self.runs.run is not None:
            self.runs.end_run()
        pg = self.pg
        try:
            if stmt.name not in self._prepared:
                pg.send_prepare(stmt.name, stmt.query, param_types=stmt.types)
                self._q.append((_CTL, ("prepare", ctx, stmt.name)))
                self._prepared.add(stmt.name)
            pg.send_query_prepared(stmt.name, params, param_formats=formats)
        except psycopg.OperationalError as e:
            raise lost(e) from None
        kind = _CHECK if checked else _MANY if merged else _MOD if stmt.modifies else _ROW
        if kind in (_MOD, _MANY):
            # Without a policy a row not found is only recorded: no reason to wait.
            rm = ctx.rm
            if rm.policy is None:
                kind = _MOD_LAZY if kind == _MOD else _MANY_LAZY
        self._q.append((kind, ctx))
        if kind in _CHECKS:
            self._checks += 1
        if merged:
            # A merged statement holds up to MAX_HELD changes until its result: bound
            # them (1,000,000 merged DELETEs reached 456 MB of RSS without this).
            self._held_rows += len(ctx) - 1
            if len(self._q) + self._held_rows > MAX_INFLIGHT:
                self._catch_up(until_empty=False)
        self._bytes_out += sum(map(len, filter(None, params)))
        if self._bytes_out > MAX_INFLIGHT_BYTES and self._pipeline:
            self._catch_up(until_empty=True)  # _drain counts from 0 once the queue is empty
        # _after_send(), inlined: this runs for every change.
        self._sent += 1
        if self._sent % PUMP_EVERY == 0:
            self._pump(until_empty=False)
            if self.failure is not None:
                self.raise_failure()

    def execute_sql(self, query: bytes, ctx: Any) -> None:
        """Queue one unprepared statement without parameters (TRUNCATE)."""
        if self.runs.run is not None:
            self.runs.end_run()
        try:
            self.pg.send_query_params(query, None)
        except psycopg.OperationalError as e:
            raise lost(e) from None
        self._q.append((_ROW, ctx))
        self._after_send()

    def flush_checks(self) -> None:
        """Send the run in hand and read every result that may report a conflict."""
        if self._checks or self.runs.run is not None:
            self.runs.end_run()
            self.read_checks()

    # -- careful replay (see applier.apply.handlers.dispatch, "Careful replay") ----------------

    def attempt(self, send: Callable[[], None], on_error: Callable[[Any], bool]) -> None:
        """Run one change (``send`` queues it) inside a savepoint and wait for it.

        If it fails, roll back to the savepoint and call ``on_error(result)`` outside
        the pipeline, inside the savepoint (it may query; a query that fails may roll
        back to ``applier_change`` again); when that returns False the failure is
        raised as usual.
        """
        assert self.in_txn
        self.runs.end_run()
        self._send_ctl(b"SAVEPOINT applier_change", "SAVEPOINT")
        send()
        self.runs.end_run()
        self.sync_pipeline()
        failure, self.failure = self.failure, None
        self.failed_inflight = False
        taken = True
        try:
            if failure is not None:
                self.conn.execute("ROLLBACK TO SAVEPOINT applier_change")
                taken = on_error(failure[0])
            self.conn.execute("RELEASE SAVEPOINT applier_change")
        except psycopg.Error as e:
            raise self._error(e, "rolling back to a savepoint") from None
        if not taken:
            assert failure is not None
            self.failure = failure
            self.reenter_pipeline()
            self.raise_failure()
        self.reenter_pipeline()

    # -- transaction end -------------------------------------------------------------

    def _stamp(self, end_lsn: Lsn, ts: int) -> None:
        """Queue the origin stamp of a COMMIT (see :mod:`applier.apply.target.stamp`)."""
        self._send_ctl(STAMP, "origin stamp", stamp_params(end_lsn, ts))

    def commit(
        self, end_lsn: Lsn, commit_ts: int, done: Callable[[Lsn], None], wait: bool = False
    ) -> None:
        """Stamp the origin and commit, without waiting for the result unless ``wait``.

        ``done(local_lsn)`` runs once the commit succeeded (``local_lsn``: the
        target WAL position to wait for, 0 when durable already).
        """
        assert self.in_txn
        self.runs.end_run()
        self._stamp(end_lsn, commit_ts)
        self._send_ctl(b"COMMIT", "COMMIT")
        try:
            if self.flush_wait:
                self.pg.send_query_params(LOCAL_LSNS, None)
                self._q.append((_LSN, None))
            self.pg.pipeline_sync()
        except psycopg.OperationalError as e:
            raise lost(e) from None
        self._q.append((_SYNC, (done, self._guard_expect, wait, Lsn(end_lsn))))
        self.in_txn = False
        if wait:
            self.settle()
        else:
            self._pump(until_empty=False)
            if self.failure is not None:
                self.raise_failure()

    def prepare(self, gid: str, end_lsn: Lsn, prepare_ts: int) -> Lsn:
        """Stamp the origin and PREPARE TRANSACTION ``gid``."""
        assert self.in_txn
        self.runs.end_run()
        self._send_ctl(PREPARE_STAMP, "origin stamp", stamp_params(end_lsn, prepare_ts))
        self._send_ctl(b"PREPARE TRANSACTION " + literal(gid), "PREPARE TRANSACTION")
        if self.flush_wait:
            self.pg.send_query_params(LOCAL_LSNS, None)
            self._q.append((_LSN, None))
        self._local_lsn = Lsn(0)
        self._finish()
        self.committed = Lsn(end_lsn)
        self._resync_guard()
        return self._local_lsn

    def _resync_guard(self) -> None:
        """Read the guard id the server holds (after a PREPARE TRANSACTION)."""
        try:
            row = self.conn.execute(
                "SELECT pg_catalog.current_setting('applier.txn', true)"
            ).fetchone()
        except psycopg.Error as e:
            raise self._error(e, "reading the session's transaction guard") from None
        value = row[0] if row else None
        self._guard_expect = self._guard_committed = None if value is None else value.encode()

    def _finish(self) -> None:
        self.sync_pipeline()
        self.in_txn = False
        if self.failure is not None:
            self._reset_after_error()
            self.raise_failure()

    def finish_prepared(self, gid: str, commit: bool, end_lsn: Lsn, ts: int) -> Lsn:
        """COMMIT/ROLLBACK PREPARED with the origin stamped (outside any transaction)."""
        assert not self.in_txn
        self.settle()
        verb = b"COMMIT PREPARED " if commit else b"ROLLBACK PREPARED "
        try:
            self.conn.execute(
                "SELECT pg_catalog.pg_replication_origin_xact_setup(%s::pg_catalog.pg_lsn, %s)",
                (str(Lsn(end_lsn)), pg_timestamp(ts)),
            )
            try:
                self.conn.execute(verb + literal(gid))
            except psycopg.Error:
                self.conn.execute("SELECT pg_catalog.pg_replication_origin_xact_reset()")
                self._rewind_origin()
                raise
            self.conn.execute("SELECT pg_catalog.pg_replication_origin_xact_reset()")
            self.committed = Lsn(end_lsn)
            if self.flush_wait:
                row = self.conn.execute(
                    "SELECT pg_catalog.pg_current_wal_insert_lsn()::text"
                ).fetchone()
                return Lsn.parse(str(row[0])) if row else Lsn(0)
        except psycopg.Error as e:
            raise self._error(e, verb.decode().strip()) from None
        return Lsn(0)

    def rollback(self) -> None:
        """Abandon the transaction in hand (if any) and reset the origin's session values."""
        if not self.in_txn:
            return
        try:
            self.runs.end_run(abort=True)
            self.sync_pipeline()
        finally:
            self.in_txn = False
        self._reset_after_error()

    def check_in_txn(self) -> None:
        """Send what is held and wait for every result of the open transaction; raise
        the first failure. Parallel apply (:mod:`applier.apply.parallel.member`) asks
        before it waits for its commit turn, so that a change refused while earlier
        transactions were still open can be rolled back and applied again, instead of
        failing at COMMIT, which would stop every later session."""
        assert self.in_txn
        self.runs.end_run()
        self.sync_pipeline()
        self.reenter_pipeline()
        if self.failure is not None:
            self.raise_failure()

    def forget_failure(self) -> None:
        """After the rollback of a failed transaction, make the session usable again:
        only for a transaction its caller applies again from the start."""
        self.failure = None
        self.failed_inflight = False

    def settle(self) -> None:
        """Wait for the commits in flight (their callbacks run); raise if one failed."""
        if self.in_txn or not self._pipeline:
            return
        self.sync_pipeline()
        if self.failure is not None:
            self._reset_after_error()
            self.raise_failure()

    def poll(self) -> None:
        """Take the results that have come, without waiting; raise if one failed."""
        if self._pipeline and self._q:
            self._pump(until_empty=False)
        if self.failure is not None:
            self.raise_failure()

    def _reset_after_error(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
            self.conn.execute("SELECT pg_catalog.pg_replication_origin_xact_reset()")
            self._rewind_origin()
        except psycopg.Error as e:
            raise self._error(e, "resetting the target session") from None
        # The ROLLBACK (or a refused COMMIT) undid the guard id of the transaction in
        # hand: read what the server holds now, or a session used again (a parallel
        # member applying a refused run one by one) fails its next guard. A setting
        # first made in a rolled-back transaction stays behind as '', not NULL.
        self._resync_guard()

    def _origin_position(self) -> Lsn:
        return session_progress(self.conn)

    def _rewind_origin(self) -> None:
        """Undo an advance of the origin by a transaction that did not commit
        (:func:`~applier.apply.target.origin.rewind`)."""
        rewind(self.conn, self.origin, self.committed)

    # -- misc --------------------------------------------------------------------------

    def query_one(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        """A synchronous query outside a transaction (prepared-xact checks)."""
        assert not self.in_txn
        self.settle()
        try:
            row = self.conn.execute(query, params).fetchone()
        except psycopg.Error as e:
            raise self._error(e, "query") from None
        return row[0] if row else None

    def close(self) -> None:
        # Also when libpq already found it broken: its backend may live on holding the
        # origin when only our side of the socket was reset.
        close_quietly(self.conn, "apply")
        sel = getattr(self, "_sel", None)
        if sel is not None:
            sel.close()

    def forget_statements(self, names: list[bytes]) -> None:
        """Close the prepared statements ``names`` (and their multi-row forms) on the target.

        For mappings that were superseded or evicted (applier.apply.handlers.relations): in the
        pipeline inside a transaction (a close is not transactional; if the transaction
        fails first, the statement merely stays until the session ends), else at once.
        """
        doomed = set(names)
        self.runs.forget(doomed)
        doomed &= self._prepared
        if not doomed:
            return
        self._prepared -= doomed
        try:
            if not self.in_txn:
                self.settle()
                for name in sorted(doomed):
                    self.conn.execute(b"DEALLOCATE " + name)
                return
            for name in sorted(doomed):
                if pq.version() >= 170000:
                    self.pg.send_close_prepared(name)
                else:
                    self.pg.send_query_params(b"DEALLOCATE " + name, None)
                self._q.append((_CTL, "closing a prepared statement"))
                self._after_send()
        except psycopg.OperationalError as e:
            raise lost(e) from None
        except psycopg.Error as e:
            raise self._error(e, "closing prepared statements") from None
