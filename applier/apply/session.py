"""The target session: settings, origin ownership, and the pipelined executor.

Target session
==============

One connection applies every change. It is set up once:
``session_replication_role = replica`` (target triggers and FK checks behave
as for the built-in subscriber), ``search_path = pg_catalog`` (every name we
send is schema-qualified anyway, so nothing on the target can hijack an
operator or function), ``TimeZone = UTC``, ``DateStyle = ISO``,
``IntervalStyle = postgres``, ``client_encoding = UTF8`` (the replication
connection sends UTF8 text, see worker), ``synchronous_commit`` from the
config, and ``pg_replication_origin_session_setup(origin)``: this session
owns the origin, so each commit records the source position atomically.

Executor
========

Rows go through libpq's pipeline mode at the pq level: the connection is
non-blocking, each change is one ``send_query_prepared`` (its statement is
prepared once per session with ``send_prepare``, parameter types = target
column type OIDs) with the protocol's bytes as parameter values and their
text/binary formats, and nothing waits for the server until the commit's
Sync. Results are read as they arrive (whenever we send, and whenever the
socket is full), matched against a queue of what was sent, so an error or an
UPDATE/DELETE that hit no row is attributed to its change (LSN, table, key)
without a round trip per row. The queue is bounded so a huge transaction
cannot run away with memory when the target is slower than the stream.

Runs of INSERTs into one table leave the pipeline for ``COPY ... FROM STDIN``
(:mod:`applier.apply.copyrun`); every other call ends the run in hand first,
so statements reach the target in source order.

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

``pg_replication_origin_xact_setup`` sets session values that the next commit
record carries; but an *abort* record carries them too and advances the
origin as well (seen on PG15 and PG18: a backend that exits between the stamp
and COMMIT; on PG18 also a COMMIT that fails after it), so a restart would
skip a transaction that never committed. Hence the stamp is made from inside
COMMIT: each session creates a temporary table whose deferred constraint
trigger (ENABLE ALWAYS) calls ``xact_setup`` with the row's values; a commit
inserts one row, and the trigger fires in COMMIT after every deferred trigger
queued before it. A client that dies before COMMIT reached the server leaves
the origin alone; a failure inside COMMIT after the stamp (a trigger queued
later, ON COMMIT actions) is undone while the session lives
(:meth:`TargetSession._rewind_origin`). PREPARE TRANSACTION cannot touch
temporary tables: it stamps the same way through a table of the applier schema
(migration 0003) whose trigger also deletes the row. Where those objects are
missing (a session opened outside ``applier run``) or not writable, and without
the TEMPORARY privilege, the stamp is a statement right before, after
``SET CONSTRAINTS ALL IMMEDIATE``.

After ANY failure the transaction is rolled back and
``pg_replication_origin_xact_reset()`` is called: the session's origin
LSN/timestamp survive a ROLLBACK and would otherwise stamp the next commit.
"""

from __future__ import annotations

import logging
import selectors
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from applier.config import redact_dsn
from applier.errors import ApplierError, ApplyError, ConnectionLost
from applier.lsn import Lsn, pg_timestamp

from .copyrun import BINARY, CHUNK, NO_COPY, Run, copy_query, error_line, row_format
from .merge import MAX_HELD, MergedCtx, chunks
from .planner import Formats, Params, Stmt, insert_rows, max_rows

log = logging.getLogger("applier.apply")

#: First statement of every target transaction (see "Pipelined commits"): fails
#: unless the previous transaction of this session committed, and records this one.
#: A session-level setting made in a transaction is undone if it aborts.
_GUARD = (
    b"SELECT 1 / (pg_catalog.current_setting('applier.txn', true) "
    b"IS NOT DISTINCT FROM $1)::pg_catalog.int4, "
    b"pg_catalog.set_config('applier.txn', $2, false)"
)

#: Session-local objects that stamp the origin from inside COMMIT (see "Origin stamp"):
#: a row inserted into the temporary table fires the deferred trigger at COMMIT.
_STAMP_SETUP = (
    b"CREATE FUNCTION pg_temp.applier_stamp() RETURNS trigger LANGUAGE plpgsql AS $$ "
    b"BEGIN PERFORM pg_catalog.pg_replication_origin_xact_setup(NEW.lsn, NEW.ts); "
    b"RETURN NULL; END $$",
    b"CREATE TEMPORARY TABLE applier_stamp "
    b"(lsn pg_catalog.pg_lsn, ts pg_catalog.timestamptz) ON COMMIT DELETE ROWS",
    b"CREATE CONSTRAINT TRIGGER applier_stamp AFTER INSERT ON pg_temp.applier_stamp "
    b"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.applier_stamp()",
    # Fires under session_replication_role = replica too.
    b"ALTER TABLE pg_temp.applier_stamp ENABLE ALWAYS TRIGGER applier_stamp",
)
_STAMP = (
    b"INSERT INTO pg_temp.applier_stamp VALUES ($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)"
)
#: The same for PREPARE TRANSACTION, which cannot touch temporary tables: a table of
#: the applier schema (migration 0003) whose deferred trigger also deletes the row.
_PREPARE_STAMP = (
    b"INSERT INTO applier.prepare_stamp VALUES ($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)"
)

# Queue item kinds.
_CTL, _ROW, _MOD, _LSN, _SYNC, _MANY = range(6)

#: Send this many statements between non-blocking result reads.
PUMP_EVERY = 256
#: Block when this many statements await their results.
MAX_INFLIGHT = 20_000

#: SQLSTATE classes/codes that mean "the connection is gone", not "the change is bad".
TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "55006", "40P01", "40001", "53300")

ExecStatus = pq.ExecStatus


def is_transient_sqlstate(state: str | None) -> bool:
    return bool(state) and any(state.startswith(p) for p in TRANSIENT_SQLSTATES)  # type: ignore[union-attr]


def _lost(e: BaseException, what: str = "target") -> ConnectionLost:
    detail = str(e).strip().replace("\n", " ")
    return ConnectionLost(
        f"lost the connection to the {what}: {detail}",
        hint="applier run reconnects and resumes from the origin's progress",
    )


def session_settings(synchronous_commit: str) -> list[tuple[str, str]]:
    return [
        ("session_replication_role", "replica"),
        ("search_path", "pg_catalog"),
        ("timezone", "UTC"),
        ("datestyle", "ISO"),
        ("intervalstyle", "postgres"),
        ("client_encoding", "UTF8"),
        ("extra_float_digits", "3"),
        ("synchronous_commit", synchronous_commit),
    ]


def connect(conninfo: str, application_name: str, **kw: Any) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            conninfo, autocommit=True, application_name=application_name, connect_timeout=10, **kw
        )
    except psycopg.OperationalError as e:
        raise ConnectionLost(
            f"cannot connect to the target ({redact_dsn(conninfo)}): {str(e).strip()}",
            hint="check [target] dsn and that the server is up; applier run retries",
        ) from None


class TargetSession:
    """The apply connection; one open target transaction at most."""

    def __init__(
        self, conninfo: str, origin: str, synchronous_commit: str, copy_threshold: int = 64
    ) -> None:
        self.origin = origin
        #: Runs of at least this many INSERTs go out as COPY (0: never).
        self.copy_threshold = copy_threshold
        self._run: Run | None = None
        #: A run shorter than that goes as multi-row INSERTs (else one by one, so
        #: an error names its row: the worker's replay after a failure).
        self.multi_row = True
        self._multi: dict[tuple[bytes, int], Stmt] = {}
        self.conn = connect(conninfo, "applier apply")
        self.pg = self.conn.pgconn
        self.flush_wait = synchronous_commit == "off"
        try:
            for name, value in session_settings(synchronous_commit):
                self.conn.execute("SELECT pg_catalog.set_config(%s, %s, false)", (name, value))
            self.conn.execute(
                "SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (origin,)
            )
            #: The origin's progress as of the last commit known to have succeeded.
            self.committed = self._origin_position()
            self.stamp_in_commit = self._create_stamp()
            self.stamp_in_prepare = self._can_stamp_prepare()
            self._warned_prepare = False
        except psycopg.Error as e:
            self.close()
            raise self._error(e, "setting up the target session") from None
        self._prepared: set[bytes] = set()
        self._q: deque[tuple[int, Any]] = deque()
        self._sent = 0
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.pg.socket, selectors.EVENT_READ)
        self.in_txn = False
        self._pipeline = False
        self._failure: tuple[pq.abc.PGresult, Any] | None = None
        #: The failure was found while earlier commits were in flight: its context may
        #: name a later transaction than the one that failed.
        self.failed_inflight = False
        #: The guard's chain: the id the last transaction set, and the last committed.
        self._txn_seq = 0
        self._guard_expect: bytes | None = None
        self._guard_committed: bytes | None = None
        self._local_lsn = Lsn(0)
        #: Called with the context of an UPDATE/DELETE that found no row.
        self.on_missing: Callable[[Any], None] = lambda ctx: None
        #: Context added to every error (lsn, xid) by the worker.
        self.txn_context: dict[str, Any] = {}

    def _create_stamp(self) -> bool:
        try:
            with self.conn.transaction():
                for query in _STAMP_SETUP:
                    self.conn.execute(query)
        except psycopg.errors.InsufficientPrivilege as e:
            log.warning(
                "cannot create temporary objects on the target (%s); the origin is stamped "
                "just before COMMIT instead, and a connection lost between the two can make "
                "a restart skip that transaction: GRANT TEMPORARY ON DATABASE to the role",
                str(e).strip(),
            )
            return False
        return True

    def _can_stamp_prepare(self) -> bool:
        row = self.conn.execute(
            "SELECT pg_catalog.to_regclass('applier.prepare_stamp') IS NOT NULL "
            "AND pg_catalog.has_table_privilege('applier.prepare_stamp', 'INSERT, DELETE')"
        ).fetchone()
        return bool(row and row[0])

    # -- errors ----------------------------------------------------------------------

    def _error(self, e: psycopg.Error, where: str) -> ApplierError:
        state = e.sqlstate
        if (isinstance(e, psycopg.OperationalError) and state is None) or is_transient_sqlstate(
            state
        ):
            return ConnectionLost(f"{where}: {str(e).strip()}", sqlstate=state)
        return ApplyError(f"{where}: {str(e).strip()}", sqlstate=state)

    # -- pipeline ----------------------------------------------------------------------

    def begin(self) -> None:
        """Open a target transaction (pipeline mode, BEGIN and the guard queued)."""
        assert not self.in_txn
        if self._failure is not None:
            self._raise()
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
            raise _lost(e) from None

    def _send_ctl(self, query: bytes, what: str, params: Params | None = None) -> None:
        self.pg.send_query_params(query, params, result_format=0)
        self._q.append((_CTL, what))
        self._after_send()

    def execute(
        self, stmt: Stmt, params: Params, formats: Formats, ctx: Any, merged: bool = False
    ) -> None:
        """Queue one prepared statement; ``ctx`` identifies the change in errors.

        ``merged``: a merged UPDATE (:mod:`applier.apply.merge`) whose RETURNING
        says which of the rows in ``ctx.ctxs`` it found.
        """
        if self._run is not None:
            self._end_run()
        pg = self.pg
        try:
            if stmt.name not in self._prepared:
                pg.send_prepare(stmt.name, stmt.query, param_types=stmt.types)
                self._q.append((_CTL, ("prepare", ctx)))
                self._prepared.add(stmt.name)
            pg.send_query_prepared(stmt.name, params, param_formats=formats)
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        self._q.append((_MANY if merged else _MOD if stmt.modifies else _ROW, ctx))
        # _after_send(), inlined: this runs for every change.
        self._sent += 1
        if self._sent % PUMP_EVERY == 0:
            self._pump(until_empty=False)
            if self._failure is not None:
                self._raise()

    def execute_sql(self, query: bytes, ctx: Any) -> None:
        """Queue one unprepared statement without parameters (TRUNCATE)."""
        if self._run is not None:
            self._end_run()
        try:
            self.pg.send_query_params(query, None)
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        self._q.append((_ROW, ctx))
        self._after_send()

    # -- runs of INSERTs as COPY (see applier.apply.copyrun) ------------------------

    def insert(self, stmt: Stmt, params: Params, formats: Formats, ctx: Any) -> None:
        """Queue one INSERT; ``ctx`` (with ``lsn`` and ``xid``) identifies it in errors."""
        fmt = row_format(params, formats)
        run = self._run
        if run is None or run.stmt is not stmt or run.fmt != fmt:
            if run is not None:
                self._end_run()
            if not stmt.copy or fmt == NO_COPY or self.copy_threshold <= 0:
                self.execute(stmt, params, formats, ctx)
                return
            run = self._run = Run(stmt, fmt)
        if run.copying:
            run.add(params, ctx.lsn, ctx.xid)
            if len(run.buf) >= CHUNK:
                self._copy_put(run, run.take())
        else:
            run.pending.append((params, formats, ctx))
            if len(run.pending) >= self.copy_threshold:
                self._copy_begin(run)

    def _end_run(self, abort: bool = False) -> None:
        """Send the run in hand: the rest of its COPY, or its rows as INSERTs."""
        run, self._run = self._run, None
        if run is None:
            return
        if run.copying:
            self._copy_end(run, abort)
        elif abort:
            return
        elif self.multi_row and len(run.pending) > 1:
            self._insert_rows(run)
        else:
            for params, formats, ctx in run.pending:
                self.execute(run.stmt, params, formats, ctx)

    def _insert_rows(self, run: Run) -> None:
        """A run too short for COPY: its rows in a few multi-row INSERTs, in order."""
        pending = run.pending
        width = len(run.stmt.types)
        start = 0
        for size in chunks(len(pending), max_rows(width, MAX_HELD)):
            rows = pending[start : start + size]
            start += size
            if size == 1:
                self.execute(run.stmt, *rows[0])
                continue
            stmt = self._multi.get((run.stmt.name, size))
            if stmt is None:
                stmt = self._multi[(run.stmt.name, size)] = insert_rows(run.stmt, size)
            params: Params = []
            for row in rows:
                params += row[0]
            formats: Formats = None
            if run.fmt == BINARY:
                zeros = bytes(width)
                formats = b"".join([row[1] or zeros for row in rows])
            self.execute(stmt, params, formats, MergedCtx([row[2] for row in rows]))

    def _copy_begin(self, run: Run) -> None:
        # libpq has no COPY in pipeline mode: wait for what is queued, leave the
        # pipeline, COPY, and enter it again at the end of the run.
        self._sync()
        pg = self.pg
        if self._failure is not None:
            self._run = None
            self._reenter_pipeline()
            self._raise()
        try:
            pg.send_query(copy_query(run.stmt, run.fmt))
            res = self._next_result()
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        if res is None or res.status != ExecStatus.COPY_IN:
            self._run = None
            self._collect(res)
            self._failure = (res, run.pending[0][2]) if res is not None else None
            self._reenter_pipeline()
            if self._failure is not None:
                self._raise()
            raise ConnectionLost("the target did not start the COPY")
        run.start()
        self._copy_put(run, run.take())

    def _copy_put(self, run: Run, data: bytes) -> None:
        pg = self.pg
        try:
            while pg.put_copy_data(data) == 0:
                self._wait_socket(write=True)
            # Back-pressure: libpq's buffer would grow without bound in
            # non-blocking mode; hold it to what the socket takes.
            while pg.flush():
                self._wait_socket(write=True)
        except psycopg.OperationalError as e:
            if pg.status != pq.ConnStatus.OK:
                raise _lost(e) from None
            # The server ended the COPY with an error: collect and report it.
            self._run = None
            self._copy_failed(run, self._collect(None))

    def _copy_end(self, run: Run, abort: bool) -> None:
        pg = self.pg
        try:
            if not abort:
                self._copy_put(run, run.take(last=True))
            while pg.put_copy_end(b"applier: rolled back" if abort else None) == 0:
                self._wait_socket(write=True)
            error = self._collect(None)
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        if abort:
            self._reenter_pipeline()
        else:
            self._copy_failed(run, error)

    def _copy_failed(self, run: Run, error: pq.abc.PGresult | None) -> None:
        self._reenter_pipeline()
        if error is not None:
            ctx_b = error.error_field(pq.DiagnosticField.CONTEXT)
            line = error_line(ctx_b.decode("utf-8", "replace") if ctx_b else None)
            self._failure = (error, _CopyCtx(run, line))
            self._raise()

    def _collect(self, first: pq.abc.PGresult | None) -> pq.abc.PGresult | None:
        """Read results until libpq has no more; return the first error."""
        error = first if first is not None and first.status == ExecStatus.FATAL_ERROR else None
        while (res := self._next_result()) is not None:
            if error is None and res.status == ExecStatus.FATAL_ERROR:
                error = res
        return error

    def _next_result(self) -> pq.abc.PGresult | None:
        pg = self.pg
        while True:
            pending = pg.flush()
            pg.consume_input()
            if not pg.is_busy():
                return pg.get_result()
            self._wait_socket(write=bool(pending))

    def _wait_socket(self, write: bool) -> None:
        pg = self.pg
        self._sel.modify(pg.socket, selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0))
        for _key, events in self._sel.select(1.0):
            if events & selectors.EVENT_READ:
                pg.consume_input()  # notices, or the error that ends the COPY

    def _reenter_pipeline(self) -> None:
        try:
            self._enter_pipeline()
        except psycopg.OperationalError as e:
            raise _lost(e) from None

    def _enter_pipeline(self) -> None:
        self.pg.enter_pipeline_mode()
        self._pipeline = True

    def _after_send(self) -> None:
        self._sent += 1
        if self._sent % PUMP_EVERY == 0:
            self._pump(until_empty=False)
            if self._failure is not None:
                self._raise()

    def _pump(self, until_empty: bool) -> None:
        """Send what libpq holds and read what results have come, waiting only if needed."""
        pg = self.pg
        q = self._q
        try:
            while True:
                pending = pg.flush()
                pg.consume_input()
                self._drain()
                if pending == 0 and (not q or not until_empty) and len(q) <= MAX_INFLIGHT:
                    return
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
                self._sel.modify(pg.socket, events)
                self._sel.select(1.0)
        except psycopg.OperationalError as e:
            raise _lost(e) from None

    def _drain(self) -> None:
        pg = self.pg
        q = self._q
        while q and not pg.is_busy():
            res = pg.get_result()
            kind, ctx = q[0]
            if res is None:
                if kind != _SYNC:
                    q.popleft()
                continue
            status = res.status
            if status == ExecStatus.PIPELINE_SYNC:
                q.popleft()
                # A commit's Sync: (callback, guard id, waited, end_lsn).
                if ctx is not None and self._failure is None:
                    self._guard_committed = ctx[1]
                    self.committed = ctx[3]
                    ctx[0](self._local_lsn)
            elif status == ExecStatus.FATAL_ERROR:
                if self._failure is None:
                    self._failure = (res, ctx)
                    self.failed_inflight = self._failed_in_pipelined_commit()
            elif status == ExecStatus.PIPELINE_ABORTED:
                pass  # skipped after an error: no row count to judge
            elif kind == _MOD:
                if res.command_tuples == 0:
                    self.on_missing(ctx)
            elif kind == _MANY:
                rows = ctx.ctxs
                if res.ntuples < len(rows):
                    # RETURNING gave the (1-based) ordinals of the rows found.
                    found = {int(res.get_value(i, 0) or 0) for i in range(res.ntuples)}
                    for n, row in enumerate(rows, 1):
                        if n not in found:
                            self.on_missing(row)
            elif kind == _LSN and status == ExecStatus.TUPLES_OK:
                value = res.get_value(0, 0)
                if value:
                    self._local_lsn = Lsn.parse(value.decode())

    def _failed_in_pipelined_commit(self) -> bool:
        """Whether the failing item (the queue's head) belongs to a commit sent without
        waiting: the worker has moved on, so its context may name a later transaction."""
        for kind, ctx in self._q:
            if kind == _SYNC and ctx is not None:
                return not ctx[2]
        return False

    def _sync(self) -> None:
        """Sync the pipeline, wait for everything, leave pipeline mode."""
        try:
            self.pg.pipeline_sync()
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        self._q.append((_SYNC, None))
        self._pump(until_empty=True)
        try:
            self.pg.exit_pipeline_mode()
            self._pipeline = False
        except psycopg.OperationalError as e:
            raise _lost(e) from None

    def _raise(self) -> None:
        assert self._failure is not None
        res, ctx = self._failure
        state_b = res.error_field(pq.DiagnosticField.SQLSTATE)
        state = state_b.decode() if state_b else None
        msg_b = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or res.error_message
        detail_b = res.error_field(pq.DiagnosticField.MESSAGE_DETAIL)
        msg = msg_b.decode("utf-8", "replace").strip()
        if detail_b:
            msg += f" ({detail_b.decode('utf-8', 'replace').strip()})"
        context = dict(self.txn_context)
        if "lsn" in context:
            context["lsn"] = str(Lsn(context["lsn"]))
        describe = getattr(ctx, "describe", None)
        if callable(describe):
            context.update(describe())
        elif isinstance(ctx, tuple) and ctx and ctx[0] == "prepare":
            inner = getattr(ctx[1], "describe", None)
            if callable(inner):
                context.update(inner())
        elif ctx == "guard":
            msg = f"an earlier target transaction of this session did not commit ({msg})"
        elif isinstance(ctx, str):
            msg = f"{ctx}: {msg}"
        if is_transient_sqlstate(state):
            raise ConnectionLost(f"the target failed: {msg}", sqlstate=state)
        raise ApplyError(f"the target refused a change: {msg}", sqlstate=state, **context)

    # -- transaction end -------------------------------------------------------------

    def _stamp(self, end_lsn: Lsn, ts: int) -> None:
        """Queue the origin stamp of a COMMIT (see "Origin stamp")."""
        if self.stamp_in_commit:
            self._send_ctl(_STAMP, "origin stamp", _stamp_params(end_lsn, ts))
        else:
            self._origin_setup(end_lsn, ts)

    def _origin_setup(self, end_lsn: Lsn, ts: int) -> None:
        # Deferred constraint triggers (ENABLE ALWAYS/REPLICA ones fire under
        # session_replication_role = replica) run now, not inside COMMIT/PREPARE:
        # a transaction that aborts *after* pg_replication_origin_xact_setup can
        # advance the origin past itself (see "Origin stamp").
        self._send_ctl(b"SET CONSTRAINTS ALL IMMEDIATE", "deferred constraints")
        self._send_ctl(
            b"SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, "
            b"$2::pg_catalog.timestamptz)",
            "pg_replication_origin_xact_setup",
            _stamp_params(end_lsn, ts),
        )

    def commit(
        self, end_lsn: Lsn, commit_ts: int, done: Callable[[Lsn], None], wait: bool = False
    ) -> None:
        """Stamp the origin and commit, without waiting for the result unless ``wait``.

        ``done(local_lsn)`` runs once the commit succeeded (``local_lsn``: the
        target WAL position to wait for, 0 when durable already).
        """
        assert self.in_txn
        self._end_run()
        self._stamp(end_lsn, commit_ts)
        self._send_ctl(b"COMMIT", "COMMIT")
        try:
            if self.flush_wait:
                self.pg.send_query_params(
                    b"SELECT pg_catalog.pg_current_wal_insert_lsn()::text", None
                )
                self._q.append((_LSN, None))
            self.pg.pipeline_sync()
        except psycopg.OperationalError as e:
            raise _lost(e) from None
        self._q.append((_SYNC, (done, self._guard_expect, wait, Lsn(end_lsn))))
        self.in_txn = False
        if wait:
            self.settle()
        else:
            self._pump(until_empty=False)
            if self._failure is not None:
                self._raise()

    def prepare(self, gid: str, end_lsn: Lsn, prepare_ts: int) -> Lsn:
        """Stamp the origin and PREPARE TRANSACTION ``gid``."""
        assert self.in_txn
        self._end_run()
        if self.stamp_in_prepare:
            self._send_ctl(_PREPARE_STAMP, "origin stamp", _stamp_params(end_lsn, prepare_ts))
        else:
            if not self._warned_prepare:
                self._warned_prepare = True
                log.warning(
                    "applier.prepare_stamp is missing or not writable (INSERT, DELETE) for "
                    "this role; the origin is stamped just before PREPARE TRANSACTION, and a "
                    "connection lost between the two can make a restart skip that transaction"
                )
            self._origin_setup(end_lsn, prepare_ts)
        self._send_ctl(b"PREPARE TRANSACTION " + _literal(gid), "PREPARE TRANSACTION")
        if self.flush_wait:
            self.pg.send_query_params(b"SELECT pg_catalog.pg_current_wal_insert_lsn()::text", None)
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
        self._sync()
        self.in_txn = False
        if self._failure is not None:
            self._reset_after_error()
            self._raise()

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
                self.conn.execute(verb + _literal(gid))
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
            self._end_run(abort=True)
            self._sync()
        finally:
            self.in_txn = False
        self._reset_after_error()
        # Our ROLLBACK undid the guard id of the transaction in hand.
        self._guard_expect = self._guard_committed

    def settle(self) -> None:
        """Wait for the commits in flight (their callbacks run); raise if one failed."""
        if self.in_txn or not self._pipeline:
            return
        self._sync()
        if self._failure is not None:
            self._reset_after_error()
            self._raise()

    def poll(self) -> None:
        """Take the results that have come, without waiting; raise if one failed."""
        if self._pipeline and self._q:
            self._pump(until_empty=False)
        if self._failure is not None:
            self._raise()

    def _reset_after_error(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
            self.conn.execute("SELECT pg_catalog.pg_replication_origin_xact_reset()")
            self._rewind_origin()
        except psycopg.Error as e:
            raise self._error(e, "resetting the target session") from None

    def _origin_position(self) -> Lsn:
        row = self.conn.execute(
            "SELECT pg_catalog.pg_replication_origin_session_progress(false)::text"
        ).fetchone()
        return Lsn.parse(str(row[0])) if row and row[0] is not None else Lsn(0)

    def _rewind_origin(self) -> None:
        """Undo an advance of the origin by a transaction that did not commit.

        An abort record after the stamp advances the origin past a transaction
        that did not commit (see "Origin stamp"). The built-in worker resets its
        origin state in its error path; from outside we put the progress back to
        the last commit known to have succeeded (``pg_replication_origin_advance``
        may go backwards, and is WAL-logged after the abort record, so a crash
        replays both in order).
        """
        position = self._origin_position()
        if position <= self.committed:
            return
        log.warning(
            "a failed transaction moved the origin forward; putting it back",
            extra={"ctx": {"origin": self.origin, "moved_to": position, "back_to": self.committed}},
        )
        self.conn.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")
        self.conn.execute(
            "SELECT pg_catalog.pg_replication_origin_advance(%s, %s::pg_catalog.pg_lsn)",
            (self.origin, str(self.committed)),
        )
        self.conn.execute(
            "SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (self.origin,)
        )

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
        try:
            if not self.conn.closed:
                self.conn.close()
        except Exception:  # closing a broken connection must not mask the real error
            log.debug("closing the target session failed", exc_info=True)
        sel = getattr(self, "_sel", None)
        if sel is not None:
            sel.close()

    def forget_statements(self, names: list[bytes]) -> None:
        """Close the prepared statements ``names`` (and their multi-row forms) on the target.

        For mappings that were superseded or evicted (applier.apply.relations): in the
        pipeline inside a transaction (a close is not transactional; if the transaction
        fails first, the statement merely stays until the session ends), else at once.
        """
        doomed = set(names)
        for key in [k for k in self._multi if k[0] in doomed]:
            doomed.add(self._multi.pop(key).name)
        if self._run is not None and self._run.stmt.name in doomed:
            self._end_run()
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
            raise _lost(e) from None
        except psycopg.Error as e:
            raise self._error(e, "closing prepared statements") from None


class _CopyCtx:
    """Error context of a COPY run: the change on the failing line."""

    def __init__(self, run: Run, line: int | None) -> None:
        self.run = run
        self.line = line

    def describe(self) -> dict[str, Any]:
        first = getattr(self.run.first_ctx, "describe", None)
        out: dict[str, Any] = dict(first()) if callable(first) else {}
        out.pop("key", None)  # the first row's; the server's DETAIL names the failing key
        out.update(self.run.where(self.line))
        if self.line is not None:
            out["copy_line"] = self.line
        return out


def _stamp_params(end_lsn: Lsn, ts: int) -> Params:
    """(end_lsn, commit timestamp) as text parameters of an origin stamp."""
    return [str(Lsn(end_lsn)).encode(), pg_timestamp(ts).isoformat().encode()]


def _literal(text: str) -> bytes:
    return ("'" + text.replace("'", "''") + "'").encode()
